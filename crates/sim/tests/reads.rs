//! Reads give what the file holds at every offset and length: pages cut at either
//! end, whole pages in between, holes, the end of the file, for internal (mapped
//! pool), external (one-sided reads, then cached) and optimistic (staged pages)
//! clients.

use orion_client::OpenFlags;
use orion_sim::{ClientKind, Cluster, ClusterConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const PS: usize = 4096;

fn seed() -> u64 {
    orion_sim::seed_or(84942873)
}

#[test]
fn reads_give_every_range_of_the_file() {
    let mut rng = StdRng::seed_from_u64(seed());
    let mut cluster = Cluster::start(ClusterConfig::default()).unwrap();
    for (internal, optimistic) in [(true, false), (false, false), (false, true)] {
        let kind = ClientKind {
            internal,
            optimistic,
            weak: false,
        };
        let c = cluster.client(kind).unwrap();
        let path = format!("/f-{internal}-{optimistic}");
        let flags = OpenFlags {
            read: true,
            write: true,
            create: true,
            ..Default::default()
        };
        let fd = c.open(&path, flags, 0o644).unwrap();
        // The model: written pieces at random places, holes between them.
        let size = 6 * PS + 1234;
        let mut model = vec![0u8; size];
        for _ in 0..5 {
            let at = rng.gen_range(0..size - 1);
            let len = rng.gen_range(1..=(size - at).min(2 * PS + 7));
            let bytes: Vec<u8> = (0..len).map(|_| rng.gen_range(1..=255)).collect();
            c.pwrite(fd, at as u64, &bytes).unwrap();
            model[at..at + len].copy_from_slice(&bytes);
        }
        c.ftruncate(fd, size as u64).unwrap();
        let mut ranges: Vec<(usize, usize)> = (0..300)
            .map(|_| (rng.gen_range(0..size + PS), rng.gen_range(0..3 * PS + 10)))
            .collect();
        // Page-aligned ends, both, neither, the end of the file, nothing.
        ranges.extend([
            (0, PS),
            (PS, 2 * PS),
            (1, PS - 2),
            (PS - 1, 2),
            (size - 5, 100),
        ]);
        ranges.extend([(size, 10), (0, 0), (0, size), (5 * PS, 2 * PS)]);
        for (off, len) in ranges {
            let want = &model[off.min(size)..(off + len).min(size)];
            let got = c.pread(fd, off as u64, len).unwrap();
            assert_eq!(got.len(), want.len(), "{path}: {len} bytes at {off}");
            assert!(got == want, "{path}: {len} bytes at {off} differ");
        }
        c.close(fd).unwrap();
    }
    cluster.stop().unwrap();
}
