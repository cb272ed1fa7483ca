//! `gpu.devices`: which of the process's GPUs a session's GPU work may use.

use datafusion::common::config::{ConfigField, Visit};
use datafusion::common::config_err;
use datafusion::error::Result;

/// The GPUs a session's work may use (`gpu.devices`): every device the
/// process sees (`all`, the default), or some of them by number, as CUDA
/// numbers the devices `CUDA_VISIBLE_DEVICES` leaves visible (`0` is the
/// first visible device whatever its number on the machine). Partitions are
/// spread round robin over the devices chosen; numbers the process lacks
/// are passed over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum DeviceSelection {
    /// Every device of the process.
    #[default]
    All,
    /// These devices, in this order, each once.
    Ordinals(Vec<usize>),
}

impl std::fmt::Display for DeviceSelection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSelection::All => f.write_str("all"),
            DeviceSelection::Ordinals(ordinals) => {
                let listed: Vec<String> = ordinals.iter().map(usize::to_string).collect();
                f.write_str(&listed.join(","))
            }
        }
    }
}

impl std::str::FromStr for DeviceSelection {
    type Err = datafusion::error::DataFusionError;

    fn from_str(value: &str) -> Result<Self> {
        let trimmed = value.trim();
        if trimmed.eq_ignore_ascii_case("all") {
            return Ok(DeviceSelection::All);
        }
        let mut ordinals = Vec::new();
        for item in trimmed.split(',') {
            let Ok(ordinal) = item.trim().parse::<usize>() else {
                return config_err!(
                    "gpu.devices is 'all' or device numbers such as '0' or '0,1' \
                     (as CUDA numbers the visible devices), not '{value}'"
                );
            };
            if ordinals.contains(&ordinal) {
                return config_err!("gpu.devices names device {ordinal} twice in '{value}'");
            }
            ordinals.push(ordinal);
        }
        Ok(DeviceSelection::Ordinals(ordinals))
    }
}

config_field_by_parsing!(DeviceSelection, "gpu.devices");

#[cfg(test)]
mod tests {
    use super::DeviceSelection;

    #[test]
    fn parses_all_and_lists_of_device_numbers() {
        assert_eq!(
            "all".parse::<DeviceSelection>().unwrap(),
            DeviceSelection::All
        );
        assert_eq!(
            " ALL ".parse::<DeviceSelection>().unwrap(),
            DeviceSelection::All
        );
        let listed: DeviceSelection = "1, 0".parse().unwrap();
        assert_eq!(listed, DeviceSelection::Ordinals(vec![1, 0]));
        assert_eq!(listed.to_string(), "1,0");
        for bad in ["", "first", "0,", "-1", "0,0", "0;1"] {
            let error = bad.parse::<DeviceSelection>().unwrap_err().to_string();
            assert!(error.contains("gpu.devices"), "{bad}: {error}");
        }
    }
}
