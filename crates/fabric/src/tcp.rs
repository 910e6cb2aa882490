//! The TCP bootstrap shared by the local and libfabric backends: listening, connecting, and
//! the liveness check. The bootstrap stream carries the handshake, then stays open for the
//! connection's lifetime: when the peer's process dies, the kernel closes it, which is how a
//! peer's death is noticed without any traffic.

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

pub(crate) fn listen(addr: &str) -> Result<TcpListener> {
    let l = TcpListener::bind(addr).map_err(|e| Error::io(format!("listening on {addr}"), e))?;
    l.set_nonblocking(true)
        .map_err(|e| Error::io("listener", e))?;
    Ok(l)
}

/// Waits up to `timeout` for one incoming connection. Reads and writes on the accepted
/// stream are bounded by `io_timeout` (the connect timeout), not by `timeout`: an acceptor
/// that waits a short `timeout` for a peer must still give a peer that is slow to set up its
/// endpoint (a loaded machine) the whole handshake deadline.
pub(crate) fn accept(
    l: &TcpListener,
    timeout: Duration,
    io_timeout: Duration,
) -> Result<(TcpStream, SocketAddr)> {
    let deadline = Instant::now() + timeout;
    loop {
        match l.accept() {
            Ok((s, a)) => {
                s.set_nonblocking(false)
                    .map_err(|e| Error::io("accepted stream", e))?;
                prepare(&s, io_timeout)?;
                return Ok((s, a));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::Timeout(timeout));
                }
                // Asleep until a peer connects. Several threads may wait on one
                // listener: all wake, one accepts, the others find nothing and sleep again.
                crate::readable::wait(l, left);
            }
            Err(e) => return Err(Error::io("accept", e)),
        }
    }
}

pub(crate) fn connect(addr: &str, timeout: Duration) -> Result<TcpStream> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| Error::io(format!("resolving {addr}"), e))?
        .collect();
    let mut last = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => {
                prepare(&s, timeout)?;
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    let e = last.unwrap_or_else(|| std::io::ErrorKind::NotFound.into());
    Err(Error::gone(addr, format!("cannot connect: {e}")))
}

fn prepare(s: &TcpStream, timeout: Duration) -> Result<()> {
    s.set_nodelay(true)
        .map_err(|e| Error::io("bootstrap stream", e))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| Error::io("bootstrap stream", e))?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| Error::io("bootstrap stream", e))
}

/// After the handshake: the stream only signals liveness from now on.
pub(crate) fn into_liveness(s: &TcpStream) -> Result<()> {
    s.set_nonblocking(true)
        .map_err(|e| Error::io("bootstrap stream", e))
}

/// False once the peer closed its end (or its process died).
pub(crate) fn peer_alive(s: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    match s.peek(&mut b) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
    }
}

/// A loopback port that is free now and that no outgoing connection will take: one
/// below the kernel's ephemeral range (`ip_local_port_range`), where the kernel never
/// picks a connection's local port. A service that must come back on the same port
/// (an MDS that restarts, a cluster started again) uses one of these; a port from the
/// ephemeral range can meanwhile become the local end of any connection on the host,
/// and the service then fails to listen (EADDRINUSE). Falls back to a kernel-chosen
/// port when the range leaves no room below it.
pub fn service_port() -> std::io::Result<u16> {
    const LOWEST: u16 = 10_000;
    let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    if first_ephemeral > LOWEST + 100 {
        use rand::Rng;
        let mut rng = rand::thread_rng();
        for _ in 0..200 {
            let port = rng.gen_range(LOWEST..first_ephemeral);
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An acceptor may wait a short time for a peer, but the stream it accepts must wait for a
    /// slow peer as long as the handshake may take (a loaded machine starting many
    /// clients at once once failed here).
    #[test]
    fn accepted_stream_waits_for_the_io_timeout_not_the_poll_timeout() {
        let l = listen("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let c = connect(&addr, Duration::from_secs(5)).unwrap();
        let (s, _) = accept(&l, Duration::from_millis(50), Duration::from_secs(7)).unwrap();
        assert_eq!(s.read_timeout().unwrap(), Some(Duration::from_secs(7)));
        assert_eq!(s.write_timeout().unwrap(), Some(Duration::from_secs(7)));
        drop(c);
    }

    #[test]
    fn a_service_port_is_free_and_below_the_ephemeral_range() {
        let first_ephemeral: u16 =
            std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap();
        for _ in 0..20 {
            let port = super::service_port().unwrap();
            // (A range that leaves no room below it gets a port the kernel picks.)
            if first_ephemeral > 10_100 {
                assert!(port < first_ephemeral, "{port} is in the ephemeral range");
            }
            std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        }
    }
}
