//! `orion top`: a live view of a cluster from its daemons' `/metrics` endpoints (the
//! addresses `orion up` records in `cluster.json`), refreshed every second: per node,
//! requests per second (and the busiest kinds), latency percentiles of the last
//! interval, pool and inode use, connections, the epoch; per store, whether it is
//! joined, its clients and its resync; per mount, its calls the way the MDS's
//! requests are shown, the bytes it moved and its commits. A terminal gets a full-screen table (ratatui;
//! `q` quits); anything else, or `--once`, gets one plain table.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use prometheus_parse::{Scrape, Value};

use crate::status::UpState;

#[derive(Args, Debug)]
pub struct TopArgs {
    /// State directory of the `orion up` to watch (default: its default).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print one table (rates over one interval) and exit.
    #[arg(long)]
    pub once: bool,
    /// Refresh interval, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u64,
}

/// A daemon with a metrics endpoint.
struct Node {
    name: String,
    kind: Kind,
    addr: String,
}

#[derive(PartialEq)]
enum Kind {
    Mds,
    Store,
    /// A mount: its client's counters.
    Client,
}

/// What one scrape of every node gave (None: the node did not answer).
type Snapshot = Vec<Option<Scrape>>;

fn nodes(up: &UpState) -> Vec<Node> {
    let mdss = match up.mdss.is_empty() {
        true => std::slice::from_ref(&up.mds),
        false => &up.mdss[..],
    };
    let mut v: Vec<Node> = mdss
        .iter()
        .map(|m| Node {
            name: match m.name.as_str() {
                "" => "mds".into(),
                n => n.into(),
            },
            kind: Kind::Mds,
            addr: m.metrics.clone(),
        })
        .collect();
    v.extend(up.stores.iter().map(|s| Node {
        name: format!("ds {}.{}", s.group, s.index),
        kind: Kind::Store,
        addr: s.metrics.clone(),
    }));
    if !up.mount_metrics.is_empty() {
        v.push(Node {
            name: "mount".into(),
            kind: Kind::Client,
            addr: up.mount_metrics.clone(),
        });
    }
    v
}

/// GET /metrics from `addr`, parsed (an error for a node that does not answer soon).
fn scrape(addr: &str) -> Result<Scrape> {
    let sa: std::net::SocketAddr = addr.parse().context("a metrics address")?;
    let mut s = std::net::TcpStream::connect_timeout(&sa, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_millis(1000)))?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut page = String::new();
    s.read_to_string(&mut page)?;
    let body = page.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok(Scrape::parse(body.lines().map(|l| Ok(l.to_string())))?)
}

/// Every node scraped at once: a node that is down (its socket kept by `orion up`
/// while it starts again: the scrape times out) costs one timeout, not one each.
fn snapshot(nodes: &[Node]) -> Snapshot {
    std::thread::scope(|s| {
        let scrapes: Vec<_> = (nodes.iter())
            .map(|n| s.spawn(|| (!n.addr.is_empty()).then(|| scrape(&n.addr).ok()).flatten()))
            .collect();
        (scrapes.into_iter())
            .map(|h| h.join().ok().flatten())
            .collect()
    })
}

/// The sum of a counter or gauge over the samples named `name` whose labels include
/// `labels`.
fn sum(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    (s.samples.iter())
        .filter(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(v)))
        .map(|x| match &x.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            _ => 0.0,
        })
        .sum::<f64>()
        + 0.0 // an empty sum is -0.0
}

/// A counter's value by one of its labels (requests by `kind`, calls by `call`).
fn by_label(s: &Scrape, counter: &str, label: &str) -> HashMap<String, f64> {
    let mut m = HashMap::new();
    for x in s.samples.iter().filter(|x| x.metric == counter) {
        if let (Some(k), Value::Counter(v) | Value::Untyped(v)) = (x.labels.get(label), &x.value) {
            *m.entry(k.to_string()).or_insert(0.0) += v;
        }
    }
    m
}

