//! The cluster manager of one host: a lease service inside a process that outlives the
//! MDSs (`orion up`'s supervisor), reached over loopback TCP with one line per request.
//! It is one process, so it needs no consensus: it is as available as the host, which
//! is what a single-host cluster has anyway. The last epoch handed out, and the lease
//! it came with, are kept in a file written before the answer: a restarted service
//! never hands an epoch out twice, and hands none out until a lease granted before the
//! restart has surely ended (it no longer knows the holder, whose renewals then get
//! `lost`). Anything on the host may speak to it: it trusts the host, as the MDSs on it
//! trust each other's pools.
//!
//! Requests and answers (text, one line each, at most [`MAX_LINE`] bytes):
//! `acquire NAME ADDR TTL_MS` → `ok EPOCH` | `held` | `ineligible`; `renew EPOCH
//! TTL_MS` → `ok` | `lost`; `eligible EPOCH NAME,NAME` (or `-`) → `ok` | `lost`;
//! `eligible` → `eligible NAMES`; `end EPOCH NAME` → `ok` | `refused` (NAME is not
//! eligible, or EPOCH's term is over);
//! `primary` → `primary EPOCH NAME ADDR REMAINING_MS` | `none`; `resign EPOCH` → `ok`;
//! `map-save EPOCH MAP` → `ok` | `lost`; `map` → `map MAP` | `none` (a cluster map's
//! lines joined by `|`, kept in a file of its own beside the epoch's); anything else
//! → `error WHY`. Leases run by the service's clock from when it read the request; the
//! holder's [`Term::expires`] runs from before it sent it, so it ends first.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tracing::{info, warn};

use crate::{Manager, Primary, Term};

/// The longest request or answer line (a cluster map and a few words).
pub const MAX_LINE: usize = crate::MAX_MAP + 64;

struct Held {
    primary: Primary,
    until: Instant,
}

struct State {
    epoch: u64,
    /// Who may take the role ([`Manager::set_eligible`]; empty: anyone).
    eligible: Vec<String>,
    /// The TTL of the lease granted last, in milliseconds (kept with the epoch).
    ttl_ms: u64,
    /// MDSs the simulator has cut off ([`EmbeddedServer::cut_off`]).
    cut_off: Vec<String>,
    held: Option<Held>,
    /// After a restart: no role is handed out before then.
    quiet_until: Instant,
    file: PathBuf,
    /// The cluster map, its lines joined by `|`, as kept in `map_file`.
    map: Option<String>,
    map_file: PathBuf,
}

/// The longest lease granted (a restarted service waits this long before it grants).
pub const MAX_TTL: Duration = Duration::from_secs(60);

/// How long a connection may stay silent before the service closes it.
const IDLE: Duration = Duration::from_secs(120);

impl State {
    /// Writes what must survive a restart (the last epoch, the TTL of its lease, who
    /// may take the role) before an answer depends on it.
    fn save(&self, epoch: u64, ttl_ms: u64, eligible: &[String]) -> Result<(), String> {
        let names: Vec<&str> = eligible.iter().map(String::as_str).collect();
        let names = crate::names_record(&names).unwrap_or_else(|_| "-".into());
        let record = format!("{epoch} {ttl_ms} {names}\n");
        orion_pmem::replace_durably(&self.file, record.as_bytes())
            .map_err(|e| format!("recording epoch {epoch} in {}: {e}", self.file.display()))
    }

    fn current(&mut self, now: Instant) -> Option<&Held> {
        if self.held.as_ref().is_some_and(|h| h.until <= now) {
            let h = self.held.take().expect("checked");
            info!(
                "the primary role of {} (epoch {}) lapsed",
                h.primary.name, h.primary.epoch
            );
        }
        self.held.as_ref()
    }

