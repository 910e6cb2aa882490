//! A full metadata pool (design note 74): the MDS's one loop never sleeps for room.
//! While the only free log pages are ones still in their grace period, it answers an
//! update EAGAIN at once, having changed nothing, and the client sends the update
//! again until the room is back; the program sees no error. With nothing left to
//! wait for, the program sees ENOSPC, and every acknowledged change is there.

use orion_client::{Client, OpenFlags};
use orion_sim::{ClientKind, Cluster, ClusterConfig};

const EXTERNAL: ClientKind = ClientKind {
    internal: false,
    optimistic: false,
    weak: false,
};

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
        .open(
            "/big",
            OpenFlags {
                read: true,
                write: true,
                create: true,
                ..Default::default()
            },
            0o644,
        )
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

#[test]
fn a_create_on_a_full_mds_pool_waits_at_the_client_for_freed_log_pages() {
    let mut cluster = Cluster::start(ClusterConfig {
        seed: 74,
        mds_pool: 4 << 20,
        ..Default::default()
    })
    .unwrap();
    let c = cluster.client(EXTERNAL).unwrap();
    let links = fill(&c);
    assert!(links.len() > 1000, "{} links filled the pool", links.len());
    let full = create(&c, "/one-more").unwrap_err();
    assert_eq!(full.errno(), libc::ENOSPC, "{full}");
    // A grace period longer than any two calls apart: the pages `/big` frees stay
    // in it until well after the create below is first sent.
    cluster.cfg.grace_ms = 3000;
    cluster.restart_mds().unwrap();
    c.unlink("/big").unwrap();
    let waits = c.stats().room_waits;
    create(&c, "/after").expect("the create waits for /big's log pages");
    assert!(
        c.stats().room_waits > waits,
        "the MDS answered EAGAIN (it did not sleep the grace period out)"
    );
    // Everything acknowledged is there, and another client sees it.
    let other = cluster.client(EXTERNAL).unwrap();
    assert!(other.stat("/after").is_ok());
    assert_eq!(other.stat("/big").unwrap_err().errno(), libc::ENOENT);
    for name in links.iter().step_by(97) {
        assert!(other.stat(name).is_ok(), "{name}");
    }
    drop((c, other));
    cluster.stop().unwrap();
}
