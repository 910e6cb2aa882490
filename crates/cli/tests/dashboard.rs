//! The Grafana dashboard in `ops/` is valid JSON with panels that query Prometheus,
//! and every metric its queries name is one the MDS, a data store or a mount exports (as
//! their registries encode them: a counter as `NAME_total`, a histogram as
//! `NAME_bucket`, `_sum` and `_count`).

use std::collections::HashSet;

const DASHBOARD: &str = include_str!("../../../ops/grafana-dashboard.json");

/// Every sample name the daemons' registries can produce.
fn exported() -> HashSet<String> {
    let mut text = String::new();
    let mds = orion_mds::MdsMetrics::default();
    let ds = orion_ds::DsMetrics::default();
    prometheus_client::encoding::text::encode(&mut text, &mds.registry()).unwrap();
    prometheus_client::encoding::text::encode(&mut text, &ds.registry()).unwrap();
    let mount = orion_fuse::metrics::registry_of(Default::default, Default::default());
    prometheus_client::encoding::text::encode(&mut text, &mount).unwrap();
    let mut names = HashSet::new();
    for line in text.lines() {
        let mut w = line.split_whitespace();
        if (w.next(), w.next()) != (Some("#"), Some("TYPE")) {
            continue;
        }
        let (name, kind) = (w.next().unwrap(), w.next().unwrap());
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    names
}

/// The `orion_...` metric names in a PromQL expression.
fn named(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("orion_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

#[test]
fn the_dashboard_parses_and_names_only_exported_metrics() {
    let d: serde_json::Value = serde_json::from_str(DASHBOARD).expect("valid JSON");
    assert_eq!(d["uid"], "orionfs");
    let panels = d["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8, "{} panels", panels.len());
    let exported = exported();
    let mut seen = HashSet::new();
    for p in panels {
        let title = p["title"].as_str().expect("a title");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for t in targets {
            let expr = t["expr"].as_str().expect("an expr");
            let names = named(expr);
            assert!(!names.is_empty(), "{title}: {expr} names no metric");
            for n in names {
                assert!(
                    exported.contains(&n),
                    "{title}: {n} is not exported ({expr})"
                );
                seen.insert(n);
            }
        }
    }
    // The dashboard shows both kinds of daemon.
    assert!(seen.iter().any(|n| n.starts_with("orion_mds_")));
    assert!(seen.iter().any(|n| n.starts_with("orion_ds_")));
    assert!(seen.iter().any(|n| n.starts_with("orion_client_")));
}

#[test]
fn metric_names_are_found_in_expressions() {
    assert_eq!(
        named("sum by (le) (rate(orion_mds_request_seconds_bucket[1m])) / orion_ds_clients"),
        ["orion_mds_request_seconds_bucket", "orion_ds_clients"]
    );
}
