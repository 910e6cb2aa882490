//! A full metadata pool (design note 74): the MDS's one loop never sleeps for room.
//! While the only free log pages are ones still in their grace period, it answers an
//! update EAGAIN at once, having changed nothing, and the client sends the update
//! again until the room is back; the program sees no error. With nothing left to
//! wait for, the program sees ENOSPC, and every acknowledged change is there.

use orion_client::{Client, OpenFlags};
use orion_pmem::Mode;
use orion_sim::{ClientKind, Cluster, ClusterConfig};

fn create(c: &Client, path: &str) -> orion_client::FsResult<()> {
    let flags = OpenFlags {
        read: true,
        write: true,
        create: true,
        excl: true,
        ..Default::default()
    };
    c.close(c.open(path, flags, 0o644)?)
}

/// Fills the MDS pool's log pages: a file `/big` whose log holds one live write
/// entry per page of it, then long names linked to files (as many per file as
/// links allow) until the MDS says there is no room. Returns the links made.
fn fill(c: &Client) -> Vec<String> {
    let fd = c
        .open("/big", OpenFlags::read_write_create(), 0o644)
        .unwrap();
    for i in 0..600u64 {
        c.pwrite(fd, i * 2 * 4096, &[i as u8; 4096]).unwrap();
    }
    c.close(fd).unwrap();
    let mut links = Vec::new();
    let mut target: Option<String> = None;
    for n in 0.. {
        let t = match &target {
            Some(t) => t.clone(),
            None => {
                let t = format!("/t{n}");
                match create(c, &t) {
                    Ok(()) => target.insert(t).clone(),
                    Err(e) => {
                        assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                        return links;
                    }
                }
            }
        };
        let name = format!("/{n:0>200}");
        match c.link(&t, &name) {
            Ok(_) => links.push(name),
            Err(e) if e.errno() == libc::EMLINK => target = None,
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                return links;
            }
        }
    }
    unreachable!()
}

/// The MDS's figure `name` as its `/metrics` would show it now (gauges are
/// refreshed every 200 ms: read after at least that long).
fn mds_figure(cluster: &Cluster, name: &str) -> f64 {
    std::thread::sleep(std::time::Duration::from_millis(250));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &cluster.mds_metrics.registry()).unwrap();
    let line = text.lines().find(|l| l.split(' ').next() == Some(name));
    let value = line
        .and_then(|l| l.split(' ').nth(1))
        .unwrap_or_else(|| panic!("{name}"));
    value.parse().unwrap()
}

/// A cluster whose 4 MiB MDS pool `fill` filled (stores of `store_mode`), restarted
/// with a grace period longer than any two calls apart, and its client.
fn full_cluster(store_mode: Mode) -> (Cluster, Client, Vec<String>) {
    let mut cluster = Cluster::start(ClusterConfig {
        seed: 74,
        mds_pool: 4 << 20,
        store_mode,
        ..Default::default()
    })
    .unwrap();
    let c = cluster.client(ClientKind::EXTERNAL).unwrap();
    let fd = c.open("/w", OpenFlags::read_write_create(), 0o644).unwrap();
    c.pwrite(fd, 0, &[1u8; 4096]).unwrap();
    c.close(fd).unwrap();
    let links = fill(&c);
    assert!(links.len() > 1000, "{} links filled the pool", links.len());
    // A link takes room in two logs, a create in one (a new inode's log fits its
    // first segment): long names take what is left.
    let full = (0..100)
        .find_map(|n| create(&c, &format!("/one-more{n:0>200}")).err())
        .expect("the pool fills");
    assert_eq!(full.errno(), libc::ENOSPC, "{full}");
    assert!(full.to_string().contains("no free log pages"), "{full}");
    // Pages `/big` frees stay in their grace period until well after the next call.
    cluster.cfg.grace_ms = 3000;
    cluster.restart_mds().unwrap();
    (cluster, c, links)
}

#[test]
fn a_create_on_a_full_mds_pool_waits_at_the_client_for_freed_log_pages() {
    let (mut cluster, c, links) = full_cluster(Mode::Volatile);
    c.unlink("/big").unwrap();
    let waits = c.stats().room_waits;
    let refusals = mds_figure(&cluster, "orion_mds_room_refusals_total");
    // The unlink's name took a page of the reserve: long names fill it, then the
    // next one needs one of /big's pages, still in their grace period. (A new
    // inode's log fits its first segment: only names take pages here.)
    let mut made = Vec::new();
    while c.stats().room_waits == waits {
        assert!(made.len() < 100, "no create of {} waited", made.len());
        let name = format!("/after{:0>200}", made.len());
        create(&c, &name).expect("the create waits for /big's log pages");
        made.push(name);
    }
    let counted = mds_figure(&cluster, "orion_mds_room_refusals_total") - refusals;
    assert!(counted >= 1.0, "the MDS counts its refusals: {counted}");
    let (pages, free) = (
        mds_figure(&cluster, "orion_mds_log_pages"),
        mds_figure(&cluster, "orion_mds_log_pages_free"),
    );
    assert!(
        pages > 0.0 && free < pages / 10.0,
        "a full pool: {free} of {pages} log pages free"
    );
    // Everything acknowledged is there, and another client sees it.
    let other = cluster.client(ClientKind::EXTERNAL).unwrap();
    for name in &made {
        assert!(other.stat(name).is_ok(), "{name}");
    }
    assert_eq!(other.stat("/big").unwrap_err().errno(), libc::ENOENT);
    for name in links.iter().step_by(97) {
        assert!(other.stat(name).is_ok(), "{name}");
    }
    drop((c, other));
    cluster.stop().unwrap();
}

/// A write's commit that needs a log page waits the same way, in strong mode on
/// stores that persist and report each page: each refusal uses up the pages'
/// notices, the next turn waits for the stores to be asked again, and every byte
/// written reads back.
#[test]
fn a_strong_write_on_a_full_mds_pool_waits_and_loses_nothing() {
    let (mut cluster, c, _) = full_cluster(Mode::Msync);
    c.unlink("/big").unwrap();
    let waits = c.stats().room_waits;
    let fd = c.open("/w", OpenFlags::read_write_create(), 0).unwrap();
    // One live entry per page: within a log page's worth, one commit needs a page.
    let mut pages = 1;
    while c.stats().room_waits == waits {
        assert!(pages < 200, "no commit of {pages} needed a log page");
        c.pwrite(fd, pages * 2 * 4096, &[pages as u8; 4096])
            .unwrap();
        pages += 1;
    }
    c.close(fd).unwrap();
    let other = cluster.client(ClientKind::EXTERNAL).unwrap();
    let fd = other.open("/w", OpenFlags::read(), 0).unwrap();
    for p in 0..pages {
        let want = if p == 0 { 1 } else { p as u8 };
        let got = other.pread(fd, p * 2 * 4096, 4096).unwrap();
        assert!(got.iter().all(|&b| b == want), "page {p}");
    }
    other.close(fd).unwrap();
    drop((c, other));
    cluster.stop().unwrap();
}