    fn answer(&mut self, line: &str, now: Instant) -> String {
        let f: Vec<&str> = line.split_whitespace().collect();
        // A request of an MDS that is cut off never arrives: it names it (a role
        // asked for, a term ended as its mirror), or the epoch it holds (what only the
        // holder sends).
        let of_cut_off = !self.cut_off.is_empty()
            && match f.as_slice() {
                ["acquire", name, ..] | ["end", _, name] => self.cut_off.iter().any(|c| c == name),
                ["renew" | "eligible" | "resign" | "map-save", epoch, ..] => {
                    self.held.as_ref().is_some_and(|h| {
                        h.primary.epoch.to_string() == *epoch
                            && self.cut_off.contains(&h.primary.name)
                    })
                }
                _ => false,
            };
        if of_cut_off {
            return "error cut off from the cluster manager (simulated)".into();
        }
        match f.as_slice() {
            ["acquire", name, addr, ttl_ms] => {
                let Ok(ttl) = ttl_ms.parse::<u64>() else {
                    return "error the TTL is not a number of milliseconds".into();
                };
                if !(1..=MAX_TTL.as_millis() as u64).contains(&ttl) {
                    return format!("error the TTL must be 1 ms to {} s", MAX_TTL.as_secs());
                }
                if self.current(now).is_some() || now < self.quiet_until {
                    return "held".into();
                }
                if !self.eligible.is_empty() && !self.eligible.iter().any(|e| e == name) {
                    return "ineligible".into();
                }
                let Some(epoch) = self.epoch.checked_add(1) else {
                    return "error no epoch is left".into();
                };
                if let Err(e) = self.save(epoch, ttl, &[name.to_string()]) {
                    return format!("error {e}");
                }
                self.epoch = epoch;
                self.eligible = vec![name.to_string()];
                self.ttl_ms = ttl;
                let primary = Primary {
                    name: name.to_string(),
                    addr: addr.to_string(),
                    epoch,
                    remaining: None,
                };
                info!("{name} at {addr} is the primary, epoch {epoch}");
                self.held = Some(Held {
                    primary,
                    until: now + Duration::from_millis(ttl),
                });
                format!("ok {epoch}")
            }
            ["renew", epoch, ttl_ms] => {
                let (Ok(epoch), Ok(ttl)) = (epoch.parse::<u64>(), ttl_ms.parse::<u64>()) else {
                    return "error the epoch and TTL are numbers".into();
                };
                if !(1..=MAX_TTL.as_millis() as u64).contains(&ttl) {
                    return format!("error the TTL must be 1 ms to {} s", MAX_TTL.as_secs());
                }
                match self.current(now) {
                    Some(h) if h.primary.epoch == epoch => {}
                    _ => return "lost".into(),
                }
                if ttl > self.ttl_ms {
                    // A longer lease than the one on file: the file says so first.
                    if let Err(e) = self.save(self.epoch, ttl, &self.eligible) {
                        return format!("error {e}");
                    }
                    self.ttl_ms = ttl;
                }
                let h = self.held.as_mut().expect("current");
                h.until = now + Duration::from_millis(ttl);
                "ok".into()
            }
            ["eligible", epoch, names] => {
                let Ok(epoch) = epoch.parse::<u64>() else {
                    return "error the epoch is not a number".into();
                };
                match self.current(now) {
                    Some(h) if h.primary.epoch == epoch => {}
                    _ => return "lost".into(),
                };
                let listed = crate::parse_names(names);
                if listed.iter().any(|n| n.is_empty()) {
                    return "error empty MDS name".into();
                }
                if let Err(e) = self.save(epoch, self.ttl_ms, &listed) {
                    return format!("error {e}");
                }
                self.eligible = listed;
                info!("eligible for the primary role: {names}");
                "ok".into()
            }
            // The map has spaces of its own: it is the rest of the line.
            ["map-save", epoch, _, ..] => {
                let Ok(epoch) = epoch.parse::<u64>() else {
                    return "error the epoch is not a number".into();
                };
                let map = line.splitn(3, ' ').nth(2).unwrap_or("").trim();
                match self.current(now) {
                    Some(h) if h.primary.epoch == epoch => {}
                    _ => return "lost".into(),
                };
                let text = map.replace('|', "\n");
                if let Err(e) = crate::check_map(&text) {
                    return format!("error {e}");
                }
                if let Err(e) = orion_pmem::replace_durably(&self.map_file, text.as_bytes()) {
                    return format!("error recording the cluster map: {e}");
                }
                self.map = Some(map.to_string());
                "ok".into()
            }
            ["map"] => match &self.map {
                Some(m) => format!("map {m}"),
                None => "none".into(),
            },
            ["eligible"] => format!("eligible {}", {
                let names: Vec<&str> = self.eligible.iter().map(String::as_str).collect();
                crate::names_record(&names).unwrap_or_else(|_| "-".into())
            }),
            ["primary"] => match self.current(now) {
                Some(h) => format!(
                    "primary {} {} {} {}",
                    h.primary.epoch,
                    h.primary.name,
                    h.primary.addr,
                    h.until.saturating_duration_since(now).as_millis()
                ),
                None => "none".into(),
            },
            // The holder gives the role up: the role is free.
            ["resign", epoch] => {
                let Ok(epoch) = epoch.parse::<u64>() else {
                    return "error the epoch is not a number".into();
                };
                if self.current(now).is_some_and(|h| h.primary.epoch == epoch) {
                    self.held = None;
                    info!("the primary of epoch {epoch} resigned");
                }
                "ok".into()
            }
            // Its mirror saw it go, and is still eligible: the role is free.
            ["end", epoch, by] => {
                let Ok(epoch) = epoch.parse::<u64>() else {
                    return "error the epoch is not a number".into();
                };
                let holds = self.current(now).is_some_and(|h| h.primary.epoch == epoch);
                if !holds || !self.eligible.iter().any(|e| e == by) {
                    return "refused".into();
                }
                self.held = None;
                info!("the term of epoch {epoch} was ended by its mirror {by}");
                "ok".into()
            }
            _ => format!(
                "error unknown request {:?}",
                line.chars().take(64).collect::<String>()
            ),
        }
    }
}

