//! The C library's own functions, found past this library with
//! `dlsym(RTLD_NEXT, name)`: what every call this library does not serve goes to.
//! Each address is looked up once, on first use.

use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{c_char, c_int, c_long, c_uint, c_ulong, c_void, mode_t, off_t, size_t, ssize_t};

/// The next definition of `name` (NUL-terminated) after this library's.
fn lookup(name: &'static str, cache: &AtomicUsize) -> usize {
    let p = cache.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name has no other requirement.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) } as usize;
    if p == 0 {
        let msg = format!(
            "orion-preload: the C library has no {}\n",
            name.trim_end_matches('\0')
        );
        // SAFETY: write(2) of a buffer we own; then abort: nothing can be served.
        unsafe {
            libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len());
            libc::abort();
        }
    }
    cache.store(p, Ordering::Relaxed);
    p
}

/// Declares `pub unsafe fn name(args) -> ret` calling the C library's `name`, whose
/// C prototype must be exactly `ret name(args)`.
macro_rules! real {
    ($( fn $name:ident($($a:ident: $t:ty),* $(,)?) -> $r:ty; )*) => {$(
        /// The C library's function of this name.
        ///
        /// # Safety
        /// As the C function: its pointer arguments must be valid for it.
        pub unsafe fn $name($($a: $t),*) -> $r {
            static ADDR: AtomicUsize = AtomicUsize::new(0);
            let p = lookup(concat!(stringify!($name), "\0"), &ADDR);
            // SAFETY: `p` is the C library's definition of this function, whose
            // prototype the declaration above repeats.
            let f: unsafe extern "C" fn($($t),*) -> $r = unsafe { std::mem::transmute(p) };
            // SAFETY: the caller upholds the C function's contract.
            unsafe { f($($a),*) }
        }
    )*};
}