/// A time histogram summed over every label: (upper bound, cumulative count).
fn latency(s: &Scrape, hist: &str) -> Vec<(f64, f64)> {
    let mut acc: Vec<(f64, f64)> = Vec::new();
    for x in s.samples.iter().filter(|x| x.metric == hist) {
        if let Value::Histogram(h) = &x.value {
            for b in h {
                match acc.iter_mut().find(|(le, _)| *le == b.less_than) {
                    Some(e) => e.1 += b.count,
                    None => acc.push((b.less_than, b.count)),
                }
            }
        }
    }
    acc.sort_by(|a, b| a.0.total_cmp(&b.0));
    acc
}

/// What a node did between two scrapes of the same run: operations per second in
/// all, the busiest kinds, and the p50 and p99 of their times.
struct Busy {
    total: f64,
    busiest: String,
    p50: String,
    p99: String,
}

/// [`Busy`] from a counter by `label` and a time histogram; None when the counter
/// went back (the node restarted in between: no rate).
fn busy(a: &Scrape, b: &Scrape, secs: f64, counter: &str, label: &str, hist: &str) -> Option<Busy> {
    let (ka, kb) = (by_label(a, counter, label), by_label(b, counter, label));
    if ka.values().sum::<f64>() < kb.values().sum::<f64>() {
        return None;
    }
    let mut kinds: Vec<(String, f64)> = ka
        .iter()
        .map(|(k, v)| (k.clone(), (v - kb.get(k).copied().unwrap_or(0.0)) / secs))
        .filter(|(_, r)| *r > 0.0)
        .collect();
    kinds.sort_by(|x, y| y.1.total_cmp(&x.1));
    let busiest = (kinds.iter().take(3))
        .map(|(k, r)| format!("{k} {}", rate(*r)))
        .collect::<Vec<_>>()
        .join(", ");
    let (la, lb) = (latency(a, hist), latency(b, hist));
    Some(Busy {
        total: kinds.iter().map(|k| k.1).sum::<f64>() + 0.0,
        busiest: if busiest.is_empty() {
            "-".into()
        } else {
            busiest
        },
        p50: micros(quantile(&lb, &la, 0.5)),
        p99: micros(quantile(&lb, &la, 0.99)),
    })
}

/// The `q` quantile of what fell into a cumulative histogram between two scrapes
/// (the upper bound of its bucket), or None with nothing in between.
fn quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|&(le, n)| {
            let was = before.iter().find(|b| b.0 == le).map_or(0.0, |b| b.1);
            (le, n - was)
        })
        .collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    delta
        .iter()
        .find(|(_, n)| *n >= q * total)
        .map(|(le, _)| *le)
}

/// An MDS's epoch, and its lease when it is the primary.
fn mds_state(s: &Scrape) -> String {
    let epoch = sum(s, "orion_mds_epoch", &[]);
    match sum(s, "orion_mds_lease_seconds_left", &[]) {
        left if left > 0.0 => format!("epoch {epoch}, lease {left:.1} s"),
        _ => format!("epoch {epoch}"),
    }
}

fn micros(s: Option<f64>) -> String {
    match s {
        None => "-".into(),
        Some(x) if x.is_infinite() => "slow".into(),
        Some(x) if x < 1e-3 => format!("{:.0} µs", x * 1e6),
        Some(x) => format!("{:.1} ms", x * 1e3),
    }
}

fn rate(n: f64) -> String {
    match n {
        n if n.is_nan() => "-".into(),
        n if n >= 1e6 => format!("{:.1}M/s", n / 1e6),
        n if n >= 1e3 => format!("{:.1}k/s", n / 1e3),
        n => format!("{n:.0}/s"),
    }
}

fn pct(used: f64, total: f64) -> String {
    match total > 0.0 {
        true => format!("{:.1} %", used / total * 100.0),
        false => "-".into(),
    }
}

const HEADER: [&str; 8] = [
    "node",
    "state",
    "ops",
    "busiest",
    "p50",
    "p99",
    "used / moved",
    "peers / commits",
];

