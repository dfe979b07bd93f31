//! The health-check record: what the health-check node ports answered after the last
//! successful sync, kept as a small JSON file in the state directory.
//!
//! A restarted agent whose plan is refused, or still waits for Service plans, does not
//! program anything, but the kernel keeps serving what the previous agent programmed.
//! Load balancers must keep hearing the same answers: closed health-check ports would
//! take the node out of every `externalTrafficPolicy: Local` Service. So the agent
//! answers from this record until it applies a plan of its own, but only when
//!
//! - the record exists: the state directory is a tmpfs (`/run/proxyplan` by default),
//!   which a reboot clears together with the kernel state it describes; and
//! - the kernel still holds the agent's rules (their canary is there): a flushed or
//!   rebooted node serves nothing, and its ports stay closed.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::healthcheck::ServiceHealth;

/// The record's file name inside the state directory.
pub const FILE_NAME: &str = "health-checks.json";

/// What the health-check ports answered for one applied plan revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheckRecord {
    /// The applied plan revision the answers come from.
    pub revision: String,
    /// The node addresses the ports listened on.
    pub addresses: Vec<IpAddr>,
    /// One per health-check node port.
    pub ports: Vec<RecordedPort>,
}

/// One health-check node port and its answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedPort {
    /// The node port.
    pub port: u16,
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// Ready local endpoints.
    pub local_endpoints: usize,
}

/// Why the record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The file could not be read, written or renamed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a record.
    #[error("{path}: not a health-check record: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The error.
        source: serde_json::Error,
    },
}

impl HealthCheckRecord {
    /// The record of `ports` served on `addresses` for `revision`.
    #[must_use]
    pub fn new(revision: &str, addresses: &[IpAddr], ports: &BTreeMap<u16, ServiceHealth>) -> Self {
        Self {
            revision: revision.to_owned(),
            addresses: addresses.to_vec(),
            ports: ports
                .iter()
                .map(|(port, s)| RecordedPort {
                    port: *port,
                    namespace: s.namespace.clone(),
                    name: s.name.clone(),
                    local_endpoints: s.local_endpoints,
                })
                .collect(),
        }
    }

    /// The answers by port, as the health-check servers take them.
    #[must_use]
    pub fn ports(&self) -> BTreeMap<u16, ServiceHealth> {
        self.ports
            .iter()
            .map(|p| {
                (
                    p.port,
                    ServiceHealth {
                        namespace: p.namespace.clone(),
                        name: p.name.clone(),
                        local_endpoints: p.local_endpoints,
                    },
                )
            })
            .collect()
    }

    /// Reads the record in `dir`; `None` when there is none.
    ///
    /// # Errors
    /// When the file exists but cannot be read or parsed.
    pub fn read(dir: &Path) -> Result<Option<Self>, RecordError> {
        let path = dir.join(FILE_NAME);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(RecordError::Io { path, source }),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| RecordError::Parse { path, source })
    }

    /// Writes the record to `dir` (created if missing), atomically: a reader sees the old
    /// record or the new one, never a part.
    ///
    /// # Errors
    /// When the directory or the file cannot be written.
    pub fn write(&self, dir: &Path) -> Result<(), RecordError> {
        let path = dir.join(FILE_NAME);
        let temporary = dir.join(format!(".{FILE_NAME}.tmp"));
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| RecordError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let bytes = serde_json::to_vec_pretty(self).map_err(|source| RecordError::Parse {
            path: path.clone(),
            source,
        })?;
        let mut file = std::fs::File::create(&temporary).map_err(io(&temporary))?;
        file.write_all(&bytes).map_err(io(&temporary))?;
        std::fs::rename(&temporary, &path).map_err(io(&path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written() {
        let dir = std::env::temp_dir().join(format!("pp-record-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(HealthCheckRecord::read(&dir).unwrap().is_none());
        let ports = BTreeMap::from([(
            31000,
            ServiceHealth {
                namespace: "default".to_owned(),
                name: "lb".to_owned(),
                local_endpoints: 2,
            },
        )]);
        let record = HealthCheckRecord::new("r7", &["192.0.2.1".parse().unwrap()], &ports);
        record.write(&dir).unwrap();
        let read = HealthCheckRecord::read(&dir).unwrap().unwrap();
        assert_eq!(read, record);
        assert_eq!(read.ports(), ports);

        std::fs::write(dir.join(FILE_NAME), b"{\"revision\": 3").unwrap();
        let err = HealthCheckRecord::read(&dir).unwrap_err().to_string();
        assert!(
            err.contains("health-checks.json: not a health-check record"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
