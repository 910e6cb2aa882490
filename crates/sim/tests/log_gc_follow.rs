//! A client's cached copy of an inode follows the MDS's log GC (design note 76): the
//! GC's new log starts with the compacted state, then the entries of the commit that
//! set it off, and says so in its first page; a copy that ended where that commit
//! began walks only the entries after the compacted state, where it used to load the
//! whole inode again. Another client changes a directory and a file while this one
//! looks after every change (and writes the file now and then); what it sees is
//! checked against a model and the other client's attributes, and (debug builds)
//! every copy that followed is checked against a whole load of the new log.

use std::collections::BTreeSet;

use orion_client::{Client, OpenFlags};
use orion_sim::{ClientKind, Cluster, ClusterConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn seed() -> u64 {
    orion_sim::seed_or(20261125)
}

fn names(c: &Client, dir: &str) -> BTreeSet<String> {
    let listing = c.readdir(dir).unwrap().into_iter();
    (listing.map(|e| String::from_utf8(e.name).unwrap()))
        .filter(|n| n != "." && n != "..")
        .collect()
}

#[test]
fn a_cached_directory_and_file_follow_their_log_gc_instead_of_loading_again() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cluster = Cluster::start(ClusterConfig::default()).unwrap();
    let (looker, changer) = (
        cluster.client(ClientKind::EXTERNAL).unwrap(),
        cluster.client(ClientKind::EXTERNAL).unwrap(),
    );

    // A directory of 80 names, changed one name at a time.
    changer.mkdir("/d", 0o755).unwrap();
    let mut model = BTreeSet::new();
    let mut next = 0u32;
    let mut add = |model: &mut BTreeSet<String>| {
        let name = format!("f{next}");
        next += 1;
        let fd = changer.open(&format!("/d/{name}"), OpenFlags::create(), 0o644);
        changer.close(fd.unwrap()).unwrap();
        model.insert(name);
    };
    for _ in 0..80 {
        add(&mut model);
    }
    assert_eq!(names(&looker, "/d"), model);
    let before = looker.stats();
    for step in 0..600 {
        if rng.gen_bool(0.5) && !model.is_empty() {
            let k = rng.gen_range(0..model.len());
            let name = model.iter().nth(k).unwrap().clone();
            changer.unlink(&format!("/d/{name}")).unwrap();
            model.remove(&name);
        } else {
            add(&mut model);
        }
        let at = format!("step {step}, ORION_SEED={seed}");
        assert_eq!(names(&looker, "/d"), model, "{at}");
        let attrs = (looker.stat("/d").unwrap(), changer.stat("/d").unwrap());
        assert_eq!(attrs.0, attrs.1, "{at}");
    }
    let after = looker.stats();
    let follows = after.gc_follows - before.gc_follows;
    assert!(
        follows >= 3,
        "the directory's log was compacted several times, and the copy followed: \
         {follows} ({after:?})"
    );
    assert_eq!(
        (after.rebuilds, after.loads),
        (before.rebuilds, before.loads),
        "a copy that saw every change never loads the directory again ({after:?})"
    );

    // A file of 16 pages, overwritten a page at a time, mostly by the other client;
    // some GCs run inside the looker's own commits.
    let fd = changer
        .open("/file", OpenFlags::read_write_create(), 0o644)
        .unwrap();
    let mut content = vec![0u8; 16 * 4096];
    rng.fill(&mut content[..]);
    changer.pwrite(fd, 0, &content).unwrap();
    let mine = looker
        .open("/file", OpenFlags::read_write_create(), 0)
        .unwrap();
    assert_eq!(looker.pread(mine, 0, content.len()).unwrap(), content);
    let before = looker.stats();
    for step in 0..400 {
        let page = rng.gen_range(0..16usize);
        let bytes: Vec<u8> = (0..4096).map(|_| rng.gen()).collect();
        let (writer, its_fd) = match rng.gen_bool(0.25) {
            true => (&looker, mine),
            false => (&changer, fd),
        };
        writer.pwrite(its_fd, (page * 4096) as u64, &bytes).unwrap();
        content[page * 4096..(page + 1) * 4096].copy_from_slice(&bytes);
        let at = format!("step {step}, ORION_SEED={seed}");
        let got = looker.pread(mine, 0, content.len()).unwrap();
        assert!(got == content, "{at}: the file reads back wrong");
        let attrs = (
            looker.stat("/file").unwrap(),
            changer.stat("/file").unwrap(),
        );
        assert_eq!(attrs.0, attrs.1, "{at}");
    }
    let after = looker.stats();
    assert!(
        after.gc_follows - before.gc_follows >= 3,
        "the file's log was compacted several times, and the copy followed ({after:?})"
    );
    assert_eq!(
        (after.rebuilds, after.loads),
        (before.rebuilds, before.loads),
        "{after:?}"
    );
    looker.close(mine).unwrap();
    changer.close(fd).unwrap();
    drop((looker, changer));
    cluster.stop().unwrap();
}
