//! What the library knows of its process: where the Orion mount is, the client it
//! serves calls through (one per process: a forked child connects its own), and a
//! guard that sends the library's own file calls straight to the C library.

use std::cell::Cell;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use orion_client::{Client, ClientConfig, FabricSection};
use serde::Deserialize;

use crate::real;

/// The environment variable naming the mount point whose paths this library serves.
pub const MOUNT_VAR: &str = "ORION_MOUNT";
/// The environment variable holding the client's settings (JSON: `{"client": {..},
/// "fabric": {..}}`, the `[client]` and `[fabric]` sections of the configuration),
/// as `orion run` sets it.
pub const CLIENT_VAR: &str = "ORION_CLIENT";

/// The settings of this process, read once from the environment.
pub struct Settings {
    /// The mount point, resolved (no symlink, no trailing slash).
    pub mount: String,
    /// Its device number: what `st_dev` says for every file under it, as the kernel
    /// says through the mount.
    pub dev: u64,
    client: ClientSettings,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ClientSettings {
    client: ClientConfig,
    fabric: FabricSection,
}

static SETTINGS: OnceLock<Option<Settings>> = OnceLock::new();

/// This process's settings; `None` when no mount is named (every call goes to the
/// C library).
pub fn settings() -> Option<&'static Settings> {
    SETTINGS.get_or_init(load).as_ref()
}

fn load() -> Option<Settings> {
    let _inside = Inside::enter();
    let mount = std::env::var(MOUNT_VAR).ok().filter(|m| !m.is_empty())?;
    let mount = match std::fs::canonicalize(&mount) {
        Ok(p) => p.to_string_lossy().into_owned(),
        Err(e) => {
            say(&format!(
                "{MOUNT_VAR}={mount}: {e}; serving nothing in-process"
            ));
            return None;
        }
    };
    let dev = std::fs::metadata(&mount)
        .map(|m| std::os::unix::fs::MetadataExt::dev(&m))
        .unwrap_or(0);
    let client = match std::env::var(CLIENT_VAR) {
        Ok(text) => match serde_json::from_str::<ClientSettings>(&text) {
            Ok(c) => c,
            Err(e) => {
                say(&format!("{CLIENT_VAR}: {e}; serving nothing in-process"));
                return None;
            }
        },
        Err(_) => ClientSettings::default(),
    };
    Some(Settings { mount, dev, client })
}

/// Says something on stderr, as this library (once per cause, by its callers).
pub fn say(msg: &str) {
    let line = format!("orion-preload: {msg}\n");
    // SAFETY: write(2) of a buffer we own.
    unsafe { real::write(2, line.as_ptr().cast(), line.len()) };
}

/// The client of this process (`None`: the cluster could not be reached, and every
/// call goes through the mount). A child process after fork connects its own on its
/// first call: the parent's connections and threads are not its to use.
pub fn client() -> Option<&'static Client> {
    let me = pid();
    let p = CLIENT.load(Ordering::Acquire);
    if CLIENT_PID.load(Ordering::Acquire) == me {
        // SAFETY: a pointer stored with this pid comes from Box::leak below and is
        // never freed (or null: the cluster could not be reached).
        return unsafe { p.as_ref() };
    }
    let _one = CONNECTING.lock().unwrap_or_else(|e| e.into_inner());
    if CLIENT_PID.load(Ordering::Acquire) == me {
        // SAFETY: as above.
        return unsafe { CLIENT.load(Ordering::Acquire).as_ref() };
    }
    crate::hooks::setup();
    let made = connect();
    let p = match made {
        Some(c) => {
            extern "C" fn at_exit() {
                let _in = Inside::enter();
                orion_client::remove_fabric_files();
            }
            // SAFETY: registering a plain function of this library.
            unsafe { libc::atexit(at_exit) };
            Box::leak(Box::new(c)) as *mut Client
        }
        None => std::ptr::null_mut(),
    };
    CLIENT.store(p, Ordering::Release);
    CLIENT_PID.store(me, Ordering::Release);
    // SAFETY: as above.
    unsafe { p.as_ref() }
}

