//! Where the `datafusion-sqllogictest` package's `test_files` are: DataFusion's
//! own conformance files and its TPC-H-derived queries with SF 0.1 answers.
//! Shared by the conformance tests and the TPC-H example.

use std::path::PathBuf;

/// Environment variable naming the `test_files` folder to use.
pub const TEST_FILES_VAR: &str = "DATAFUSION_SLT_TEST_FILES";

/// The package version whose files match the DataFusion this crate uses.
const PACKAGE: &str = "datafusion-sqllogictest-55.2.0";

/// `$DATAFUSION_SLT_TEST_FILES`, else the package in the cargo registry.
pub fn find_test_files() -> Result<PathBuf, String> {
    if let Ok(dir) = std::env::var(TEST_FILES_VAR) {
        let dir = PathBuf::from(dir);
        return if dir.is_dir() {
            Ok(dir)
        } else {
            Err(format!(
                "{TEST_FILES_VAR}={} is not a folder",
                dir.display()
            ))
        };
    }
    let cargo_home = std::env::var("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .map_err(|_| format!("{TEST_FILES_VAR} is not set and there is no HOME"))?;
    let registry = cargo_home.join("registry").join("src");
    for index in std::fs::read_dir(&registry).into_iter().flatten().flatten() {
        let candidate = index.path().join(PACKAGE).join("test_files");
        if candidate.is_dir() {
            return Ok(candidate);
        }
    }
    Err(format!(
        "{TEST_FILES_VAR} is not set and {PACKAGE} is not in {}",
        registry.display()
    ))
}
