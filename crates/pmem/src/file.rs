//! Small files beside the pools (the MDS's cluster map, a store's boot mark, the
//! cluster manager's epoch), replaced whole so that a crash leaves the old contents or
//! the new ones, never a mix.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to a temporary file next to `path`, syncs it, renames it over `path`
/// and syncs the directory.
pub fn replace_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_replaced_file_holds_the_new_bytes_and_no_temporary_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state");
        super::replace_durably(&p, b"one").unwrap();
        super::replace_durably(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
