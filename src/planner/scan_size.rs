//! Whether a GPU scan is worth placing by its table's size: the one test
//! every GPU scan shares (the placement of its node, a join key test of
//! its rows, a GPU node reading it from the cache).

use crate::config::GpuOptions;

/// Table rows from which a GPU scan (aggregation or filter) is placed under
/// `gpu.placement = 'cost'`: below, DataFusion's scan takes a few
/// milliseconds, about what one kernel launch and the copy of a part's
/// states back cost, and the first run's copy of the columns would not
/// pay back soon.
pub(crate) const GPU_SCAN_MIN_ROWS: usize = 1 << 20;

/// What a GPU scan (`what`) of a table of `scan_rows` rows needs, whatever
/// it computes: the column cache on, and under `gpu.placement = 'cost'` at
/// least [`GPU_SCAN_MIN_ROWS`] rows where statistics know.
pub(super) fn gpu_scan_placed(
    options: &GpuOptions,
    what: &str,
    scan_rows: Option<usize>,
) -> Result<(), String> {
    if !options.cache {
        return Err(format!(
            "{what} reads the device column cache (gpu.cache = false)"
        ));
    }
    match scan_rows.filter(|&r| r < GPU_SCAN_MIN_ROWS && !options.placement.always()) {
        Some(rows) => Err(format!(
            "the scan reads {rows} rows, below the {GPU_SCAN_MIN_ROWS} from which its columns \
             are kept on the device (gpu.placement = 'cost')"
        )),
        None => Ok(()),
    }
}
