//! Declarations of the C shim (`shim.c`) over libfabric. Every libfabric object is opaque here.

use std::ffi::{c_char, c_int, c_void};

pub(crate) type Ptr = *mut c_void;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Cqe {
    pub context: u64,
    pub flags: u64,
    pub len: u64,
    pub data: u64,
}

#[repr(C)]
pub(crate) struct CqErr {
    pub context: u64,
    pub flags: u64,
    pub len: u64,
    pub olen: u64,
    pub err: i32,
    pub prov_errno: i32,
    pub msg: [c_char; 128],
}

#[repr(C)]
pub(crate) struct InfoAttrs {
    pub mr_mode: u64,
    pub mr_key_size: u64,
    pub cq_data_size: u64,
    pub max_msg_size: u64,
    pub inject_size: u64,
    pub tx_size: u64,
    pub rx_size: u64,
    pub provider: [c_char; 64],
    pub fabric: [c_char; 64],
    pub domain: [c_char; 64],
}

extern "C" {
    pub(crate) fn orion_fi_strerror(err: c_int) -> *const c_char;
    pub(crate) fn orion_fi_requested_mr_mode() -> u64;
    pub(crate) fn orion_fi_getinfo(
        provider: *const c_char,
        node: *const c_char,
        out: *mut Ptr,
    ) -> c_int;
    pub(crate) fn orion_fi_info_attrs(info: Ptr, a: *mut InfoAttrs);
    pub(crate) fn orion_fi_freeinfo(info: Ptr);
    pub(crate) fn orion_fi_fabric(info: Ptr, fabric: *mut Ptr) -> c_int;
    pub(crate) fn orion_fi_domain(fabric: Ptr, info: Ptr, domain: *mut Ptr) -> c_int;
    pub(crate) fn orion_fi_av_open(domain: Ptr, av: *mut Ptr) -> c_int;
    pub(crate) fn orion_fi_cq_open(
        domain: Ptr,
        size: usize,
        with_wait_fd: c_int,
        cq: *mut Ptr,
    ) -> c_int;
    pub(crate) fn orion_fi_cq_wait_fd(cq: Ptr, fd: *mut c_int) -> c_int;
    pub(crate) fn orion_fi_trywait(fabric: Ptr, cq: Ptr) -> c_int;
    pub(crate) fn orion_fi_endpoint(
        domain: Ptr,
        info: Ptr,
        av: Ptr,
        cq: Ptr,
        ep: *mut Ptr,
    ) -> c_int;
    pub(crate) fn orion_fi_getname(ep: Ptr, buf: *mut c_void, len: *mut usize) -> c_int;
    pub(crate) fn orion_fi_av_insert(av: Ptr, addr: *const c_void, fi_addr: *mut u64) -> c_int;
    pub(crate) fn orion_fi_av_remove(av: Ptr, fi_addr: u64) -> c_int;
    pub(crate) fn orion_fi_mr_reg(
        domain: Ptr,
        buf: *mut c_void,
        len: usize,
        access: u64,
        key: u64,
        mr: *mut Ptr,
    ) -> c_int;
    pub(crate) fn orion_fi_mr_key(mr: Ptr) -> u64;
    pub(crate) fn orion_fi_mr_desc(mr: Ptr) -> Ptr;
    pub(crate) fn orion_fi_close_ep(ep: Ptr) -> c_int;
    pub(crate) fn orion_fi_close_cq(cq: Ptr) -> c_int;
    pub(crate) fn orion_fi_close_av(av: Ptr) -> c_int;
    pub(crate) fn orion_fi_close_mr(mr: Ptr) -> c_int;
    pub(crate) fn orion_fi_close_domain(d: Ptr) -> c_int;
    pub(crate) fn orion_fi_close_fabric(f: Ptr) -> c_int;
    pub(crate) fn orion_fi_send(
        ep: Ptr,
        buf: *const c_void,
        len: usize,
        desc: Ptr,
        dest: u64,
        ctx: u64,
    ) -> isize;
    pub(crate) fn orion_fi_recv(
        ep: Ptr,
        buf: *mut c_void,
        len: usize,
        desc: Ptr,
        src: u64,
        ctx: u64,
    ) -> isize;
    pub(crate) fn orion_fi_read(
        ep: Ptr,
        buf: *mut c_void,
        len: usize,
        desc: Ptr,
        src: u64,
        addr: u64,
        key: u64,
        ctx: u64,
    ) -> isize;
    pub(crate) fn orion_fi_write(
        ep: Ptr,
        buf: *const c_void,
        len: usize,
        desc: Ptr,
        dest: u64,
        addr: u64,
        key: u64,
        ctx: u64,
    ) -> isize;
    pub(crate) fn orion_fi_writedata(
        ep: Ptr,
        buf: *const c_void,
        len: usize,
        desc: Ptr,
        data: u64,
        dest: u64,
        addr: u64,
        key: u64,
        ctx: u64,
    ) -> isize;
    pub(crate) fn orion_fi_cq_read(cq: Ptr, out: *mut Cqe, count: usize) -> isize;
    pub(crate) fn orion_fi_cq_readerr(cq: Ptr, out: *mut CqErr) -> isize;
    pub(crate) fn orion_fi_flag_remote_cq_data() -> u64;
    pub(crate) fn orion_fi_access_local() -> u64;
    pub(crate) fn orion_fi_access_remote_read() -> u64;
    pub(crate) fn orion_fi_access_remote_write() -> u64;
}

pub(crate) const FI_EAGAIN: i32 = 11;
pub(crate) const FI_ENODATA: i32 = 61;
pub(crate) const FI_EAVAIL: i32 = 259;
pub(crate) const FI_ETRUNC: i32 = 265;
pub(crate) const FI_ECANCELED: i32 = 125;
pub(crate) const FI_MR_LOCAL: u64 = 1 << 2;
pub(crate) const FI_MR_VIRT_ADDR: u64 = 1 << 4;
pub(crate) const FI_MR_ALLOCATED: u64 = 1 << 5;
pub(crate) const FI_MR_PROV_KEY: u64 = 1 << 6;

pub(crate) fn cstr(b: &[c_char]) -> String {
    let bytes: Vec<u8> = b
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
