//! `orion fs`: file-system operations through the client library, for scripts, tests
//! and a quick look at a cluster without a mount.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use orion_client::{Client, OpenFlags};
use orion_format::FileType;

use crate::daemons::ClientFlags;

#[derive(Args, Debug)]
pub struct FsArgs {
    #[command(flatten)]
    pub client: ClientFlags,
    /// Print the client's counters as JSON on stderr at the end.
    #[arg(long)]
    pub stats: bool,
    #[command(subcommand)]
    pub op: FsOp,
}

#[derive(Subcommand, Debug)]
pub enum FsOp {
    /// List a directory.
    Ls {
        path: String,
    },
    /// Every path under a directory with its type, size and a CRC-32C of its content,
    /// sorted: two clients that print the same tree see the same file system.
    Tree {
        path: String,
    },
    /// Print a file.
    Cat {
        path: String,
    },
    /// Write standard input to a file (created or truncated).
    Put {
        path: String,
    },
    Mkdir {
        path: String,
        /// Create missing parents too.
        #[arg(short, long)]
        parents: bool,
    },
    Rm {
        path: String,
    },
    Rmdir {
        path: String,
    },
    Mv {
        from: String,
        to: String,
    },
    Stat {
        path: String,
    },
    Chmod {
        mode: String,
        path: String,
    },
    Statfs,
    /// Append `count` records "<tag> <n>\n" with O_APPEND, and chmod the file between
    /// appends, for at least `min_ms` milliseconds. With --barrier, first create
    /// BARRIER/<tag> and wait until BARRIER holds `peers` names, so that concurrent
    /// writers really overlap.
    AppendRecords {
        path: String,
        #[arg(long)]
        tag: String,
        #[arg(long)]
        count: u64,
        #[arg(long, default_value_t = 0)]
        min_ms: u64,
        #[arg(long)]
        barrier: Option<String>,
        #[arg(long, default_value_t = 1)]
        peers: usize,
    },
}

pub fn run(a: FsArgs) -> Result<()> {
    let c = a.client.load()?;
    let fabric = c.fabric.fabric_config()?;
    let client = Client::connect(c.client, fabric).map_err(|e| anyhow!("{e}"))?;
    let r = op(&client, a.op);
    if a.stats {
        eprintln!("{}", serde_json::to_string(&client.stats())?);
    }
    r
}

fn e(path: &str) -> impl FnOnce(orion_meta::FsError) -> anyhow::Error + '_ {
    move |err| anyhow!("{path}: {err}")
}