/// The table's rows, from two snapshots `secs` apart.
fn rows(nodes: &[Node], before: &Snapshot, after: &Snapshot, secs: f64) -> Vec<[String; 8]> {
    let mut out = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let (Some(a), b) = (&after[i], before[i].as_ref()) else {
            out.push([
                n.name.clone(),
                if n.addr.is_empty() {
                    "no metrics"
                } else {
                    "down"
                }
                .into(),
                "".into(),
                "".into(),
                "".into(),
                "".into(),
                "".into(),
                "".into(),
            ]);
            continue;
        };
        if n.kind == Kind::Client {
            // No earlier scrape, or a restart (counters went back): no rate.
            let per_s = |name: &str| match b {
                Some(b) if sum(a, name, &[]) >= sum(b, name, &[]) => {
                    (sum(a, name, &[]) - sum(b, name, &[])) / secs
                }
                _ => f64::NAN,
            };
            let calls = b.and_then(|b| {
                let (count, hist) = (
                    "orion_client_call_seconds_count",
                    "orion_client_call_seconds",
                );
                busy(a, b, secs, count, "call", hist)
            });
            let calls = calls.unwrap_or(Busy {
                total: f64::NAN,
                busiest: "-".into(),
                p50: "-".into(),
                p99: "-".into(),
            });
            let mib = |name: &str| match per_s(name) {
                r if r.is_nan() => "-".to_string(),
                r => format!("{:.1} MiB/s", r / (1 << 20) as f64),
            };
            out.push([
                n.name.clone(),
                "up".into(),
                rate(calls.total),
                calls.busiest,
                calls.p50,
                calls.p99,
                format!(
                    "read {}, wrote {}",
                    mib("orion_client_read_bytes_total"),
                    mib("orion_client_written_bytes_total")
                ),
                format!("{} commits", rate(per_s("orion_client_commits_total"))),
            ]);
            continue;
        }
        if n.kind == Kind::Store {
            let state = match (
                sum(a, "orion_ds_joined", &[]),
                sum(a, "orion_ds_resync_running", &[]),
            ) {
                (_, r) if r > 0.0 => "resyncing",
                (j, _) if j > 0.0 => "up",
                _ => "not joined",
            };
            let copied = b.map_or(0.0, |b| {
                sum(a, "orion_ds_resync_pages_total", &[])
                    - sum(b, "orion_ds_resync_pages_total", &[])
            });
            out.push([
                n.name.clone(),
                state.into(),
                match copied > 0.0 {
                    true => format!("resync {}", rate(copied / secs)),
                    false => "-".into(),
                },
                "".into(),
                "".into(),
                "".into(),
                format!(
                    "{:.0} MiB",
                    sum(a, "orion_ds_pool_bytes", &[]) / (1 << 20) as f64
                ),
                format!("{:.0}", sum(a, "orion_ds_clients", &[])),
            ]);
            continue;
        }
        // Rates need an earlier scrape of the same run of the daemon: none (it was
        // down) or counters that went back (it restarted) show no rate.
        let requests = b.as_ref().and_then(|b| {
            let (count, hist) = ("orion_mds_requests_total", "orion_mds_request_seconds");
            busy(a, b, secs, count, "kind", hist)
        });
        let Some(requests) = requests else {
            out.push([
                n.name.clone(),
                mds_state(a),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "".into(),
                "".into(),
            ]);
            continue;
        };
        let pages = sum(a, "orion_mds_data_pages", &[]);
        let free = sum(a, "orion_mds_data_pages_free", &[]);
        let inodes = sum(a, "orion_mds_inodes", &[]);
        let ifree = sum(a, "orion_mds_inodes_free", &[]);
        let logs = sum(a, "orion_mds_log_pages", &[]);
        let lfree = sum(a, "orion_mds_log_pages_free", &[]);
        out.push([
            n.name.clone(),
            mds_state(a),
            rate(requests.total),
            requests.busiest,
            requests.p50,
            requests.p99,
            format!(
                "{} (inodes {}, logs {})",
                pct(pages - free, pages),
                pct(inodes - ifree, inodes),
                pct(logs - lfree, logs)
            ),
            format!(
                "{:.0} clients, {:.0} stores",
                sum(a, "orion_mds_connections", &[("role", "client")]),
                sum(a, "orion_mds_connections", &[("role", "store")])
            ),
        ]);
    }
    out
}

