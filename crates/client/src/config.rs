//! What a client is told: where the MDS is and how to behave.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ClientConfig {
    /// The metadata server ("host:port"; the primary and its mirror, comma-separated,
    /// in any order).
    pub mds: String,
    /// Data consistency (paper §5.3): "strong" commits a write only once every data
    /// store of its group has persisted the pages; "weak" commits at once (fsync then
    /// makes the pages durable).
    pub consistency: String,
    /// When a write is committed to the MDS (Assise's choice, §3.3): "pessimistic"
    /// commits each write before it returns, so every client sees it at once;
    /// "optimistic" stages small whole-page writes of a file and commits them in one
    /// log commit at fsync, close, any other operation, [`MAX_STAGED_ENTRIES`] entries
    /// or `stage_ms`, whichever comes first. A write not yet committed is lost if
    /// this client process dies (as the page cache is lost with the kernel); fsync
    /// and close report a staged write that failed to commit.
    ///
    /// [`MAX_STAGED_ENTRIES`]: crate::staging::MAX_STAGED_ENTRIES
    pub persistence: String,
    /// With optimistic persistence, how long a write may stay staged, in
    /// milliseconds: the bound on what other clients do not see yet and on what a
    /// crash of this client loses.
    pub stage_ms: u64,
    /// Map the pool of a data store on this host and read and write it directly (an
    /// internal client, paper §5.1). Off: always go through the fabric.
    pub internal: bool,
    /// DRAM cache of data pages read from remote stores, in MiB.
    pub cache_mib: u64,
    /// Pages asked for in the first delegated-allocation chunk; each further chunk
    /// asks for twice as many, up to [`MAX_CHUNK_REQUEST`] (a client that writes much
    /// asks the MDS rarely; one that writes little holds few pages).
    ///
    /// [`MAX_CHUNK_REQUEST`]: crate::alloc::MAX_CHUNK_REQUEST
    pub chunk_pages: u32,
    /// How long one request may take, in milliseconds.
    pub op_timeout_ms: u64,
    /// How long to keep trying to reconnect to a restarted MDS, in milliseconds.
    pub reconnect_ms: u64,
    /// A name for the MDS's logs (defaults to the process id: [`ClientConfig::shown_name`]).
    pub name: String,
    /// Connections ("lanes", each with its own state) a client opens at most, on
    /// first need: calls on different inodes run in parallel on different lanes, so
    /// this bounds how many threads of one process (a mount's request threads, a
    /// program under the preload library) the client serves at once. 1 to
    /// [`MAX_LANES`]. Each lane holds chunks of its own (the lanes share the largest
    /// chunk request); when a store runs short, idle lanes give their unused pages
    /// back.
    ///
    /// [`MAX_LANES`]: crate::fs::MAX_LANES
    pub lanes: usize,
    /// Lanes a client spreads inodes over at first (a power of two, at most
    /// `lanes`). A call that finds its inode's lane busy doubles them, so a
    /// single-threaded program keeps to one connection and a many-threaded one opens
    /// more as its threads meet.
    pub lanes_at_start: usize,
    /// Paths are the host's (the preload library's programs): resolution never
    /// leaves this file system. A symlink to an absolute path, or ".." above the
    /// root, fails with EXDEV, and the caller asks the kernel instead, which resolves
    /// it through the mount. Off (the native API): absolute symlink targets start at
    /// this file system's root. Set by the preload library, never by a
    /// configuration file.
    #[serde(skip)]
    pub host_paths: bool,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            mds: "127.0.0.1:7410".into(),
            consistency: "strong".into(),
            persistence: "pessimistic".into(),
            stage_ms: 10,
            internal: true,
            cache_mib: 256,
            chunk_pages: 256,
            op_timeout_ms: 30_000,
            reconnect_ms: 30_000,
            name: String::new(),
            lanes: 8,
            lanes_at_start: 1,
            host_paths: false,
        }
    }
}

impl ClientConfig {
    /// The name the MDS's logs show for this client.
    pub fn shown_name(&self) -> String {
        match self.name.is_empty() {
            true => format!("pid {}", std::process::id()),
            false => self.name.clone(),
        }
    }

    pub fn strong(&self) -> Result<bool, String> {
        match self.consistency.as_str() {
            "strong" => Ok(true),
            "weak" => Ok(false),
            other => Err(format!(
                "consistency {other:?}: expected \"strong\" or \"weak\""
            )),
        }
    }

    pub fn optimistic(&self) -> Result<bool, String> {
        match self.persistence.as_str() {
            "pessimistic" => Ok(false),
            "optimistic" => Ok(true),
            other => Err(format!(
                "persistence {other:?}: expected \"pessimistic\" or \"optimistic\""
            )),
        }
    }
}
