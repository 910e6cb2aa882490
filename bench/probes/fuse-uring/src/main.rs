//! A probe of FUSE over io_uring (issue 46): a one-file FUSE file system that does
//! nothing (a 1 MiB file `f` of zeros that takes every write), served either over
//! /dev/fuse reads and writes or over one io_uring per CPU (`FUSE_OVER_IO_URING`,
//! kernel 6.14 and later, module parameter `enable_uring`), to check the kernel's ABI
//! on a machine and measure the floor of each transport. Not part of OrionFS: the
//! mount's transport will be built in the `fuse` crate; this is what it was learnt
//! from (see bench/fuse-uring-probe.sh, which builds and runs it).
//!
//! Usage (root): fuse-uring-probe MNT dev|uring
//!
//! What the ABI takes (the kernel's include/uapi/linux/fuse.h, 7.42+): the INIT reply
//! sets `FUSE_OVER_IO_URING` (bit 9 of flags2, with `FUSE_INIT_EXT`); then for each
//! queue (one per possible CPU: `qid`), entries are registered with an
//! `IORING_OP_URING_CMD` (SQE128, `cmd_op` 1 = REGISTER) whose `addr` points at two
//! iovecs (`len` 2): 288 bytes of headers (128 for the in/out header, 128 for the
//! operation's first argument, 32 for `fuse_uring_ent_in_out`) and a payload buffer
//! of at least max_write. The command completes when a request fills the entry; the
//! reply goes in the same buffers (out header first, `payload_sz` set) with
//! `cmd_op` 2 = COMMIT_AND_FETCH naming the request's `commit_id`, which also hands
//! the entry back for the next request. The 80-byte command area holds
//! `fuse_uring_cmd_req { flags: u64, commit_id: u64, qid: u16 }`. Requests go to the
//! queue of the CPU the caller runs on; forgets and interrupts still come through
//! /dev/fuse, as does everything before every queue has an entry.
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Arc;

const FUSE_LOOKUP: u32 = 1;
const FUSE_FORGET: u32 = 2;
const FUSE_GETATTR: u32 = 3;
const FUSE_SETATTR: u32 = 4;
const FUSE_OPEN: u32 = 14;
const FUSE_READ: u32 = 15;
const FUSE_WRITE: u32 = 16;
const FUSE_STATFS: u32 = 17;
const FUSE_RELEASE: u32 = 18;
const FUSE_FLUSH: u32 = 25;
const FUSE_INIT: u32 = 26;
const FUSE_OPENDIR: u32 = 27;
const FUSE_RELEASEDIR: u32 = 29;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_DESTROY: u32 = 38;
const FUSE_BATCH_FORGET: u32 = 42;

static DEV_REQS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static RING_REQS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;
const MAX_WRITE: usize = 128 * 1024;
const RING_HEADERS: usize = 128 + 128 + 32;
const IO_URING_CMD_REGISTER: u32 = 1;
const IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn attr(ino: u64) -> Vec<u8> {
    let mut a = Vec::with_capacity(88);
    let (mode, nlink, size) = if ino == 1 {
        (libc::S_IFDIR | 0o755, 2u32, 0u64)
    } else {
        (libc::S_IFREG | 0o644, 1, 1 << 20)
    };
    for v in [ino, size, size / 512, 0, 0, 0] {
        a.extend_from_slice(&v.to_le_bytes());
    }
    for v in [0u32, 0, 0, mode, nlink, 0, 0, 0, 4096, 0] {
        a.extend_from_slice(&v.to_le_bytes());
    }
    a
}

