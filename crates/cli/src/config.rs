//! The TOML configuration of every OrionFS process: one file with a section per role,
//! every key optional (defaults from `orion config --defaults`), flags override keys.

use std::path::Path;

use anyhow::{Context, Result};
use orion_client::ClientConfig;
pub use orion_client::FabricSection;
use orion_ds::DsConfig;
use orion_fabric::Secret;
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
