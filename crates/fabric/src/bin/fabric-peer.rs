//! fabric-peer: runs the echo peer (`--listen`) or probes one (`--probe`). Used by the fabric's
//! multi-process and network-namespace tests; a handy check between two hosts, too.
//!
//! fabric-peer --backend local|libfabric [--provider P] [--address IP] --secret-file F
//!             (--listen HOST:PORT [--busy] | --probe HOST:PORT)

use std::net::IpAddr;
use std::path::PathBuf;

use orion_fabric::echo::{probe, serve, ServeOptions};
use orion_fabric::{Backend, Domain, FabricConfig, Secret};

fn main() {
    if let Err(e) = run() {
        eprintln!("fabric-peer: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let (mut backend, mut provider, mut address, mut secret, mut listen, mut probe_addr, mut busy) =
        (None, None, None, None, None, None, false);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--backend" => backend = Some(val()?),
            "--provider" => provider = Some(val()?),
            "--address" => address = Some(val()?.parse::<IpAddr>().map_err(|e| e.to_string())?),
            "--secret-file" => secret = Some(PathBuf::from(val()?)),
            "--listen" => listen = Some(val()?),
            "--probe" => probe_addr = Some(val()?),
            "--busy" => busy = true,
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    let backend = match backend.as_deref() {
        Some("local") => Backend::Local,
        Some("libfabric") => Backend::Libfabric,
        other => {
            return Err(format!(
                "--backend must be local or libfabric, not {other:?}"
            ))
        }
    };
    let secret = Secret::from_file(&secret.ok_or("--secret-file is required")?)
        .map_err(|e| e.to_string())?;
    let mut cfg = FabricConfig::new(backend, secret);
    if let Some(p) = provider {
        cfg.provider = p;
    }
    if let Some(a) = address {
        cfg.address = a;
    }
    let domain = Domain::open(cfg).map_err(|e| e.to_string())?;
    if let Some(addr) = probe_addr {
        println!("{}", probe(&domain, &addr).map_err(|e| e.to_string())?);
        return Ok(());
    }
    let listener = domain
        .listen(&listen.ok_or("--listen or --probe is required")?)
        .map_err(|e| e.to_string())?;
    println!("listening {}", listener.local_addr());
    use std::io::Write;
    std::io::stdout().flush().ok();
    serve(
        &domain,
        &listener,
        &ServeOptions {
            region_len: 8 << 20,
            busy,
        },
    )
    .map_err(|e| e.to_string())
}
