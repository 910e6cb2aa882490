//! A file's watch recalled once (design note 80), through real mounts and the
//! kernel: another mount that listed a file, or maps it, still sees every write.

mod cluster;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::process::{Command, Stdio};

use cluster::Cluster;

/// Maps the file named by its argument (read-only, shared) and, for each line on its
/// input, prints the mapping's first byte: pages come in on faults, never through a
/// getattr.
const MAPPED_READER: &str = r#"
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
m = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ)
for _ in sys.stdin:
    print(chr(m[0]), flush=True)
"#;

#[test]
fn a_file_another_mount_listed_or_maps_shows_every_write_through_it() {
    let cluster = Cluster::start_with_mds("local", 1, &["--cache-lease-ms", "5000"]);
    let a = cluster.mount("a", &[]);
    let b = cluster.mount("b", &[]);
    let (fa, fb) = (a.path.join("f"), b.path.join("f"));
    std::fs::write(&fa, vec![b'0'; 4096]).unwrap();
    // B lists the directory and looks at the file: its kernel keeps both, watched.
    assert_eq!(std::fs::read_dir(&b.path).unwrap().count(), 1);
    assert_eq!(std::fs::metadata(&fb).unwrap().len(), 4096);
    // A grows the file a byte at a time: the first write recalls B's watch, and each
    // stat through B (which watches it again) shows the write before it.
    let f = std::fs::OpenOptions::new().write(true).open(&fa).unwrap();
    for i in 1..=50u64 {
        f.write_all_at(b"x", 4095 + i).unwrap();
        assert_eq!(
            std::fs::metadata(&fb).unwrap().len(),
            4096 + i,
            "write {i} through A, stat through B"
        );
    }
    // B maps the file: the kernel reads mapped pages in on a fault, with no getattr
    // that would watch the file again, so B's watch of a file it holds open outlives
    // a recall, and each write through A is seen in B's mapping.
    let mut reader = Command::new("python3")
        .args(["-c", MAPPED_READER])
        .arg(&fb)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut ask = reader.stdin.take().unwrap();
    let mut answers = BufReader::new(reader.stdout.take().unwrap()).lines();
    for (i, c) in (b'a'..=b'e').enumerate() {
        f.write_all_at(&[c], 0).unwrap();
        writeln!(ask).unwrap();
        let seen = answers.next().expect("an answer").unwrap();
        assert_eq!(
            seen,
            (c as char).to_string(),
            "write {i} through A, read through B's mapping"
        );
    }
    drop(ask);
    assert!(reader.wait().unwrap().success());
}