/// What a request asks: (error, reply payload), None for no reply.
fn handle(op: u32, nodeid: u64, arg: &[u8], rest: &[u8]) -> Option<(i32, Vec<u8>)> {
    Some(match op {
        FUSE_LOOKUP => {
            let name = rest.split(|&c| c == 0).next().unwrap_or(&[]);
            if nodeid == 1 && name == b"f" {
                let mut e = Vec::new();
                for v in [2u64, 0, 0, 0] {
                    e.extend_from_slice(&v.to_le_bytes());
                }
                e.extend_from_slice(&[0u8; 8]);
                e.extend_from_slice(&attr(2));
                (0, e)
            } else {
                (-libc::ENOENT, Vec::new())
            }
        }
        FUSE_GETATTR | FUSE_SETATTR => {
            let mut o = vec![0u8; 16];
            o.extend_from_slice(&attr(nodeid));
            (0, o)
        }
        FUSE_OPEN | FUSE_OPENDIR => {
            // FOPEN_DIRECT_IO (1) for files.
            let flags: u32 = if op == FUSE_OPEN { 1 } else { 0 };
            let mut o = 7u64.to_le_bytes().to_vec();
            o.extend_from_slice(&flags.to_le_bytes());
            o.extend_from_slice(&0u32.to_le_bytes());
            (0, o)
        }
        FUSE_READ => {
            let size = u32_at(arg, 16) as usize;
            (0, vec![0u8; size.min(MAX_WRITE)])
        }
        FUSE_WRITE => {
            let size = u32_at(arg, 16);
            let mut o = size.to_le_bytes().to_vec();
            o.extend_from_slice(&[0u8; 4]);
            (0, o)
        }
        FUSE_STATFS => (0, vec![0u8; 80]),
        FUSE_RELEASE | FUSE_FLUSH | FUSE_RELEASEDIR => (0, Vec::new()),
        FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT => return None,
        _ => (-libc::ENOSYS, Vec::new()),
    })
}

fn out_header(len: usize, error: i32, unique: u64) -> [u8; OUT_HEADER] {
    let mut h = [0u8; OUT_HEADER];
    h[0..4].copy_from_slice(&(len as u32).to_le_bytes());
    h[4..8].copy_from_slice(&error.to_le_bytes());
    h[8..16].copy_from_slice(&unique.to_le_bytes());
    h
}

/// Serves /dev/fuse: INIT (asking for io_uring if `uring`), then whatever comes.
fn serve_dev(dev: Arc<std::fs::File>, uring: bool, inited: std::sync::mpsc::Sender<()>) {
    let mut buf = vec![0u8; MAX_WRITE + 4096];
    let mut inited = Some(inited);
    loop {
        let n = match (&*dev).read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) || e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => {
                eprintln!("dev read: {e}");
                return;
            }
        };
        let b = &buf[..n];
        let (op, unique, nodeid) = (u32_at(b, 4), u64_at(b, 8), u64_at(b, 16));
        if op == FUSE_INIT {
            let (major, minor, ra, flags) = (u32_at(b, 40), u32_at(b, 44), u32_at(b, 48), u32_at(b, 52));
            let flags2 = u32_at(b, 56);
            eprintln!("INIT {major}.{minor} flags {flags:#x} flags2 {flags2:#x}");
            // FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_MAX_PAGES | FUSE_INIT_EXT.
            let want = 1 | (1 << 5) | (1 << 22) | (1 << 30);
            let want2: u32 = if uring { 1 << 9 } else { 0 }; // FUSE_OVER_IO_URING
            let mut o = Vec::new();
            for v in [7u32, minor, ra, flags & want] {
                o.extend_from_slice(&v.to_le_bytes());
            }
            o.extend_from_slice(&16u16.to_le_bytes()); // max_background
            o.extend_from_slice(&12u16.to_le_bytes()); // congestion_threshold
            o.extend_from_slice(&(MAX_WRITE as u32).to_le_bytes());
            o.extend_from_slice(&1u32.to_le_bytes()); // time_gran
            o.extend_from_slice(&((MAX_WRITE / 4096) as u16).to_le_bytes());
            o.extend_from_slice(&0u16.to_le_bytes());
            o.extend_from_slice(&(flags2 & want2).to_le_bytes());
            o.extend_from_slice(&0u32.to_le_bytes());
            o.extend_from_slice(&[0u8; 24]);
            let mut msg = out_header(OUT_HEADER + o.len(), 0, unique).to_vec();
            msg.extend_from_slice(&o);
            (&*dev).write_all(&msg).unwrap();
            if let Some(t) = inited.take() {
                let _ = t.send(());
            }
            continue;
        }
        if op == FUSE_DESTROY {
            let msg = out_header(OUT_HEADER, 0, unique);
            let _ = (&*dev).write_all(&msg);
            return;
        }
        DEV_REQS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let arg = &b[IN_HEADER..];
        let argsz = match op {
            FUSE_GETATTR => 16,
            FUSE_READ | FUSE_WRITE => 40,
            FUSE_OPEN | FUSE_OPENDIR => 8,
            FUSE_RELEASE | FUSE_RELEASEDIR => 24,
            FUSE_FLUSH => 24,
            FUSE_SETATTR => 88,
            _ => 0,
        }
        .min(arg.len());
        if let Some((err, payload)) = handle(op, nodeid, &arg[..argsz], &arg[argsz..]) {
            let mut msg = out_header(OUT_HEADER + payload.len(), err, unique).to_vec();
            msg.extend_from_slice(&payload);
            if let Err(e) = (&*dev).write_all(&msg) {
                eprintln!("dev write op {op}: {e}");
            }
        }
    }
}