static CLIENT: AtomicPtr<Client> = AtomicPtr::new(std::ptr::null_mut());
/// The process that connected [`CLIENT`] (0: none yet).
static CLIENT_PID: AtomicI32 = AtomicI32::new(0);
static CONNECTING: Mutex<()> = Mutex::new(());
/// This process's id, refreshed in a child after fork.
static PID: AtomicI32 = AtomicI32::new(0);

pub fn pid() -> i32 {
    let p = PID.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: getpid has no preconditions.
    let p = unsafe { libc::getpid() };
    PID.store(p, Ordering::Relaxed);
    p
}

/// After fork, in the child: a new process id, so a new client on first use.
pub fn forked() {
    PID.store(0, Ordering::Relaxed);
}

fn connect() -> Option<Client> {
    let _inside = Inside::enter();
    let s = settings()?;
    let fabric = match s.client.fabric.fabric_config() {
        Ok(f) => f,
        Err(e) => {
            say(&format!("{e}; every call goes through the mount"));
            return None;
        }
    };
    let mut cfg = s.client.client.clone();
    cfg.host_paths = true;
    if cfg.name.is_empty() {
        cfg.name = format!("preload:{}", pid());
    }
    match Client::connect(cfg.clone(), fabric) {
        Ok(c) => Some(c),
        Err(e) => {
            say(&format!(
                "cannot reach the cluster (MDS {}): {e}; every call goes through the mount \
                 {}",
                cfg.mds, s.mount
            ));
            None
        }
    }
}

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Marks the library at work on this thread: file calls the library itself makes
/// meanwhile (the client's, the standard library's) go straight to the C library.
pub struct Inside {
    was: bool,
}

impl Inside {
    pub fn enter() -> Inside {
        Inside {
            was: INSIDE.with(|c| c.replace(true)),
        }
    }

    /// Whether this thread is already inside the library.
    pub fn now() -> bool {
        INSIDE.with(|c| c.get())
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let was = self.was;
        INSIDE.with(|c| c.set(was));
    }
}

/// Set (to anything) to have each process say at exit how many calls it served.
pub const STATS_VAR: &str = "ORION_PRELOAD_STATS";

/// Calls served in-process, and open files handed to the kernel.
pub static SERVED: AtomicU64 = AtomicU64::new(0);
pub static HANDED: AtomicU64 = AtomicU64::new(0);

/// At exit, with [`STATS_VAR`] set: one line of what this process served.
pub fn report() {
    if std::env::var_os(STATS_VAR).is_some() && settings().is_some() {
        say(&format!(
            "pid {}: {} calls served in-process, {} open files handed to the kernel",
            pid(),
            SERVED.load(Ordering::Relaxed),
            HANDED.load(Ordering::Relaxed)
        ));
    }
}

/// Moves a descriptor the library itself made (its client's sockets and files) to a
/// high number, out of the program's way: a shell's `exec 4< file` is a dup2 onto 4,
/// which would otherwise close the client's connection if it had that number. Below
/// the soft limit on open files, 200 from its top.
pub fn relocate(fd: libc::c_int) -> libc::c_int {
    let floor = own_floor();
    if fd < 0 || fd >= floor {
        return fd;
    }
    // SAFETY: fcntl on a descriptor the library just made.
    let cloexec = unsafe { real::fcntl(fd, libc::F_GETFD, 0) } & libc::FD_CLOEXEC != 0;
    let cmd = if cloexec {
        libc::F_DUPFD_CLOEXEC
    } else {
        libc::F_DUPFD
    };
    // SAFETY: as above.
    let high = unsafe { real::fcntl(fd, cmd, floor as libc::c_long) };
    if high < 0 {
        return fd;
    }
    // SAFETY: close(2) of the low number, now duplicated high.
    unsafe { real::close(fd) };
    high
}

/// The lowest number of the library's own descriptors ([`relocate`]).
pub fn own_floor() -> libc::c_int {
    static FLOOR: std::sync::OnceLock<libc::c_int> = std::sync::OnceLock::new();
    *FLOOR.get_or_init(|| {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into a struct we own.
        let soft = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } {
            0 => r.rlim_cur.min(1 << 20) as libc::c_int,
            _ => 1024,
        };
        (soft - 200).max(64)
    })
}
