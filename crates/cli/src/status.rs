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
    /// The MDS that took the primary role first.
    pub mds: Proc,
    /// Every MDS (the primary and its mirror), in start order.
    #[serde(default)]
    pub mdss: Vec<Proc>,
    /// The cluster manager ("embedded:ADDR"; empty without a mirror).
    #[serde(default)]
    pub manager: String,
    pub stores: Vec<StoreProc>,
    /// Where the cluster is mounted (what `orion run` serves in-process).
    #[serde(default)]
    pub mount: String,
    /// host:port of the mount's Prometheus endpoint ("": none).
    #[serde(default)]
    pub mount_metrics: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Proc {
    /// Its name for the cluster manager (an MDS of a mirrored cluster).
    #[serde(default)]
    pub name: String,
    pub addr: String,
    pub pid: u32,
    /// host:port of its Prometheus endpoint ("": none).
    #[serde(default)]
    pub metrics: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StoreProc {
    pub group: u16,
    pub index: u16,
    pub addr: String,
    pub pid: u32,
    /// host:port of its Prometheus endpoint ("": none).
    #[serde(default)]
    pub metrics: String,
}

impl UpState {
    /// The `mds` setting of a client: every MDS address.
    pub fn mds_setting(&self) -> String {
        match self.mdss.is_empty() {
            true => self.mds.addr.clone(),
            false => (self.mdss.iter().map(|m| m.addr.as_str()))
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join("cluster.json")
    }

    pub fn load(state_dir: &Path) -> Result<UpState> {
        let path = Self::path(state_dir);
        let text = std::fs::read(&path).with_context(|| {
            format!(
                "reading {} (is an `orion up` using that directory?)",
                path.display()
            )
        })?;
        serde_json::from_slice(&text).with_context(|| format!("{} is damaged", path.display()))
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
    /// The mount's Prometheus endpoint (host:port of `/metrics`), if `orion up` made one.
    #[serde(skip_serializing_if = "Option::is_none")]
    mount_metrics: Option<String>,
    /// The cluster manager, if the MDS has a mirror.
    manager: Option<ManagerRow>,
    mds: Vec<MdsRow>,
    stores: Vec<StoreRow>,
    /// What the file system holds and has free, if the MDS answered (an ENOSPC
    /// names the one that ran out; the log pages are in the MDS's metrics).
    #[serde(skip_serializing_if = "Option::is_none")]
    space: Option<Space>,
}

#[derive(Debug, Serialize)]
struct Space {
    inode_slots: u64,
    inode_slots_free: u64,
    data_pages: u64,
    data_pages_free: u64,
}

#[derive(Debug, Serialize)]
struct ManagerRow {
    kind: String,
    addr: String,
    /// The primary's term, its name, and what is left of its lease.
    epoch: Option<u64>,
    holder: Option<String>,
    holder_addr: Option<String>,
    lease_left_ms: Option<u64>,
    /// Whether it answered (else the roles are unknown).
    reachable: bool,
    /// The MDSs that may take the role (the primary, and its mirror when in sync).
    eligible: Vec<String>,
}

#[derive(Debug, Serialize)]
struct MdsRow {
    name: String,
    /// Its Prometheus endpoint (host:port of `/metrics`), if `orion up` started it.
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics: Option<String>,
    /// primary, mirror (in sync: may take over), catching-up, or down.
    role: String,
    addr: String,
    pid: Option<u32>,
    state: String,
}

#[derive(Debug, Serialize)]
struct StoreRow {
    group: u16,
    /// Its Prometheus endpoint (host:port of `/metrics`), if `orion up` started it.
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics: Option<String>,
    index: u16,
    addr: String,
    pid: Option<u32>,
    state: String,
    resync_pct: u8,
}

pub fn status(a: StatusArgs) -> Result<()> {
    let (fabric, mds_addr, up, manager_spec, cluster) = match (&a.dir, &a.config) {
        (Some(dir), _) => {
            let up = UpState::load(dir)?;
            let m = Some(up.manager.clone());
            let cluster = crate::up_mds::CLUSTER.to_string();
            (up.fabric.clone(), up.mds.addr.clone(), Some(up), m, cluster)
        }
        (None, config) => {
            let c = crate::config::Config::load(config.as_deref())?;
            let m = Some(c.mds.manager.clone());
            (
                c.fabric.clone(),
                c.client.mds.clone(),
                None,
                m,
                c.mds.cluster.clone(),
            )
        }
    };
    // The MDSs: those `orion up` started, or the config's `mds` addresses.
    let mdss: Vec<Proc> = match up.as_ref().filter(|u| !u.mdss.is_empty()) {
        Some(u) => u.mdss.clone(),
        None => orion_proto::mds_addresses(&mds_addr)
            .into_iter()
            .map(|addr| Proc {
                addr,
                ..Default::default()
            })
            .collect(),
    };
    let manager = manager_spec
        .as_deref()
        .filter(|m| !m.is_empty())
        .map(|spec| {
            let (kind, addr) = spec.split_once(':').unwrap_or(("?", spec));
            let mut row = ManagerRow {
                kind: kind.into(),
                addr: addr.into(),
                epoch: None,
                holder: None,
                holder_addr: None,
                lease_left_ms: None,
                reachable: false,
                eligible: Vec::new(),
            };
            match orion_mds::primary::open_manager(spec, &cluster, Duration::from_secs(8)) {
                Ok(mut m) => {
                    match m.primary() {
                        Ok(Some(p)) => {
                            row.epoch = Some(p.epoch);
                            row.holder = Some(p.name);
                            row.holder_addr = Some(p.addr);
                            row.lease_left_ms = p.remaining.map(|d| d.as_millis() as u64);
                            row.reachable = true;
                        }
                        Ok(None) => row.reachable = true,
                        Err(e) => eprintln!("orion status: the cluster manager at {addr}: {e:#}"),
                    }
                    row.eligible = m.eligible().unwrap_or_default();
                }
                Err(e) => eprintln!("orion status: the cluster manager at {addr}: {e:#}"),
            }
            row
        });
    let cfg = ClientConfig {
        mds: mdss
            .iter()
            .map(|m| m.addr.clone())
            .collect::<Vec<_>>()
            .join(","),
        name: "orion status".into(),
        reconnect_ms: 1000,
        op_timeout_ms: 3000,
        ..Default::default()
    };
    let mut fabric = fabric.fabric_config()?;
    fabric.connect_timeout = Duration::from_secs(3);
    let client = Client::connect(cfg, fabric);
    let space = client
        .as_ref()
        .ok()
        .and_then(|c| c.statfs().ok())
        .map(|s| Space {
            inode_slots: s.files,
            inode_slots_free: s.ffree,
            data_pages: s.blocks,
            data_pages_free: s.bfree,
        });
    let map = client.and_then(|c| c.cluster_map());
    let started = |g: u16, i: u16| {
        up.as_ref()
            .and_then(|u| u.stores.iter().find(|s| s.group == g && s.index == i))
    };
    let pid_of = |g: u16, i: u16| started(g, i).map(|s| s.pid);
    let metrics_of = |g: u16, i: u16| {
        started(g, i)
            .map(|s| s.metrics.clone())
            .filter(|m| !m.is_empty())
    };
    let alive = |pid: u32| {
        // SAFETY: kill(2) with signal 0 only checks that the process exists.
        pid != 0 && unsafe { libc::kill(pid as i32, 0) } == 0
    };
    let mds_rows = |answered: bool| -> Vec<MdsRow> {
        mdss.iter()
            .map(|m| {
                let pid = (m.pid != 0).then_some(m.pid);
                let holds = manager.as_ref().is_some_and(|r| {
                    (!m.name.is_empty() && r.holder.as_deref() == Some(m.name.as_str()))
                        || r.holder_addr.as_deref() == Some(m.addr.as_str())
                });
                let in_sync = manager
                    .as_ref()
                    .is_some_and(|r| !m.name.is_empty() && r.eligible.contains(&m.name));
                let down = pid.is_some_and(|p| !alive(p));
                let role = match () {
                    _ if down => "down",
                    _ if manager.is_none() => "primary",
                    _ if manager.as_ref().is_some_and(|r| !r.reachable) => "unknown",
                    _ if holds => "primary",
                    _ if in_sync => "mirror",
                    // Without names (a config file), in sync or not cannot be told.
                    _ if m.name.is_empty() => "standby",
                    _ => "catching-up",
                };
                let state = if down || (role == "primary" && !answered) {
                    "down"
                } else {
                    "up"
                };
                MdsRow {
                    name: m.name.clone(),
                    metrics: Some(m.metrics.clone()).filter(|m| !m.is_empty()),
                    role: role.into(),
                    addr: m.addr.clone(),
                    pid,
                    state: state.into(),
                }
            })
            .collect()
    };
    let report = match &map {
        Ok((epoch, stores)) => Report {
            epoch: Some(*epoch),
            mount_metrics: None,
            manager: None,
            mds: mds_rows(true),
            space: None,
            stores: stores
                .iter()
                .map(|s| StoreRow {
                    metrics: metrics_of(s.member.group, s.member.index),
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
            mount_metrics: None,
            manager: None,
            mds: mds_rows(false),
            space: None,
            // What `orion up` started, in a state nobody can tell without the MDS.
            stores: up
                .iter()
                .flat_map(|u| u.stores.iter())
                .map(|s| StoreRow {
                    metrics: Some(s.metrics.clone()).filter(|m| !m.is_empty()),
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
    let mount_metrics = up
        .as_ref()
        .map(|u| u.mount_metrics.clone())
        .filter(|m| !m.is_empty());
    let report = Report {
        manager,
        mount_metrics,
        space,
        ..report
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
    if let Some(m) = &r.manager {
        let holder = match (&m.holder, m.epoch, m.lease_left_ms) {
            (Some(h), Some(e), Some(ms)) => format!("{h} holds epoch {e}, {ms} ms of lease left"),
            (Some(h), Some(e), None) => format!("{h} holds epoch {e}"),
            _ => "no primary".into(),
        };
        println!(
            "manager {} at {}: {holder}; may take over: {}",
            m.kind,
            m.addr,
            if m.eligible.is_empty() {
                "-".to_string()
            } else {
                m.eligible.join(", ")
            }
        );
    }
    let pid = |p: Option<u32>| p.map(|p| p.to_string()).unwrap_or_else(|| "-".into());
    for m in &r.mds {
        println!(
            "mds   {:<6} {:<11} {:<22} pid {:<8} {}",
            m.name,
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
    if let Some(s) = &r.space {
        println!(
            "space inode slots {} of {} free, data pages {} of {} free",
            s.inode_slots_free, s.inode_slots, s.data_pages_free, s.data_pages
        );
    }
}