fn plain(title: &str, rows: &[[String; 8]]) -> String {
    let mut w = HEADER.map(str::len);
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let parts: Vec<String> = (cells.iter().enumerate())
            .map(|(i, c)| format!("{c:<width$}", width = w[i]))
            .collect();
        parts.join("  ").trim_end().to_string()
    };
    let mut out = format!("{title}\n");
    out += &line(&HEADER.map(String::from));
    out.push('\n');
    for r in rows {
        out += &line(r);
        out.push('\n');
    }
    out
}

pub fn top(a: TopArgs) -> Result<()> {
    let state = match &a.dir {
        Some(d) => d.clone(),
        None => crate::up::default_state_dir()?,
    };
    let up = UpState::load(&state)?;
    let nodes = nodes(&up);
    let interval = Duration::from_millis(a.interval_ms.max(100));
    let title = |secs: f64| {
        format!(
            "orion top: {} ({} nodes), rates over {secs:.1} s",
            state.display(),
            nodes.len()
        )
    };
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut before = snapshot(&nodes);
    let mut at = Instant::now();
    if a.once || !tty {
        std::thread::sleep(interval);
        let after = snapshot(&nodes);
        let secs = at.elapsed().as_secs_f64();
        print!(
            "{}",
            plain(&title(secs), &rows(&nodes, &before, &after, secs))
        );
        return Ok(());
    }
    use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
    use ratatui::layout::Constraint;
    use ratatui::style::{Modifier, Style};
    use ratatui::widgets::{Block, Row, Table};
    let mut terminal = ratatui::init();
    let mut shown = rows(&nodes, &before, &before, 1.0);
    let mut secs = 0.0;
    let result = loop {
        let table = Table::new(
            shown.iter().map(|r| Row::new(r.clone())),
            [
                Constraint::Length(8),
                Constraint::Length(22),
                Constraint::Length(14),
                Constraint::Min(24),
                Constraint::Length(8),
                Constraint::Length(8),
                Constraint::Length(40),
                Constraint::Length(22),
            ],
        )
        .header(Row::new(HEADER).style(Style::new().add_modifier(Modifier::BOLD)))
        .block(Block::bordered().title(format!("{} (q quits)", title(secs))));
        if let Err(e) = terminal.draw(|f| f.render_widget(table, f.area())) {
            break Err(e.into());
        }
        let left = interval.saturating_sub(at.elapsed());
        match event::poll(left) {
            Ok(true) => match event::read() {
                Ok(Event::Key(k)) if k.kind == KeyEventKind::Press => {
                    let ctrl_c =
                        k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c {
                        break Ok(());
                    }
                }
                Ok(_) => {}
                Err(e) => break Err(e.into()),
            },
            Ok(false) => {
                let after = snapshot(&nodes);
                secs = at.elapsed().as_secs_f64();
                shown = rows(&nodes, &before, &after, secs);
                before = after;
                at = Instant::now();
            }
            Err(e) => break Err(e.into()),
        }
    };
    ratatui::restore();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_what_fell_between_two_scrapes() {
        let before = [
            (1e-6, 10.0),
            (1e-5, 10.0),
            (1e-4, 10.0),
            (f64::INFINITY, 10.0),
        ];
        let after = [
            (1e-6, 10.0),
            (1e-5, 100.0),
            (1e-4, 109.0),
            (f64::INFINITY, 110.0),
        ];
        assert_eq!(quantile(&before, &after, 0.5), Some(1e-5));
        assert_eq!(quantile(&before, &after, 0.99), Some(1e-4));
        assert_eq!(quantile(&after, &after, 0.5), None);
    }

    #[test]
    fn figures_read_as_people_read_them() {
        assert_eq!(rate(1500.0), "1.5k/s");
        assert_eq!(rate(12.0), "12/s");
        assert_eq!(micros(Some(2.5e-6)), "2 µs");
        assert_eq!(micros(Some(0.0125)), "12.5 ms");
        assert_eq!(pct(1.0, 4.0), "25.0 %");
    }
}
