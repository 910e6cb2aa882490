//! The `/metrics` endpoint of a daemon: the registry it counts into, encoded in the
//! Prometheus (OpenMetrics) text format, served over HTTP/1.0 on threads of its own.
//! A scrape reads atomics and never waits for the daemon's event loop.
//!
//! The server is a few lines over `std::net` rather than an HTTP crate: it answers
//! `GET /metrics` and nothing else, reads at most a few KiB of request head with a
//! time limit and never a body, and serves a bounded number of connections at once,
//! so no request (a huge Content-Length, a client that sends slowly or never reads)
//! can take memory from the daemon or hold up other scrapes for long.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Result};
use prometheus_client::registry::Registry;

/// The content type of the OpenMetrics text format, which Prometheus reads.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The most of a request read (its head; a body is never read).
const MAX_HEAD: usize = 8 << 10;
/// How long a connection may take to send its request, or to take the answer.
const IO_LIMIT: Duration = Duration::from_secs(2);
/// Connections served at once; more are closed at once.
const MAX_CONNECTIONS: usize = 8;

/// Serves `registry` at `http://LISTEN/metrics` from now on; returns the address bound
/// (port 0 in `listen`: a free one). `fd:N` is a listening socket this process was
/// handed as descriptor N (by `orion up`, which keeps the port across restarts and
/// so never lets another process take it in between).
pub fn start(listen: &str, registry: Arc<Registry>) -> Result<String> {
    let l = match listen.strip_prefix("fd:") {
        Some(n) => inherited(n)?,
        None => TcpListener::bind(listen).map_err(|e| {
            anyhow!(
                "the metrics endpoint cannot listen on {listen}: {e} (another process has \
                 the port? give another, or port 0 for any free one)"
            )
        })?,
    };
    let addr = l.local_addr()?.to_string();
    let busy = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for conn in l.incoming().flatten() {
                if busy.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                    busy.fetch_sub(1, Ordering::AcqRel);
                    continue; // dropped: closed
                }
                let (registry, mine) = (registry.clone(), busy.clone());
                let spawned = std::thread::Builder::new()
                    .name("metrics-conn".into())
                    .spawn(move || {
                        let _ = serve(conn, &registry);
                        mine.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    busy.fetch_sub(1, Ordering::AcqRel);
                }
            }
        })?;
    Ok(addr)
}

/// Reads one request head and answers it; the connection closes after.
fn serve(mut conn: TcpStream, registry: &Registry) -> std::io::Result<()> {
    conn.set_read_timeout(Some(IO_LIMIT))?;
    conn.set_write_timeout(Some(IO_LIMIT))?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let (method, target) = (words.next(), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = if method != Some("GET") || path != "/metrics" {
        (
            "404 Not Found",
            "text/plain",
            "only GET /metrics here\n".to_string(),
        )
    } else {
        let mut body = String::new();
        match prometheus_client::encoding::text::encode(&mut body, registry) {
            Ok(()) => ("200 OK", CONTENT_TYPE, body),
            Err(e) => (
                "500 Internal Server Error",
                "text/plain",
                format!("encoding the metrics: {e}\n"),
            ),
        }
    };
    write!(
        conn,
        "HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )?;
    conn.flush()
}

/// The listening socket handed over as descriptor `n`.
fn inherited(n: &str) -> Result<TcpListener> {
    use std::os::fd::FromRawFd;
    let fd: i32 = n
        .parse()
        .map_err(|_| anyhow!("the metrics endpoint's descriptor {n:?} is not a number"))?;
    // SAFETY: fcntl F_GETFD only reads the descriptor's flags; it fails on a closed one.
    if fd < 3 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        anyhow::bail!("the metrics endpoint's descriptor {fd} is not open");
    }
    // Checked before the descriptor is taken over: one that is something else (a
    // log, a pool's lock) stays its owner's, open.
    let mut listening: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `listening`, which is that
    // large; on a descriptor that is not a socket it fails and writes nothing.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut listening as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 || listening == 0 {
        anyhow::bail!("the metrics endpoint's descriptor {fd} is not a listening socket");
    }
    // SAFETY: the descriptor is an open listening socket (checked above), handed to
    // this process for this one use: nothing else in it owns or closes it.
    let l = unsafe { TcpListener::from_raw_fd(fd) };
    // SAFETY: fcntl on the descriptor `l` owns: not passed on to programs this
    // process starts.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    l.local_addr()
        .map_err(|e| anyhow!("the metrics endpoint's descriptor {fd}: {e}"))?;
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: &str, path: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn the_endpoint_serves_the_registry_and_nothing_else() {
        let mut r = Registry::default();
        let c = prometheus_client::metrics::counter::Counter::<u64>::default();
        r.register("things", "Things", c.clone());
        c.inc_by(7);
        let addr = start("127.0.0.1:0", Arc::new(r)).unwrap();
        let page = get(&addr, "/metrics");
        assert!(
            page.starts_with("HTTP/1.") && page.contains(" 200 "),
            "{page}"
        );
        assert!(page.contains("things_total 7"), "{page}");
        assert!(get(&addr, "/other").contains(" 404 "));
    }

    #[test]
    fn a_huge_or_silent_request_costs_nothing_and_blocks_no_other() {
        let addr = start("127.0.0.1:0", Arc::new(Registry::default())).unwrap();
        // A request announcing a terabyte of body: answered, the body never read.
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "POST /metrics HTTP/1.1\r\nContent-Length: 1000000000000\r\n\r\nxx"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.contains(" 404 "), "{out}");
        // A client that connects and says nothing does not hold up a scrape.
        let _silent = std::net::TcpStream::connect(&addr).unwrap();
        assert!(get(&addr, "/metrics").contains(" 200 "));
    }

    #[test]
    fn a_socket_handed_over_by_descriptor_is_served() {
        use std::os::fd::IntoRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let fd = l.into_raw_fd();
        let served = start(&format!("fd:{fd}"), Arc::new(Registry::default())).unwrap();
        assert_eq!(served, addr);
        assert!(get(&addr, "/metrics").contains(" 200 "));
        // A descriptor that is not open, or not a number, is a clear error.
        let e = start("fd:100000", Arc::new(Registry::default())).unwrap_err();
        assert!(format!("{e}").contains("not open"), "{e}");
        let e = start("fd:x", Arc::new(Registry::default())).unwrap_err();
        assert!(format!("{e}").contains("not a number"), "{e}");
        // A descriptor that is open but no listening socket is left open.
        let file = tempfile::tempfile().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let e = start(&format!("fd:{fd}"), Arc::new(Registry::default())).unwrap_err();
        assert!(format!("{e}").contains("not a listening socket"), "{e}");
        assert!(
            file.metadata().is_ok(),
            "the file was closed under its owner"
        );
    }

    #[test]
    fn a_port_in_use_is_named_in_the_error() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let e = start(&addr, Arc::new(Registry::default())).unwrap_err();
        assert!(format!("{e}").contains(&addr), "{e}");
    }
}
