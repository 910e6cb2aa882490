//! `orion-preload`: OrionFS for unmodified, dynamically linked programs
//! (`liborion_preload.so`, loaded with `LD_PRELOAD` or by `orion run`).
//!
//! It exports the C library's file calls; those on paths under the Orion mount
//! (`ORION_MOUNT`) and on descriptors it opened are served in the program's own
//! process through the client library (no kernel crossing, no FUSE request), and
//! everything else goes on to the C library. Descriptors it serves are real numbers
//! the kernel holds reserved ([`table`]); a call only the kernel can serve (mmap,
//! stdio, exec, fork) gets the same file reopened through the mount first. Advisory
//! locks are held at the MDS through the client, as the mount's are.
//! Directory streams are served too; directory descriptors are the kernel's
//! (through the mount), as are paths that leave the file system. The variadic exec
//! calls are C (`variadic.c`), reached through jumps ([`variadic`]). See docs/design.md, "The preload library".

mod hooks;
mod paths;
mod real;
mod stat;
mod state;
mod table;
mod variadic;
