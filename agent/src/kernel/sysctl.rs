//! Sysctls, read and written under `/proc/sys` of a network namespace (the caller's, or
//! the one at a path: per-namespace sysctls such as `net/ipv4/vs/*` differ between them).

use std::io;
use std::path::Path;

use crate::kernel::error::DataplaneError;
use crate::kernel::namespace::in_namespace;

fn in_own_namespace<T: Send>(
    netns: Option<&Path>,
    work: impl FnOnce() -> io::Result<T> + Send,
) -> io::Result<T> {
    match netns {
        Some(path) => in_namespace(path, work),
        None => work(),
    }
}

/// Reads a sysctl (`net/ipv4/vs/conntrack`) in `netns` (`None`: the caller's); `None`
/// when it does not exist.
///
/// # Errors
/// When it exists but cannot be read.
pub fn read(netns: Option<&Path>, name: &str) -> Result<Option<String>, DataplaneError> {
    let path = format!("/proc/sys/{name}");
    match in_own_namespace(netns, || std::fs::read_to_string(&path)) {
        Ok(text) => Ok(Some(text.trim().to_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(DataplaneError::io(format!("reading {path}"), e)),
    }
}

/// Writes a sysctl in `netns` (`None`: the caller's).
///
/// # Errors
/// When it cannot be written.
pub fn write(netns: Option<&Path>, name: &str, value: &str) -> Result<(), DataplaneError> {
    let path = format!("/proc/sys/{name}");
    in_own_namespace(netns, || std::fs::write(&path, value))
        .map_err(|e| DataplaneError::io(format!("writing {value} to {path}"), e))
}
