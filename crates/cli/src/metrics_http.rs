//! The `/metrics` endpoint of a daemon: the registry it counts into, encoded in the
//! Prometheus (OpenMetrics) text format, over HTTP (tiny_http) on a thread of its own.
//! A scrape reads atomics and never waits for the daemon's event loop, so a scrape
//! during a shutdown is answered (or its connection closed with the process), never
//! left hanging.

use std::sync::Arc;

use anyhow::{anyhow, Result};
use prometheus_client::registry::Registry;

/// The content type of the OpenMetrics text format, which Prometheus reads.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `registry` at `http://LISTEN/metrics` from now on; returns the address bound
/// (port 0 in `listen`: a free one).
pub fn start(listen: &str, registry: Arc<Registry>) -> Result<String> {
    let server = tiny_http::Server::http(listen).map_err(|e| {
        anyhow!(
            "the metrics endpoint cannot listen on {listen}: {e} (another process has the \
             port? give another, or port 0 for any free one)"
        )
    })?;
    let addr = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| anyhow!("the metrics endpoint on {listen} has no IP address"))?
        .to_string();
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for req in server.incoming_requests() {
                let resp = answer(&req, &registry);
                let _ = req.respond(resp);
            }
        })?;
    Ok(addr)
}

fn answer(req: &tiny_http::Request, registry: &Registry) -> tiny_http::ResponseBox {
    let path = req.url().split('?').next().unwrap_or("");
    if *req.method() != tiny_http::Method::Get || path != "/metrics" {
        return tiny_http::Response::from_string("only GET /metrics here\n")
            .with_status_code(404)
            .boxed();
    }
    let mut body = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut body, registry) {
        return tiny_http::Response::from_string(format!("encoding the metrics: {e}\n"))
            .with_status_code(500)
            .boxed();
    }
    let ct = tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE).expect("a valid header");
    tiny_http::Response::from_string(body)
        .with_header(ct)
        .boxed()
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
    fn a_port_in_use_is_named_in_the_error() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let e = start(&addr, Arc::new(Registry::default())).unwrap_err();
        assert!(format!("{e}").contains(&addr), "{e}");
    }
}
