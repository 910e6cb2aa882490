//! orion-fabric: the transport of OrionFS, shaped like RDMA verbs (DESIGN.md §6).
//!
//! A [`Domain`] registers memory [`Region`]s (each with an unpredictable, revocable remote key),
//! opens [`CompletionQueue`]s, listens and connects. A [`Connection`] posts one-sided READ and
//! WRITE of (remote key, offset, length), WRITE with a 32-bit immediate that lands in the
//! target's completion queue, and two-sided SEND into RECV buffers posted by the peer. Every
//! operation completes exactly once, on the completion queue of its connection, as a
//! [`Completion`] whose status is a value, never a panic.
//!
//! Backends, chosen by [`FabricConfig::backend`], are invisible to callers:
//! - `libfabric` (module `ofi`): any provider, `tcp;ofi_rxm` here, `verbs;ofi_rxm` on RDMA.
//! - `local` (module `local`): processes on one host; regions are shared files the peer maps, so
//!   one-sided operations are memory copies that cost the target no CPU; messages travel through
//!   shared-memory rings with spin-then-futex wake-ups.
//! - `mock` (module `mock`): in-process, with fault injection for tests.
//!
//! Connections start with a handshake on a bootstrap stream (TCP, or a socket pair for the mock)
//! that authenticates both sides with the cluster secret and checks the cluster epoch.

mod api;
mod auth;
mod config;
pub mod echo;
mod error;
mod futex;
pub mod local;
pub mod mock;
pub mod ofi;
mod readable;
mod region;
mod tcp;
mod wait;

pub use api::{
    Completion, CompletionQueue, ConnId, Connection, Domain, Listener, OpKind, DAEMON_PEER_LOOKS,
    MAX_MESSAGE,
};
pub use config::{Backend, FabricConfig, Secret};
pub use error::{Error, Result};
pub use region::{Access, Region, RemoteRegion};
pub use tcp::service_port;
pub use wait::SpinPolicy;
