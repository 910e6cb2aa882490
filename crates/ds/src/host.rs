//! Whether this store's host restarted since its pool last served. A pool that needs
//! flushes (`msync`, `dax`) keeps across a crash of the store process every page that
//! reached it (the page cache or the media holds it), but across a crash of the host
//! only what was flushed: a weak-mode page delivered and never flushed may be gone.
//! The MDS must then not take the pool for one that holds what it was given. The boot
//! id of the last run that served the pool is kept beside it (`<pool>.boot`); a
//! volatile pool on tmpfs goes with the reboot, and its mark with it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

fn mark_of(pool: &Path) -> PathBuf {
    let mut name = pool.as_os_str().to_owned();
    name.push(".boot");
    PathBuf::from(name)
}

/// True when the pool at `pool` last served under another boot of this host; records
/// the current boot for the next start.
pub fn restarted_since_last_run(pool: &Path) -> Result<bool> {
    let now = std::fs::read_to_string(BOOT_ID)
        .with_context(|| format!("reading {BOOT_ID}"))?
        .trim()
        .to_string();
    let mark = mark_of(pool);
    let last = match std::fs::read_to_string(&mark) {
        Ok(s) => Some(s.trim().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", mark.display())),
    };
    if last.as_deref() != Some(now.as_str()) {
        orion_pmem::replace_durably(&mark, format!("{now}\n").as_bytes())
            .with_context(|| format!("writing {}", mark.display()))?;
    }
    Ok(last.is_some_and(|l| l != now))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_seen_under_another_boot_says_so_once() {
        let dir = tempfile::tempdir().unwrap();
        let pool = dir.path().join("ds0.pool");
        assert!(!restarted_since_last_run(&pool).unwrap(), "no mark yet");
        assert!(!restarted_since_last_run(&pool).unwrap(), "same boot");
        std::fs::write(mark_of(&pool), "another-boot\n").unwrap();
        assert!(restarted_since_last_run(&pool).unwrap());
        assert!(!restarted_since_last_run(&pool).unwrap(), "marked again");
    }
}
