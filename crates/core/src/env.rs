//! The one place ferrite reads environment variables. They only locate files
//! (HOME, FERRITE_HOME, the Hugging Face cache variables), point a test at
//! other fixtures, or switch on debugging output (`FERRITE_PROFILE`); models
//! and kernels never read the environment.

use std::ffi::OsString;
use std::path::PathBuf;

/// A variable's value; unset and empty are the same.
pub fn var(key: &str) -> Option<OsString> {
    std::env::var_os(key).filter(|v| !v.is_empty())
}

/// A variable as a path.
pub fn path(key: &str) -> Option<PathBuf> {
    var(key).map(PathBuf::from)
}

/// `FERRITE_PROFILE` set (and not "0" or "phases"): backends time every op
/// (which runs CUDA passes eagerly, without graphs).
pub fn profiling() -> bool {
    var("FERRITE_PROFILE").is_some_and(|v| v != "0" && v != "phases")
}

/// `FERRITE_PROFILE` set (and not "0"): commands print where their time went
/// (`phases`: only that, ops untimed).
pub fn profiling_phases() -> bool {
    var("FERRITE_PROFILE").is_some_and(|v| v != "0")
}