struct Ent {
    headers: Vec<u8>,
    payload: Vec<u8>,
    iov: [libc::iovec; 2],
}

fn cmd_sqe(fd: i32, op: u32, qid: u16, commit_id: u64, ent: &mut Ent, user: u64) -> io_uring::squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_le_bytes());
    cmd[16..18].copy_from_slice(&qid.to_le_bytes());
    let e = io_uring::opcode::UringCmd80::new(io_uring::types::Fd(fd), op)
        .cmd(cmd)
        .addr(Some(ent.iov.as_ptr() as u64))
        .build()
        .user_data(user);
    // The iovec count goes in sqe->len (offset 24 of the SQE), which the builder
    // does not set.
    // SAFETY: `Entry128` is `repr(C)`: a 64-byte `io_uring_sqe` and 64 more bytes, so
    // it has the size and layout of `[u8; 128]` and every bit pattern of the array is
    // a value of it (plain integers and byte arrays).
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    raw[24..28].copy_from_slice(&2u32.to_le_bytes());
    // SAFETY: as above, the other way.
    unsafe { std::mem::transmute(raw) }
}

fn serve_queue(fd: i32, qid: u16, ents: usize) {
    // The thread serves the CPU its queue is for (requests come from callers there).
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and sched_setaffinity only
    // read and write the set passed by reference.
    unsafe {
        let mut set = std::mem::zeroed::<libc::cpu_set_t>();
        libc::CPU_SET(qid as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    // The entries are made before the ring so that they are dropped after it (and
    // they are leaked, not dropped, if the loop ends with commands in flight).
    let mut es: Vec<Box<Ent>> = (0..ents)
        .map(|_| {
            let mut e = Box::new(Ent {
                headers: vec![0u8; RING_HEADERS],
                payload: vec![0u8; MAX_WRITE],
                // SAFETY: an iovec of a null pointer and length 0 is a valid value;
                // both are set right below.
                iov: unsafe { std::mem::zeroed() },
            });
            e.iov[0] = libc::iovec { iov_base: e.headers.as_mut_ptr().cast(), iov_len: RING_HEADERS };
            e.iov[1] = libc::iovec { iov_base: e.payload.as_mut_ptr().cast(), iov_len: MAX_WRITE };
            e
        })
        .collect();
    let mut ring: io_uring::IoUring<io_uring::squeue::Entry128> =
        io_uring::IoUring::builder().build(8).expect("io_uring with SQE128");
    for (i, e) in es.iter_mut().enumerate() {
        let sqe = cmd_sqe(fd, IO_URING_CMD_REGISTER, qid, 0, e, i as u64);
        // SAFETY: the iovecs and the buffers they name live in `es`, boxed (they do
        // not move); `es` is leaked when the loop ends (an entry may still be
        // registered then), so they live as long as the kernel may write them.
        unsafe { ring.submission().push(&sqe).unwrap() };
    }
    ring.submit().unwrap();
    serve_ring(&mut ring, fd, qid, &mut es);
    // Another entry may still be registered (the loop ends at the first error):
    // the kernel may fill it until the connection ends.
    std::mem::forget(es);
}

/// Answers requests until a command fails (at unmount: ENOTCONN).
fn serve_ring(
    ring: &mut io_uring::IoUring<io_uring::squeue::Entry128>,
    fd: i32,
    qid: u16,
    es: &mut [Box<Ent>],
) {
    loop {
        if let Err(e) = ring.submit_and_wait(1) {
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            eprintln!("queue {qid}: {e}");
            return;
        }
        let done: Vec<(u64, i32)> = ring.completion().map(|c| (c.user_data(), c.result())).collect();
        for (i, res) in done {
            if res < 0 {
                eprintln!("queue {qid} entry {i}: {}", std::io::Error::from_raw_os_error(-res));
                return;
            }
            RING_REQS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let e = &mut es[i as usize];
            let h = &e.headers;
            let (op, unique, nodeid) = (u32_at(h, 4), u64_at(h, 8), u64_at(h, 16));
            let commit_id = u64_at(h, 256 + 8);
            let psz = u32_at(h, 256 + 16) as usize;
            let arg = h[128..256].to_vec();
            let rest = e.payload[..psz.min(MAX_WRITE)].to_vec();
            let (err, payload) = handle(op, nodeid, &arg, &rest).unwrap_or((0, Vec::new()));
            let out = out_header(OUT_HEADER + payload.len(), err, unique);
            e.headers[..OUT_HEADER].copy_from_slice(&out);
            e.payload[..payload.len()].copy_from_slice(&payload);
            e.headers[256 + 16..256 + 20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            let sqe = cmd_sqe(fd, IO_URING_CMD_COMMIT_AND_FETCH, qid, commit_id, e, i);
            // SAFETY: as for the registration above.
            unsafe { ring.submission().push(&sqe).unwrap() };
        }
    }
}

/// The kernel's count of possible CPUs (`/sys/devices/system/cpu/possible`, e.g.
/// "0-1"): its FUSE rings have a queue for each.
fn possible_cpus() -> usize {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    s.trim()
        .split(',')
        .filter_map(|r| r.rsplit('-').next()?.parse::<usize>().ok())
        .max()
        .map_or(1, |last| last + 1)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mnt, uring) = (&args[1], args[2] == "uring");
    // SAFETY: a C string literal and flags.
    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    assert!(fd >= 0, "open /dev/fuse");
    let opts = format!("fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other");
    let src = std::ffi::CString::new("probe").unwrap();
    let target = std::ffi::CString::new(mnt.as_str()).unwrap();
    let ty = std::ffi::CString::new("fuse.probe").unwrap();
    let o = std::ffi::CString::new(opts).unwrap();
    // SAFETY: every pointer is a live C string.
    let r = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), ty.as_ptr(), libc::MS_NOSUID | libc::MS_NODEV, o.as_ptr().cast()) };
    assert!(r == 0, "mount: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` was just opened here and is owned by nothing else.
    let dev = Arc::new(unsafe { std::fs::File::from_raw_fd(fd) });
    let (tx, rx) = std::sync::mpsc::channel();
    let d = dev.clone();
    let devt = std::thread::spawn(move || serve_dev(d, uring, tx));
    rx.recv().unwrap();
    if !uring {
        // Four threads read /dev/fuse, as the mount's and the null FUSE's do.
        for _ in 0..3 {
            let d = dev.clone();
            let (tx, _rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || serve_dev(d, false, tx));
        }
    }
    if uring {
        // One queue per possible CPU, as the kernel makes them (fewer and the rings
        // never become ready: every request would go through /dev/fuse).
        let cpus = possible_cpus();
        for q in 0..cpus {
            let fd = dev.as_raw_fd();
            std::thread::spawn(move || serve_queue(fd, q as u16, 2));
        }
    }
    println!("ready");
    devt.join().unwrap();
    eprintln!(
        "served: {} through /dev/fuse, {} through the rings",
        DEV_REQS.load(std::sync::atomic::Ordering::Relaxed),
        RING_REQS.load(std::sync::atomic::Ordering::Relaxed)
    );
}
