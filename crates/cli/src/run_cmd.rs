//! `orion run`: runs a program with the preload library, which serves its file
//! calls under the mount in its own process (crates/preload).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use orion_client::{ClientConfig, FabricSection};
use serde::Serialize;

use crate::daemons::ClientFlags;
use crate::status::UpState;

/// The preload library's file name, looked for next to the `orion` binary.
pub const LIBRARY: &str = "liborion_preload.so";

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The state directory of the `orion up` whose cluster to use (default: `orion
    /// up`'s default), when no --mds or --config names one.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The mount point whose paths the program's calls are served for (default:
    /// where that `orion up` mounted the file system). It must be mounted: anything
    /// the library does not serve goes through it.
    #[arg(long)]
    pub mount: Option<PathBuf>,
    #[command(flatten)]
    pub client: ClientFlags,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub program: Vec<OsString>,
}

/// What the library reads from `ORION_CLIENT`.
#[derive(Serialize)]
struct Settings {
    client: ClientConfig,
    fabric: FabricSection,
}

pub fn run(a: RunArgs) -> Result<()> {
    let named = a.client.mds.is_some() || a.client.common.config.is_some();
    let (client, fabric, mount) = if named {
        let c = a.client.load()?;
        let Some(m) = a.mount.clone() else {
            bail!("--mds or --config needs --mount: the mount point of that cluster");
        };
        (c.client, c.fabric, m)
    } else {
        let dir = match &a.dir {
            Some(d) => d.clone(),
            None => crate::up::default_state_dir()?,
        };
        let up = UpState::load(&dir)?;
        // The flags (--optimistic, --weak, --external) over the cluster's address.
        let mut client = a.client.load()?.client;
        client.mds = up.mds_setting();
        let mount = match (&a.mount, up.mount.is_empty()) {
            (Some(m), _) => m.clone(),
            (None, false) => PathBuf::from(&up.mount),
            (None, true) => dir.join("mnt"),
        };
        (client, up.fabric, mount)
    };
    let mount = mount
        .canonicalize()
        .with_context(|| format!("mount point {}", mount.display()))?;
    if !is_mount_point(&mount) {
        bail!(
            "nothing is mounted at {}: start the cluster (`orion up`) or mount it first",
            mount.display()
        );
    }
    let exe = std::env::current_exe().context("finding the orion binary")?;
    let library = exe.with_file_name(LIBRARY);
    if !library.exists() {
        bail!(
            "{} is missing: build it with `cargo build -p orion-preload` (with --release \
             for a release build of orion)",
            library.display()
        );
    }
    let settings = serde_json::to_string(&Settings { client, fabric })?;
    let mut preload = library.into_os_string();
    if let Some(other) = std::env::var_os("LD_PRELOAD").filter(|p| !p.is_empty()) {
        preload.push(":");
        preload.push(other);
    }
    let err = std::process::Command::new(&a.program[0])
        .args(&a.program[1..])
        .env("LD_PRELOAD", preload)
        .env("ORION_MOUNT", &mount)
        .env("ORION_CLIENT", settings)
        .exec();
    bail!("running {}: {err}", a.program[0].to_string_lossy())
}

/// Whether a file system is mounted at `p` (its device differs from its parent's).
fn is_mount_point(p: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let parent = p.parent().unwrap_or(p);
    match (std::fs::metadata(p), std::fs::metadata(parent)) {
        (Ok(a), Ok(b)) => a.dev() != b.dev(),
        _ => false,
    }
}