real! {
    fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int;
    fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int;
    fn close(fd: c_int) -> c_int;
    fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t;
    fn pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t;
    fn readv(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t;
    fn writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t;
    fn preadv64(fd: c_int, iov: *const libc::iovec, n: c_int, off: off_t) -> ssize_t;
    fn pwritev64(fd: c_int, iov: *const libc::iovec, n: c_int, off: off_t) -> ssize_t;
    fn preadv64v2(fd: c_int, iov: *const libc::iovec, n: c_int, off: off_t, fl: c_int) -> ssize_t;
    fn pwritev64v2(fd: c_int, iov: *const libc::iovec, n: c_int, off: off_t, fl: c_int) -> ssize_t;
    fn lseek64(fd: c_int, off: off_t, whence: c_int) -> off_t;
    fn getdents64(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    fn fsync(fd: c_int) -> c_int;
    fn fdatasync(fd: c_int) -> c_int;
    fn ftruncate64(fd: c_int, len: off_t) -> c_int;
    fn truncate64(path: *const c_char, len: off_t) -> c_int;
    fn fstat64(fd: c_int, st: *mut libc::stat64) -> c_int;
    fn fstatat64(dirfd: c_int, path: *const c_char, st: *mut libc::stat64, fl: c_int) -> c_int;
    fn statx(dirfd: c_int, path: *const c_char, fl: c_int, mask: c_uint, st: *mut libc::statx) -> c_int;
    fn faccessat(dirfd: c_int, path: *const c_char, mode: c_int, fl: c_int) -> c_int;
    fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int;
    fn unlinkat(dirfd: c_int, path: *const c_char, fl: c_int) -> c_int;
    fn renameat2(od: c_int, from: *const c_char, nd: c_int, to: *const c_char, fl: c_uint) -> c_int;
    fn dup(fd: c_int) -> c_int;
    fn dup3(old: c_int, new: c_int, fl: c_int) -> c_int;
    fn fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int;
    fn ioctl(fd: c_int, req: c_ulong, arg: c_long) -> c_int;
    fn mmap64(a: *mut c_void, n: size_t, prot: c_int, fl: c_int, fd: c_int, off: off_t) -> *mut c_void;
    fn fallocate64(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int;
    fn fchmod(fd: c_int, mode: mode_t) -> c_int;
    fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int;
    fn futimens(fd: c_int, t: *const libc::timespec) -> c_int;
    fn fstatfs64(fd: c_int, st: *mut libc::statfs64) -> c_int;
    fn statfs64(path: *const c_char, st: *mut libc::statfs64) -> c_int;
    fn fstatvfs64(fd: c_int, st: *mut libc::statvfs64) -> c_int;
    fn statvfs64(path: *const c_char, st: *mut libc::statvfs64) -> c_int;
    fn flock(fd: c_int, op: c_int) -> c_int;
    fn fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE;
    fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fn execv(path: *const c_char, argv: *const *const c_char) -> c_int;
    fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int;
    fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fn posix_spawn(pid: *mut libc::pid_t, path: *const c_char, fa: *const libc::posix_spawn_file_actions_t, at: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int;
    fn posix_spawnp(pid: *mut libc::pid_t, file: *const c_char, fa: *const libc::posix_spawn_file_actions_t, at: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int;
    fn sendfile64(out: c_int, input: c_int, off: *mut off_t, n: size_t) -> ssize_t;
    fn copy_file_range(fi: c_int, oi: *mut off_t, fo: c_int, oo: *mut off_t, n: size_t, fl: c_uint) -> ssize_t;
    fn fchdir(fd: c_int) -> c_int;
    fn fgetxattr(fd: c_int, name: *const c_char, v: *mut c_void, n: size_t) -> ssize_t;
    fn fsetxattr(fd: c_int, name: *const c_char, v: *const c_void, n: size_t, fl: c_int) -> c_int;
    fn flistxattr(fd: c_int, list: *mut c_char, n: size_t) -> ssize_t;
    fn fremovexattr(fd: c_int, name: *const c_char) -> c_int;
    fn getcwd(buf: *mut c_char, n: size_t) -> *mut c_char;
    fn readlink(path: *const c_char, buf: *mut c_char, n: size_t) -> ssize_t;
    fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int;
    fn posix_fallocate64(fd: c_int, off: off_t, len: off_t) -> c_int;
    fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE;
    fn freopen64(path: *const c_char, mode: *const c_char, f: *mut libc::FILE) -> *mut libc::FILE;
    fn posix_fadvise64(fd: c_int, off: off_t, len: off_t, advice: c_int) -> c_int;
    fn utimensat(d: c_int, path: *const c_char, t: *const libc::timespec, fl: c_int) -> c_int;
    fn futimes(fd: c_int, t: *const libc::timeval) -> c_int;
    fn lockf64(fd: c_int, cmd: c_int, len: off_t) -> c_int;
    fn eventfd(init: c_uint, flags: c_int) -> c_int;
    fn epoll_create1(flags: c_int) -> c_int;
    fn symlinkat(target: *const c_char, d: c_int, path: *const c_char) -> c_int;
    fn linkat(od: c_int, from: *const c_char, nd: c_int, to: *const c_char, fl: c_int) -> c_int;
    fn readlinkat(d: c_int, path: *const c_char, buf: *mut c_char, n: size_t) -> ssize_t;
    fn fchmodat(d: c_int, path: *const c_char, mode: mode_t, fl: c_int) -> c_int;
    fn fchownat(d: c_int, path: *const c_char, uid: libc::uid_t, gid: libc::gid_t, fl: c_int) -> c_int;
    fn getxattr(path: *const c_char, name: *const c_char, v: *mut c_void, n: size_t) -> ssize_t;
    fn lgetxattr(path: *const c_char, name: *const c_char, v: *mut c_void, n: size_t) -> ssize_t;
    fn setxattr(path: *const c_char, name: *const c_char, v: *const c_void, n: size_t, fl: c_int) -> c_int;
    fn lsetxattr(path: *const c_char, name: *const c_char, v: *const c_void, n: size_t, fl: c_int) -> c_int;
    fn listxattr(path: *const c_char, list: *mut c_char, n: size_t) -> ssize_t;
    fn llistxattr(path: *const c_char, list: *mut c_char, n: size_t) -> ssize_t;
    fn removexattr(path: *const c_char, name: *const c_char) -> c_int;
    fn lremovexattr(path: *const c_char, name: *const c_char) -> c_int;
    fn opendir(path: *const c_char) -> *mut libc::DIR;
    fn closedir(d: *mut libc::DIR) -> c_int;
    fn readdir64(d: *mut libc::DIR) -> *mut libc::dirent64;
    fn readdir64_r(d: *mut libc::DIR, e: *mut libc::dirent64, out: *mut *mut libc::dirent64) -> c_int;
    fn rewinddir(d: *mut libc::DIR) -> ();
    fn seekdir(d: *mut libc::DIR, pos: c_long) -> ();
    fn telldir(d: *mut libc::DIR) -> c_long;
    fn dirfd(d: *mut libc::DIR) -> c_int;
    fn system(cmd: *const c_char) -> c_int;
    fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int;
    fn popen(cmd: *const c_char, mode: *const c_char) -> *mut libc::FILE;
    fn setuid(u: libc::uid_t) -> c_int;
    fn setgid(g: libc::gid_t) -> c_int;
    fn seteuid(u: libc::uid_t) -> c_int;
    fn setegid(g: libc::gid_t) -> c_int;
    fn setreuid(r: libc::uid_t, e: libc::uid_t) -> c_int;
    fn setregid(r: libc::gid_t, e: libc::gid_t) -> c_int;
    fn setresuid(r: libc::uid_t, e: libc::uid_t, s: libc::uid_t) -> c_int;
    fn setresgid(r: libc::gid_t, e: libc::gid_t, s: libc::gid_t) -> c_int;
    fn fdopendir(fd: c_int) -> *mut libc::DIR;
}
