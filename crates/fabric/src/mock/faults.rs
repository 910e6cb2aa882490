//! What the mock fabric does to traffic: a seeded plan of faults for the whole
//! network, and the state of each link between two nodes.

/// What the mock does to traffic. Probabilities are per message or per completion.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// A SEND completes at the sender but never reaches the peer.
    pub drop_send: f64,
    /// A SEND reaches the peer with one byte flipped.
    pub corrupt_send: f64,
    /// A completion is held back for a few polls.
    pub delay: f64,
    /// Completions ready together are returned in random order.
    pub reorder: bool,
    /// A connection breaks when an operation is posted on it, as an RC queue pair
    /// goes to the error state: both ends see it closed, its work fails.
    pub break_conn: f64,
}

/// The state of the link between two nodes (domains that listen), set with
/// [`MockNet::set_link`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Link {
    /// Traffic flows (subject to the network's [`Faults`]).
    Up,
    /// A partition: an operation across it fails as a transport gives up on a peer
    /// that stopped answering (a timeout, not "gone": neither side can tell a cut from
    /// a stall), the connection breaks at both ends, and new connections across it
    /// time out.
    Cut,
    /// Connections across it break with this probability per operation, as an RC
    /// queue pair goes to the error state when its packets are lost for good: a
    /// reliable connection loses no message without breaking.
    Flaky(f64),
}