fn op(client: &Client, op: FsOp) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match op {
        FsOp::Ls { path } => {
            for d in client.readdir(&path).map_err(e(&path))? {
                writeln!(out, "{}", String::from_utf8_lossy(&d.name))?;
            }
        }
        FsOp::Tree { path } => {
            let mut lines = Vec::new();
            tree(client, &path, &mut lines)?;
            lines.sort();
            for l in lines {
                writeln!(out, "{l}")?;
            }
        }
        FsOp::Cat { path } => {
            let fd = client.open(&path, OpenFlags::read(), 0).map_err(e(&path))?;
            loop {
                let b = client.read(fd, 1 << 20).map_err(e(&path))?;
                if b.is_empty() {
                    break;
                }
                out.write_all(&b)?;
            }
            client.close(fd).map_err(e(&path))?;
        }
        FsOp::Put { path } => {
            let mut data = Vec::new();
            std::io::stdin().read_to_end(&mut data)?;
            let fd = client
                .open(&path, OpenFlags::create(), 0o644)
                .map_err(e(&path))?;
            client.write(fd, &data).map_err(e(&path))?;
            client.fsync(fd).map_err(e(&path))?;
            client.close(fd).map_err(e(&path))?;
        }
        FsOp::Mkdir { path, parents } => {
            if parents {
                let mut cur = String::new();
                for comp in path.split('/').filter(|c| !c.is_empty()) {
                    cur.push('/');
                    cur.push_str(comp);
                    match client.mkdir(&cur, 0o755) {
                        Ok(_) => {}
                        Err(err) if err.errno() == libc::EEXIST => {}
                        Err(err) => return Err(e(&cur)(err)),
                    }
                }
            } else {
                client.mkdir(&path, 0o755).map_err(e(&path))?;
            }
        }
        FsOp::Rm { path } => client.unlink(&path).map_err(e(&path))?,
        FsOp::Rmdir { path } => client.rmdir(&path).map_err(e(&path))?,
        FsOp::Mv { from, to } => client.rename(&from, &to).map_err(e(&from))?,
        FsOp::Stat { path } => {
            let a = client.lstat(&path).map_err(e(&path))?;
            writeln!(
                out,
                "ino {} type {:?} mode {:o} nlink {} uid {} gid {} size {} blocks {} mtime {}",
                a.ino, a.ftype, a.mode, a.nlink, a.uid, a.gid, a.size, a.blocks, a.mtime
            )?;
        }
        FsOp::Chmod { mode, path } => {
            let m = u32::from_str_radix(&mode, 8).with_context(|| format!("mode {mode:?}"))?;
            client.chmod(&path, m).map_err(e(&path))?;
        }
        FsOp::Statfs => {
            let s = client.statfs().map_err(|err| anyhow!("{err}"))?;
            writeln!(
                out,
                "blocks {} free {} files {} free-files {} bsize {}",
                s.blocks, s.bfree, s.files, s.ffree, s.bsize
            )?;
        }
        FsOp::AppendRecords {
            path,
            tag,
            count,
            min_ms,
            barrier,
            peers,
        } => {
            if let Some(b) = barrier {
                let me = format!("{b}/{tag}");
                client.mkdir(&me, 0o755).map_err(e(&me))?;
                let deadline = Instant::now() + Duration::from_secs(60);
                while client.readdir(&b).map_err(e(&b))?.len() < peers + 2 {
                    if Instant::now() > deadline {
                        bail!("barrier {b}: the other writers never came");
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            let flags = OpenFlags {
                write: true,
                create: true,
                append: true,
                ..Default::default()
            };
            let fd = client.open(&path, flags, 0o644).map_err(e(&path))?;
            let start = Instant::now();
            let mut n = 0u64;
            while n < count || start.elapsed() < Duration::from_millis(min_ms) {
                let rec = format!("{tag} {n}\n");
                client.write(fd, rec.as_bytes()).map_err(e(&path))?;
                if n.is_multiple_of(4) {
                    let mode = 0o600 | ((n % 8) as u32 * 0o10);
                    client.chmod(&path, mode).map_err(e(&path))?;
                }
                n += 1;
            }
            client.close(fd).map_err(e(&path))?;
            writeln!(out, "{tag} appended {n}")?;
        }
    }
    Ok(())
}

fn tree(client: &Client, dir: &str, lines: &mut Vec<String>) -> Result<()> {
    for d in client.readdir(dir).map_err(e(dir))? {
        if d.name == b"." || d.name == b".." {
            continue;
        }
        let name = String::from_utf8_lossy(&d.name);
        let path = if dir.ends_with('/') {
            format!("{dir}{name}")
        } else {
            format!("{dir}/{name}")
        };
        match d.ftype {
            FileType::Directory => {
                lines.push(format!("{path} dir"));
                tree(client, &path, lines)?;
            }
            FileType::Regular => {
                let fd = client.open(&path, OpenFlags::read(), 0).map_err(e(&path))?;
                let mut crc = 0u32;
                let mut size = 0u64;
                loop {
                    let b = client.read(fd, 1 << 20).map_err(e(&path))?;
                    if b.is_empty() {
                        break;
                    }
                    crc = crc32c::crc32c_append(crc, &b);
                    size += b.len() as u64;
                }
                client.close(fd).map_err(e(&path))?;
                lines.push(format!("{path} file {size} {crc:08x}"));
            }
            FileType::Symlink => {
                let t = client.readlink(&path).map_err(e(&path))?;
                lines.push(format!("{path} symlink {}", String::from_utf8_lossy(&t)));
            }
            other => lines.push(format!("{path} {other:?}")),
        }
    }
    Ok(())
}
