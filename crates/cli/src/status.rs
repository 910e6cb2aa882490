//! `orion status`: what a cluster is doing now: its cluster map's epoch, the MDS, and
//! every data store with its group, index, address, pid (when `orion up` started it
//! on this host), state and resync progress. It reads the cluster from the state
//! directory of an `orion up` (`cluster.json`, which `orion up` keeps current) or
//! from a config file, and asks the MDS for the map as a client does.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use orion_client::{Client, ClientConfig, MemberState};
use serde::{Deserialize, Serialize};

use crate::config::FabricSection;

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The state directory of an `orion up`.
    #[arg(long, conflicts_with = "config")]
    pub dir: Option<PathBuf>,
    /// A config file naming the MDS and the fabric.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print JSON (for scripts) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// What `orion up` writes into its state directory, and rewrites when a process
/// starts again.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct UpState {
    pub fabric: FabricSection,
    pub mds: Proc,
    pub stores: Vec<StoreProc>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Proc {
    pub addr: String,
    pub pid: u32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StoreProc {
    pub group: u16,
    pub index: u16,
    pub addr: String,
    pub pid: u32,
}

impl UpState {
    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join("cluster.json")
    }

    /// Writes it whole, then renames it over the old one.
    pub fn save(&self, state_dir: &Path) -> Result<()> {
        let path = Self::path(state_dir);
        orion_pmem::replace_durably(&path, &serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("writing {}", path.display()))
    }
}

#[derive(Debug, Serialize)]
struct Report {
    epoch: Option<u32>,
    mds: Vec<MdsRow>,
    stores: Vec<StoreRow>,
}

#[derive(Debug, Serialize)]
struct MdsRow {
    role: &'static str,
    addr: String,
    pid: Option<u32>,
    state: String,
}

#[derive(Debug, Serialize)]
struct StoreRow {
    group: u16,
    index: u16,
    addr: String,
    pid: Option<u32>,
    state: String,
    resync_pct: u8,
}

pub fn status(a: StatusArgs) -> Result<()> {
    let (fabric, mds_addr, up) = match (&a.dir, &a.config) {
        (Some(dir), _) => {
            let path = UpState::path(dir);
            let text = std::fs::read(&path).with_context(|| {
                format!(
                    "reading {} (is an `orion up` using that directory?)",
                    path.display()
                )
            })?;
            let up: UpState = serde_json::from_slice(&text)
                .with_context(|| format!("{} is damaged", path.display()))?;
            (up.fabric.clone(), up.mds.addr.clone(), Some(up))
        }
        (None, config) => {
            let c = crate::config::Config::load(config.as_deref())?;
            (c.fabric.clone(), c.client.mds.clone(), None)
        }
    };
    let cfg = ClientConfig {
        mds: mds_addr.clone(),
        name: "orion status".into(),
        reconnect_ms: 1000,
        op_timeout_ms: 3000,
        ..Default::default()
    };
    let mut fabric = fabric.fabric_config()?;
    fabric.connect_timeout = Duration::from_secs(3);
    let map = Client::connect(cfg, fabric).and_then(|c| c.cluster_map());
    let pid_of = |g: u16, i: u16| {
        up.as_ref()
            .and_then(|u| u.stores.iter().find(|s| s.group == g && s.index == i))
            .map(|s| s.pid)
    };
    let report = match &map {
        Ok((epoch, stores)) => Report {
            epoch: Some(*epoch),
            mds: vec![MdsRow {
                role: "primary",
                addr: mds_addr.clone(),
                pid: up.as_ref().map(|u| u.mds.pid),
                state: "up".into(),
            }],
            stores: stores
                .iter()
                .map(|s| StoreRow {
                    group: s.member.group,
                    index: s.member.index,
                    addr: s.addr.clone(),
                    pid: pid_of(s.member.group, s.member.index),
                    state: s.state.name().into(),
                    resync_pct: if s.state == MemberState::Resyncing {
                        s.resync_pct
                    } else {
                        100
                    },
                })
                .collect(),
        },
        Err(_) => Report {
            epoch: None,
            mds: vec![MdsRow {
                role: "primary",
                addr: mds_addr.clone(),
                pid: up.as_ref().map(|u| u.mds.pid),
                state: "down".into(),
            }],
            // What `orion up` started, in a state nobody can tell without the MDS.
            stores: up
                .iter()
                .flat_map(|u| u.stores.iter())
                .map(|s| StoreRow {
                    group: s.group,
                    index: s.index,
                    addr: s.addr.clone(),
                    pid: Some(s.pid),
                    state: "unknown".into(),
                    resync_pct: 0,
                })
                .collect(),
        },
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
        if let Err(e) = &map {
            eprintln!("orion status: the MDS at {mds_addr} does not answer: {e}");
        }
    }
    Ok(())
}

fn print_table(r: &Report) {
    match r.epoch {
        Some(e) => println!("epoch {e}"),
        None => println!("epoch unknown"),
    }
    let pid = |p: Option<u32>| p.map(|p| p.to_string()).unwrap_or_else(|| "-".into());
    for m in &r.mds {
        println!(
            "mds   {:<8} {:<22} pid {:<8} {}",
            m.role,
            m.addr,
            pid(m.pid),
            m.state
        );
    }
    for s in &r.stores {
        let progress = if s.state == "resyncing" {
            format!(" ({} %)", s.resync_pct)
        } else {
            String::new()
        };
        println!(
            "ds    {}.{:<6} {:<22} pid {:<8} {}{progress}",
            s.group,
            s.index,
            s.addr,
            pid(s.pid),
            s.state
        );
    }
}
