//! Fabric configuration: backend, provider, node address, cluster secret and epoch.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::mock::MockNet;
use crate::wait::SpinPolicy;

#[derive(Clone)]
pub enum Backend {
    /// libfabric with [`FabricConfig::provider`].
    Libfabric,
    /// Same-host shared memory.
    Local,
    /// In-process, with fault injection.
    Mock(MockNet),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Backend {
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Libfabric => "libfabric",
            Backend::Local => "local",
            Backend::Mock(_) => "mock",
        }
    }

    pub(crate) fn wire_id(&self) -> u8 {
        match self {
            Backend::Libfabric => 1,
            Backend::Local => 2,
            Backend::Mock(_) => 3,
        }
    }

    pub(crate) fn name_of(wire: u8) -> &'static str {
        match wire {
            1 => "libfabric",
            2 => "local",
            3 => "mock",
            _ => "unknown",
        }
    }
}

/// The shared secret of a cluster. Never sent: handshakes prove knowledge of it with HMACs.
#[derive(Clone)]
pub struct Secret(Arc<[u8]>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    pub const MIN_LEN: usize = 16;

    pub fn from_bytes(b: &[u8]) -> Result<Secret> {
        if b.len() < Self::MIN_LEN {
            return Err(Error::AuthFailed {
                peer: "-".into(),
                why: format!(
                    "the cluster secret has {} bytes; at least {} are needed",
                    b.len(),
                    Self::MIN_LEN
                ),
            });
        }
        Ok(Secret(b.into()))
    }

    /// Reads a secret file (its bytes, trailing newline removed).
    pub fn from_file(path: &Path) -> Result<Secret> {
        let mut b = std::fs::read(path)
            .map_err(|e| Error::io(format!("reading the cluster secret {}", path.display()), e))?;
        while b.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
            b.pop();
        }
        Secret::from_bytes(&b)
    }

    /// A fresh random secret (64 hex characters).
    pub fn generate() -> Secret {
        let mut raw = [0u8; 32];
        getrandom::getrandom(&mut raw).expect("the OS random source failed");
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        Secret(hex.as_bytes().into())
    }

    /// The secret's bytes, for writing a secret file.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

#[derive(Clone, Debug)]
pub struct FabricConfig {
    pub backend: Backend,
    /// libfabric provider ("tcp;ofi_rxm", "verbs;ofi_rxm", "shm", ...).
    pub provider: String,
    /// This node's address on the fabric (libfabric endpoints bind to it).
    pub address: IpAddr,
    pub secret: Secret,
    /// The cluster epoch; a peer at another epoch is refused.
    pub epoch: u64,
    pub spin: SpinPolicy,
    pub connect_timeout: Duration,
    /// How long a posted SEND, READ or WRITE may stay without completion before its connection
    /// is declared failed (an RDMA NIC's transport retry limit; also what catches a target that
    /// refused an access by dropping the connection, or stopped driving its progress).
    pub op_timeout: Duration,
}

impl FabricConfig {
    pub fn new(backend: Backend, secret: Secret) -> FabricConfig {
        FabricConfig {
            backend,
            provider: "tcp;ofi_rxm".into(),
            address: IpAddr::from([127, 0, 0, 1]),
            secret,
            epoch: 1,
            spin: SpinPolicy::default(),
            connect_timeout: Duration::from_secs(10),
            op_timeout: Duration::from_secs(30),
        }
    }
}
