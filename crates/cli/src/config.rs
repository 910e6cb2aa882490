//! The TOML configuration of every OrionFS process: one file with a section per role,
//! every key optional (defaults from `orion config --defaults`), flags override keys.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use orion_client::ClientConfig;
use orion_ds::DsConfig;
use orion_fabric::{Backend, FabricConfig, Secret};
use orion_mds::MdsConfig;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub fabric: FabricSection,
    pub mds: MdsConfig,
    pub ds: DsConfig,
    pub client: ClientConfig,
}

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
    pub fn fabric_config(&self) -> Result<FabricConfig> {
        let backend = match self.backend.as_str() {
            "libfabric" | "tcp" => Backend::Libfabric,
            "local" => Backend::Local,
            other => bail!("fabric backend {other:?}: expected \"libfabric\" or \"local\""),
        };
        if !self.secret_file.exists() {
            bail!(
                "cluster secret {} does not exist: create it with `orion mds --format` (or \
                 `orion up`), or point fabric.secret_file at the cluster's secret",
                self.secret_file.display()
            );
        }
        let secret = Secret::from_file(&self.secret_file)
            .with_context(|| format!("reading {}", self.secret_file.display()))?;
        let mut f = FabricConfig::new(backend, secret);
        f.provider = self.provider.clone();
        f.address = self
            .address
            .parse()
            .with_context(|| format!("fabric address {:?}", self.address))?;
        f.epoch = self.epoch;
        f.connect_timeout = Duration::from_millis(self.connect_timeout_ms);
        f.op_timeout = Duration::from_millis(self.op_timeout_ms);
        Ok(f)
    }
}

impl Config {
    /// Reads `path` (every key optional), or the defaults when there is none.
    pub fn load(path: Option<&Path>) -> Result<Config> {
        let Some(path) = path else {
            return Ok(Config::default());
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("config {}", path.display()))
    }

    pub fn defaults_toml() -> String {
        toml::to_string_pretty(&Config::default()).expect("the defaults serialize")
    }
}

/// Writes a fresh random secret to `path` (mode 0600) unless it exists.
pub fn ensure_secret(path: &Path) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if path.exists() {
        return Ok(());
    }
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(Secret::generate().expose())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_round_trip_and_unknown_keys_are_refused() {
        let text = Config::defaults_toml();
        let back: Config = toml::from_str(&text).unwrap();
        assert_eq!(back, Config::default());
        let partial: Config = toml::from_str("[mds]\nlisten = \"127.0.0.1:0\"\n").unwrap();
        assert_eq!(partial.mds.listen, "127.0.0.1:0");
        assert_eq!(partial.ds, DsConfig::default());
        let err = toml::from_str::<Config>("[mds]\nlisen = \"x\"\n").unwrap_err();
        assert!(err.to_string().contains("lisen"), "{err}");
    }
}
