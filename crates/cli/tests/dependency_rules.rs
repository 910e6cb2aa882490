//! The workspace's dependency rules (docs/design.md, "Crates and the rules between
//! them"), checked against `cargo metadata` so a change that breaks one fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Each crate, and the OrionFS crates it may depend on (normal and build
/// dependencies; test-only dependencies are free).
const RULES: &[(&str, &[&str])] = &[
    // The media and the transport know nothing above them; the transport copies
    // bytes in and out of its registered memory as pools do (`orion_pmem::copy`).
    ("orion-pmem", &[]),
    ("orion-format", &[]),
    ("orion-fabric", &["orion-pmem"]),
    // How far long work has come: a bar or log lines, for any crate above.
    ("orion-progress", &[]),
    // The cluster manager speaks to etcd, and knows nothing of the file system (its
    // epoch file is written as the pools' side files are).
    ("orion-manager", &["orion-pmem"]),
    // The metadata engine knows no network.
    ("orion-meta", &["orion-pmem", "orion-format"]),
    // Message shapes: the media's types, the fabric's region keys, the engine's
    // attribute types; no server or client code.
    (
        "orion-proto",
        &["orion-format", "orion-fabric", "orion-meta"],
    ),
    // Servers and the client library never link each other; the MDS asks the cluster
    // manager for its role.
    (
        "orion-mds",
        &[
            "orion-pmem",
            "orion-format",
            "orion-meta",
            "orion-fabric",
            "orion-proto",
            "orion-manager",
            "orion-progress",
        ],
    ),
    (
        "orion-ds",
        &[
            "orion-pmem",
            "orion-format",
            "orion-fabric",
            "orion-proto",
            "orion-progress",
        ],
    ),
    (
        "orion-client",
        &[
            "orion-pmem",
            "orion-format",
            "orion-meta",
            "orion-fabric",
            "orion-proto",
        ],
    ),
    // Front-ends speak only to the client library.
    ("orion-fuse", &["orion-client"]),
    ("orion-preload", &["orion-client"]),
];

/// Crates that put the parts together (the binary, the simulator): anything goes.
const ASSEMBLERS: &[&str] = &["orion-cli", "orion-sim"];

fn workspace() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let mut crates = BTreeMap::new();
    for p in meta["packages"].as_array().expect("packages") {
        let name = p["name"].as_str().expect("name").to_string();
        let deps = p["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .filter(|d| d["kind"].as_str() != Some("dev"))
            .filter_map(|d| d["name"].as_str())
            .filter(|n| n.starts_with("orion-"))
            .map(str::to_string)
            .collect();
        crates.insert(name, deps);
    }
    crates
}

/// Every way `crates` breaks the rules.
fn violations(crates: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut broken = Vec::new();
    for (name, deps) in crates {
        if ASSEMBLERS.contains(&name.as_str()) {
            continue;
        }
        let Some((_, allowed)) = RULES.iter().find(|(n, _)| n == name) else {
            broken.push(format!(
                "{name} has no rule: add it to RULES and docs/design.md"
            ));
            continue;
        };
        for d in deps {
            if !allowed.contains(&d.as_str()) {
                broken.push(format!("{name} depends on {d}, which its rule forbids"));
            }
        }
    }
    broken
}

#[test]
fn every_crate_depends_only_on_what_the_rules_allow() {
    let crates = workspace();
    assert!(crates.contains_key("orion-meta"), "found {crates:?}");
    let broken = violations(&crates);
    assert!(
        broken.is_empty(),
        "dependency rules broken:\n{}",
        broken.join("\n")
    );
}

#[test]
fn a_front_end_that_links_server_code_or_an_unknown_crate_is_caught() {
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let mut crates = BTreeMap::new();
    crates.insert(
        "orion-fuse".to_string(),
        set(&["orion-client", "orion-meta"]),
    );
    crates.insert("orion-meta".to_string(), set(&["orion-fabric"]));
    crates.insert("orion-new".to_string(), set(&[]));
    crates.insert("orion-cli".to_string(), set(&["orion-mds", "orion-meta"]));
    let broken = violations(&crates);
    assert_eq!(broken.len(), 3, "{broken:?}");
    assert!(broken[0].contains("orion-fuse depends on orion-meta"));
    assert!(broken[1].contains("orion-meta depends on orion-fabric"));
    assert!(broken[2].contains("orion-new has no rule"));
}
