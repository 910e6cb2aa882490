//! `orion fsck`: checks a file system's pools without changing them (the MDS pool and
//! its data pool, the replicas of each group, or an MDS pool and its mirror's), with
//! progress on each long part ([`orion_progress`]); exit 1 if anything is wrong.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use orion_meta::fsck::{self, Part};
use orion_meta::localfs::data_pool_path;
use orion_pmem::{ModeChoice, Pool};
use orion_progress::{Progress, Unit};

#[derive(Args, Debug)]
pub struct FsckArgs {
    #[arg(long)]
    pool: PathBuf,
    /// The data pool (default: POOL.data if it exists).
    #[arg(long)]
    data_pool: Option<PathBuf>,
    /// The data pools of a cluster's stores (POOL is its MDS pool): the replicas of
    /// each group must hold the same bytes in every page a file names.
    #[arg(long, num_args = 1.., conflicts_with = "data_pool")]
    replicas: Vec<PathBuf>,
    /// The pool of POOL's mirror MDS: both are checked, and must hold the same
    /// bytes (stop the cluster, or let it be quiet, first: the mirror applies
    /// behind the primary).
    #[arg(long, conflicts_with_all = ["data_pool", "replicas"])]
    mirror: Option<PathBuf>,
}

pub fn fsck(a: FsckArgs) -> anyhow::Result<ExitCode> {
    for pool in std::iter::once(&a.pool).chain(a.mirror.as_ref()) {
        if copying(pool) {
            return Ok(exit(false));
        }
    }
    let meta = Pool::open(&a.pool, ModeChoice::Auto)?;
    if !a.replicas.is_empty() {
        return fsck_replicas(&a.pool, &meta, &a.replicas);
    }
    if let Some(mirror) = a.mirror {
        return fsck_mirror(&a.pool, &meta, &mirror);
    }
    let data_path = (a.data_pool).or_else(|| Some(data_pool_path(&a.pool)).filter(|p| p.exists()));
    let data = data_path
        .as_deref()
        .map(|p| Pool::open(p, ModeChoice::Auto))
        .transpose()?;
    let mut progress = Parts::new(&a.pool);
    let report = fsck::check_reporting(&meta, data.as_ref(), &mut |p, d, t| progress.at(p, d, t));
    progress.end();
    for p in &report.problems {
        println!("problem: {p}");
    }
    println!("orion fsck {}: {}", a.pool.display(), report.summary());
    Ok(exit(report.is_clean()))
}

/// Whether `pool` is a mirror's copy in progress (its copy marker is there), said
/// instead of the damage a check would find in it: such a pool is not whole by
/// design, is never served from, and is copied again when its MDS starts.
fn copying(pool: &Path) -> bool {
    let marker = orion_mds::copy_marker(pool);
    if !marker.exists() {
        return false;
    }
    println!(
        "orion fsck {}: a mirror's copy of its primary's pool, not finished ({} is \
         there): not a whole pool; its MDS copies it again when it starts",
        pool.display(),
        marker.display()
    );
    true
}

fn exit(clean: bool) -> ExitCode {
    match clean {
        true => ExitCode::SUCCESS,
        false => ExitCode::from(1),
    }
}

/// The progress of a check: one [`Progress`] per part, begun when the check reaches
/// it and finished when it moves on.
struct Parts {
    pool: String,
    current: Option<(Part, Progress)>,
}

impl Parts {
    fn new(pool: &Path) -> Parts {
        Parts {
            pool: pool.display().to_string(),
            current: None,
        }
    }

    fn at(&mut self, part: Part, done: u64, total: u64) {
        if self.current.as_ref().map(|c| c.0) != Some(part) {
            self.end();
            let (what, unit) = match part {
                Part::LoadingInodes => ("loading inodes", "inodes"),
                Part::ComparingReplicas => ("comparing replicas", "pages"),
                Part::ComparingPools => ("comparing with the mirror", "pages"),
            };
            let what = format!("fsck {}: {what}", self.pool);
            self.current = Some((part, Progress::new(what, total, Unit::Items(unit))));
        }
        if let Some((_, p)) = &mut self.current {
            p.set(done);
        }
    }

    /// The part in progress is over, as far as it came: the check reports each
    /// part's final count itself, which may fall short of its estimate (inodes no
    /// directory names are not loaded) or of the end (a check that gave up).
    fn end(&mut self) {
        self.current = None;
    }
}

/// `orion fsck --pool MDS --mirror POOL`: both MDS pools' checks, then the two compared
/// page by page.
fn fsck_mirror(pool: &Path, meta: &Pool, mirror: &Path) -> anyhow::Result<ExitCode> {
    let other = Pool::open(mirror, ModeChoice::Auto)?;
    let mut clean = true;
    for (path, p) in [(pool, meta), (mirror, &other)] {
        let mut progress = Parts::new(path);
        let report = fsck::check_reporting(p, None, &mut |p, d, t| progress.at(p, d, t));
        progress.end();
        for problem in &report.problems {
            println!("problem in {}: {problem}", path.display());
        }
        println!("orion fsck {}: {}", path.display(), report.summary());
        clean &= report.is_clean();
    }
    let mut progress = Parts::new(pool);
    let differ = fsck::differing_pages_reporting(meta, &other, &mut |p, d, t| progress.at(p, d, t))
        .map_err(anyhow::Error::msg)?;
    progress.end();
    if differ.is_empty() {
        println!(
            "the pools are identical ({} pages)",
            meta.len() / orion_format::PAGE_SIZE
        );
    } else {
        let shown: Vec<String> = differ.iter().take(10).map(u64::to_string).collect();
        println!(
            "the pools differ in {} pages: {}{}",
            differ.len(),
            shown.join(", "),
            if differ.len() > 10 { ", ..." } else { "" }
        );
        clean = false;
    }
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `orion fsck --pool MDS --replicas POOL...`: the MDS pool's check, then the replicas
/// of each group compared page by page over the pages files name.
fn fsck_replicas(pool: &Path, meta: &Pool, replicas: &[PathBuf]) -> anyhow::Result<ExitCode> {
    let mut progress = Parts::new(pool);
    let report = fsck::check_reporting(meta, None, &mut |p, d, t| progress.at(p, d, t));
    for p in &report.problems {
        println!("problem: {p}");
    }
    let pools = replicas
        .iter()
        .map(|p| Pool::open(p, ModeChoice::Auto).with_context(|| format!("{}", p.display())))
        .collect::<anyhow::Result<Vec<Pool>>>()?;
    let refs: Vec<&Pool> = pools.iter().collect();
    let r =
        fsck::compare_replicas_reporting(&report.named, &refs, &mut |p, d, t| progress.at(p, d, t));
    progress.end();
    for (i, p) in replicas.iter().enumerate() {
        println!("pool {i}: {}", p.display());
    }
    for p in &r.problems {
        println!("problem: {p}");
    }
    println!(
        "orion fsck {}: {}; replicas: {} pages equal, {} differences",
        pool.display(),
        report.summary(),
        r.equal,
        r.problems.len()
    );
    Ok(if report.is_clean() && r.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
