//! Reads: extent index → page address → the mapped local pool, the DRAM cache, or a
//! one-sided read of the store (then cached).

use orion_format::Gpa;

use super::{regular, same_file, DataPath, PageCache, PS};
use crate::remote::{Remote, Res};

impl DataPath<'_> {
    pub fn read(&mut self, ino: u64, gen: u64, off: u64, len: usize) -> Res<Vec<u8>> {
        let c = self.cache.refresh(self.remote, ino)?;
        same_file(c.generation(), gen)?;
        regular(c.state.attr.ftype)?;
        // This client's staged writes are part of the file for it.
        let size = c.state.attr.size.max(self.staging.end(ino, gen));
        if off >= size || len == 0 {
            return Ok(Vec::new());
        }
        let end = size.min(off.saturating_add(len as u64));
        let first = off / PS;
        let last = (end - 1) / PS;
        let file = c.state.file().expect("regular file");
        let staging = &*self.staging;
        let gpas: Vec<Option<Gpa>> = (first..=last)
            .map(|p| staging.page(ino, gen, p).or_else(|| file.get(p)))
            .collect();
        let mut buf = vec![0u8; gpas.len() * PS as usize];
        fetch(self.remote, self.pages, &gpas, &mut buf)?;
        let skip = (off - first * PS) as usize;
        buf.drain(..skip);
        buf.truncate((end - off) as usize);
        // The pages fetched run from `off`'s page through `end - 1`'s.
        assert_eq!(
            buf.len() as u64,
            end - off,
            "the pages read cover the bytes read"
        );
        assert!(buf.len() <= len, "a read returns at most what was asked");
        Ok(buf)
    }
}

/// Fills `out` (whole pages) with the pages at `gpas` (`None`: a hole, zeros).
pub(crate) fn fetch(
    remote: &mut Remote,
    pages: &PageCache,
    gpas: &[Option<Gpa>],
    out: &mut [u8],
) -> Res<()> {
    // Every caller sizes `out` by the pages it asks for: no byte is left unfilled.
    assert_eq!(
        out.len(),
        gpas.len() * PS as usize,
        "pages are fetched whole"
    );
    let mut i = 0;
    while i < gpas.len() {
        let at = i * PS as usize;
        let Some(g) = gpas[i] else {
            out[at..at + PS as usize].fill(0);
            i += 1;
            continue;
        };
        let local = remote.reads_locally(g.group());
        let ttl = remote.grace / 2;
        if !local && pages.get_into(&g, ttl, &mut out[at..at + PS as usize]) {
            remote.stats.cache_hits += 1;
            i += 1;
            continue;
        }
        // A run of consecutive addresses not cached: one read.
        let mut n = 1;
        while i + n < gpas.len()
            && gpas[i + n] == Some(g.offset_by(n as u64))
            && (local || !pages.has(&g.offset_by(n as u64), ttl))
        {
            n += 1;
        }
        let dst = &mut out[at..at + n * PS as usize];
        remote.read_pages(g, n, dst)?;
        if !local {
            for k in 0..n {
                let page = &dst[k * PS as usize..(k + 1) * PS as usize];
                pages.put(g.offset_by(k as u64), page);
            }
        }
        i += n;
    }
    Ok(())
}
