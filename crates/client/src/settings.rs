//! How a client reaches the fabric: the `[fabric]` section of the configuration that
//! every OrionFS process shares (the command-line tool, the mount and the preload
//! library read it alike).

use std::path::PathBuf;
use std::time::Duration;

use orion_fabric::{Backend, FabricConfig, Secret};
use orion_meta::{FsError, FsResult};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FabricSection {
    /// "libfabric" (any provider; RDMA with verbs) or "local" (processes on one host,
    /// shared memory).
    pub backend: String,
    /// The libfabric provider: "tcp;ofi_rxm" here, "verbs;ofi_rxm" on RDMA hardware.
    pub provider: String,
    /// This node's address on the fabric.
    pub address: String,
    /// The cluster secret every node and client must know (at least 16 bytes).
    pub secret_file: PathBuf,
    /// The cluster epoch: a peer at another epoch is refused.
    pub epoch: u64,
    pub connect_timeout_ms: u64,
    /// How long a one-sided operation or send may stay incomplete before its
    /// connection is declared failed.
    pub op_timeout_ms: u64,
}

impl Default for FabricSection {
    fn default() -> Self {
        FabricSection {
            backend: "libfabric".into(),
            provider: "tcp;ofi_rxm".into(),
            address: "127.0.0.1".into(),
            secret_file: PathBuf::from("/dev/shm/orion/secret"),
            epoch: 1,
            connect_timeout_ms: 10_000,
            op_timeout_ms: 30_000,
        }
    }
}

impl FabricSection {
    /// The fabric settings these name, the cluster secret read from its file.
    pub fn fabric_config(&self) -> FsResult<FabricConfig> {
        let backend = match self.backend.as_str() {
            "libfabric" | "tcp" => Backend::Libfabric,
            "local" => Backend::Local,
            other => {
                return Err(FsError::Io(format!(
                    "fabric backend {other:?}: expected \"libfabric\" or \"local\""
                )))
            }
        };
        if !self.secret_file.exists() {
            return Err(FsError::Io(format!(
                "cluster secret {} does not exist: create it with `orion mds --format` (or \
                 `orion up`), or point fabric.secret_file at the cluster's secret",
                self.secret_file.display()
            )));
        }
        let secret = Secret::from_file(&self.secret_file)
            .map_err(|e| FsError::Io(format!("reading {}: {e}", self.secret_file.display())))?;
        let mut f = FabricConfig::new(backend, secret);
        f.provider = self.provider.clone();
        f.address = (self.address.parse())
            .map_err(|e| FsError::Io(format!("fabric address {:?}: {e}", self.address)))?;
        f.epoch = self.epoch;
        f.connect_timeout = Duration::from_millis(self.connect_timeout_ms);
        f.op_timeout = Duration::from_millis(self.op_timeout_ms);
        Ok(f)
    }
}