/// The service, running on threads of its own until dropped.
pub struct EmbeddedServer {
    /// "127.0.0.1:port", where MDSs reach it.
    pub addr: String,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl EmbeddedServer {
    /// Serves on `listen` (port 0: any), keeping the last epoch in `epoch_file`.
    pub fn start(listen: &str, epoch_file: &Path) -> Result<EmbeddedServer> {
        let (epoch, last_ttl, eligible) = match std::fs::read_to_string(epoch_file) {
            Ok(t) => {
                let damaged = || format!("{} is damaged: {t:?}", epoch_file.display());
                let mut f = t.split_whitespace();
                let epoch: u64 = f.next().unwrap_or("").parse().with_context(damaged)?;
                let ttl: u64 = f.next().unwrap_or("0").parse().with_context(damaged)?;
                let eligible = crate::parse_names(f.next().unwrap_or("-"));
                (epoch, Duration::from_millis(ttl).min(MAX_TTL), eligible)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (0, Duration::ZERO, Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("{}", epoch_file.display())),
        };
        let map_file = epoch_file.with_extension("map");
        let map = match std::fs::read_to_string(&map_file) {
            Ok(t) => {
                crate::check_map(&t)
                    .with_context(|| format!("{} is damaged", map_file.display()))?;
                Some(t.lines().collect::<Vec<_>>().join("|"))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("{}", map_file.display())),
        };
        let listener =
            TcpListener::bind(listen).with_context(|| format!("listening on {listen}"))?;
        let addr = listener.local_addr()?.to_string();
        let state = Arc::new(Mutex::new(State {
            epoch,
            eligible,
            ttl_ms: last_ttl.as_millis() as u64,
            cut_off: Vec::new(),
            held: None,
            quiet_until: Instant::now() + last_ttl,
            file: epoch_file.to_path_buf(),
            map,
            map_file,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let kept = state.clone();
        let acceptor = std::thread::Builder::new()
            .name("manager".into())
            .spawn(move || {
                // Blocked in accept while idle; a drop wakes it with a connection of
                // its own.
                while !s.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok(_) if s.load(Ordering::Relaxed) => break,
                        Ok((conn, from)) => {
                            let (state, s) = (state.clone(), s.clone());
                            let _ = std::thread::Builder::new()
                                .name("manager-conn".into())
                                .spawn(move || {
                                    if let Err(e) = serve(conn, &state, &s) {
                                        warn!("cluster manager connection from {from}: {e:#}");
                                    }
                                });
                        }
                        Err(e) => {
                            warn!("cluster manager: accepting: {e}");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            })?;
        info!("embedded cluster manager on {addr}, last epoch {epoch}");
        Ok(EmbeddedServer {
            addr,
            state: kept,
            stop,
            acceptor: Some(acceptor),
        })
    }

    /// Fault injection for the simulator: from now on the requests of the MDS `name`
    /// (and of the epoch it holds) fail, as if it could not reach this service. A node
    /// the simulator kills is cut off its mock network, and this service is not on it.
    pub fn cut_off(&self, name: &str) {
        let mut st = self.state.lock().unwrap();
        st.cut_off.push(name.to_string());
    }

    /// Ends [`EmbeddedServer::cut_off`] for `name` (the MDS starts again).
    pub fn restore(&self, name: &str) {
        self.state.lock().unwrap().cut_off.retain(|n| n != name);
    }
}

impl Drop for EmbeddedServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.acceptor.take() {
            // The acceptor sleeps in accept: a connection wakes it to see the flag. If
            // none can be made, it is left to end with the process.
            if std::net::TcpStream::connect_timeout(
                &self.addr.parse().expect("a socket address"),
                Duration::from_secs(1),
            )
            .is_ok()
            {
                let _ = t.join();
            }
        }
    }
}

/// Answers the requests of one connection, until it closes or the service stops.
fn serve(conn: TcpStream, state: &Mutex<State>, stop: &AtomicBool) -> Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_millis(200)))?;
    conn.set_write_timeout(Some(Duration::from_secs(2)))?;
    conn.set_nodelay(true)?;
    let mut out = conn.try_clone()?;
    let mut reader = BufReader::new(conn);
    let mut line = Vec::new();
    let mut heard = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        // At most a line's worth (what a read cut by the timeout left stays).
        let room = (MAX_LINE + 1).saturating_sub(line.len()) as u64;
        match (&mut reader).take(room).read_until(b'\n', &mut line) {
            Ok(0) => return Ok(()), // closed (a line cut short is dropped)
            Ok(_) if line.ends_with(b"\n") => {}
            Ok(_) if line.len() > MAX_LINE => bail!("a request longer than {MAX_LINE} bytes"),
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if heard.elapsed() > IDLE {
                    return Ok(()); // a silent peer does not hold a thread forever
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        heard = Instant::now();
        let reply = match std::str::from_utf8(&line) {
            Ok(text) => state.lock().unwrap().answer(text.trim(), Instant::now()),
            Err(_) => "error the request is not text".to_string(),
        };
        out.write_all(format!("{reply}\n").as_bytes())?;
        line.clear();
    }
    Ok(())
}

/// An MDS's side of the embedded manager.
pub struct EmbeddedManager {
    addr: String,
    timeout: Duration,
    conn: Option<BufReader<TcpStream>>,
}

impl EmbeddedManager {
    /// Sends `request`; `ok` is true, `no` false, anything else an error.
    fn ask_yes_no(&mut self, request: &str, no: &str) -> Result<bool> {
        match self.call(request)?.as_str() {
            "ok" => Ok(true),
            answer if answer == no => Ok(false),
            other => bail!("the cluster manager answered {other:?}"),
        }
    }

    /// Reaches the service at `addr`; each call gives up after `timeout`.
    pub fn connect(addr: &str, timeout: Duration) -> Result<EmbeddedManager> {
        let mut m = EmbeddedManager {
            addr: addr.to_string(),
            timeout,
            conn: None,
        };
        m.call("primary")
            .map_err(|e| anyhow!("the cluster manager at {addr} does not answer: {e:#}"))?;
        Ok(m)
    }

    /// One request, one answer; a broken connection is opened again once.
    fn call(&mut self, req: &str) -> Result<String> {
        for attempt in 0..2 {
            if self.conn.is_none() {
                let a = self
                    .addr
                    .parse()
                    .with_context(|| format!("the manager address {:?}", self.addr))?;
                let c = TcpStream::connect_timeout(&a, self.timeout)?;
                c.set_read_timeout(Some(self.timeout))?;
                c.set_write_timeout(Some(self.timeout))?;
                c.set_nodelay(true)?;
                self.conn = Some(BufReader::new(c));
            }
            let conn = self.conn.as_mut().expect("opened");
            let mut answer = String::new();
            let r = conn
                .get_mut()
                .write_all(format!("{req}\n").as_bytes())
                .and_then(|()| conn.take(MAX_LINE as u64 + 1).read_line(&mut answer));
            match r {
                Ok(n) if n > 0 && answer.ends_with('\n') => {
                    let answer = answer.trim().to_string();
                    if let Some(why) = answer.strip_prefix("error ") {
                        bail!("the cluster manager refused {req:?}: {why}");
                    }
                    return Ok(answer);
                }
                // Whatever went wrong, a late answer must not be read as the next
                // request's: the connection goes.
                Ok(_) => self.conn = None,
                Err(e) => {
                    self.conn = None;
                    if attempt == 1 {
                        return Err(e.into());
                    }
                }
            }
        }
        bail!("the cluster manager at {} closed the connection", self.addr)
    }
}

impl Manager for EmbeddedManager {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    fn try_acquire(&mut self, name: &str, addr: &str, ttl: Duration) -> Result<Option<Term>> {
        crate::check_candidate(name, addr)?;
        let ms = ttl.as_millis().max(1);
        let asked = Instant::now();
        let answer = self.call(&format!("acquire {name} {addr} {ms}"))?;
        if answer == "held" || answer == "ineligible" {
            return Ok(None);
        }
        let epoch = answer
            .strip_prefix("ok ")
            .and_then(|e| e.parse().ok())
            .ok_or_else(|| anyhow!("the cluster manager answered {answer:?}"))?;
        Ok(Some(Term {
            epoch,
            expires: asked + ttl,
            lease: epoch as i64,
            ttl,
        }))
    }

    fn renew(&mut self, term: &mut Term) -> Result<bool> {
        let asked = Instant::now();
        let ms = term.ttl.as_millis().max(1);
        match self.call(&format!("renew {} {ms}", term.epoch))?.as_str() {
            "ok" => {
                term.expires = asked + term.ttl;
                Ok(true)
            }
            "lost" => Ok(false),
            other => bail!("the cluster manager answered {other:?}"),
        }
    }

    fn primary(&mut self) -> Result<Option<Primary>> {
        let answer = self.call("primary")?;
        if answer == "none" {
            return Ok(None);
        }
        let f: Vec<&str> = answer.split_whitespace().collect();
        match f.as_slice() {
            ["primary", e, name, addr, ms] => Ok(Some(Primary {
                epoch: e
                    .parse()
                    .map_err(|_| anyhow!("the cluster manager answered {answer:?}"))?,
                name: name.to_string(),
                addr: addr.to_string(),
                remaining: ms.parse().ok().map(Duration::from_millis),
            })),
            _ => bail!("the cluster manager answered {answer:?}"),
        }
    }

    fn resign(&mut self, term: Term) -> Result<()> {
        self.call(&format!("resign {}", term.epoch)).map(|_| ())
    }

    fn set_eligible(&mut self, term: &Term, names: &[&str]) -> Result<bool> {
        let record = crate::names_record(names)?;
        self.ask_yes_no(&format!("eligible {} {record}", term.epoch), "lost")
    }

    fn end_term(&mut self, epoch: u64, by: &str) -> Result<bool> {
        crate::names_record(&[by])?;
        self.ask_yes_no(&format!("end {epoch} {by}"), "refused")
    }

    fn save_map(&mut self, term: &Term, map: &str) -> Result<bool> {
        crate::check_map(map)?;
        let joined = map.lines().collect::<Vec<_>>().join("|");
        self.ask_yes_no(&format!("map-save {} {joined}", term.epoch), "lost")
    }

    fn map(&mut self) -> Result<Option<String>> {
        let answer = self.call("map")?;
        match (answer.as_str(), answer.strip_prefix("map ")) {
            ("none", _) => Ok(None),
            (_, Some(m)) => Ok(Some(m.split('|').map(|l| format!("{l}\n")).collect())),
            _ => bail!("the cluster manager answered {answer:?}"),
        }
    }

    fn eligible(&mut self) -> Result<Vec<String>> {
        let answer = self.call("eligible")?;
        match answer.strip_prefix("eligible ") {
            Some(r) => Ok(crate::parse_names(r)),
            None => bail!("the cluster manager answered {answer:?}"),
        }
    }
}
