//! The kernel's stat structures filled from the client's attributes, as the FUSE
//! mount would fill them (same device, inode numbers, block size).

use orion_client::{Attr, PAGE_SIZE};

use crate::state::settings;

fn split(ns: i64) -> (i64, i64) {
    (ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000))
}

pub fn fill_stat(a: &Attr, st: &mut libc::stat64) {
    // SAFETY: stat64 is plain data: all zeroes is a valid value.
    *st = unsafe { std::mem::zeroed() };
    st.st_dev = settings().map_or(0, |s| s.dev);
    st.st_ino = a.ino;
    st.st_mode = a.st_mode();
    st.st_nlink = a.nlink as _;
    st.st_uid = a.uid;
    st.st_gid = a.gid;
    st.st_rdev = a.rdev as u64;
    st.st_size = a.size as i64;
    st.st_blksize = PAGE_SIZE as _;
    st.st_blocks = a.blocks as i64;
    (st.st_atime, st.st_atime_nsec) = split(a.atime);
    (st.st_mtime, st.st_mtime_nsec) = split(a.mtime);
    (st.st_ctime, st.st_ctime_nsec) = split(a.ctime);
}

pub fn fill_statx(a: &Attr, st: &mut libc::statx) {
    // SAFETY: statx is plain data: all zeroes is a valid value.
    *st = unsafe { std::mem::zeroed() };
    st.stx_mask = libc::STATX_BASIC_STATS;
    st.stx_blksize = PAGE_SIZE as u32;
    st.stx_nlink = a.nlink;
    st.stx_uid = a.uid;
    st.stx_gid = a.gid;
    st.stx_mode = a.st_mode() as u16;
    st.stx_ino = a.ino;
    st.stx_size = a.size;
    st.stx_blocks = a.blocks;
    let ts = |t: &mut libc::statx_timestamp, ns: i64| {
        let (s, n) = split(ns);
        t.tv_sec = s;
        t.tv_nsec = n as u32;
    };
    ts(&mut st.stx_atime, a.atime);
    ts(&mut st.stx_mtime, a.mtime);
    ts(&mut st.stx_ctime, a.ctime);
    st.stx_rdev_major = libc::major(a.rdev as u64);
    st.stx_rdev_minor = libc::minor(a.rdev as u64);
    let dev = settings().map_or(0, |s| s.dev);
    st.stx_dev_major = libc::major(dev);
    st.stx_dev_minor = libc::minor(dev);
}
