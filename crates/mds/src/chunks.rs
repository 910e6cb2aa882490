//! Delegated allocation (paper §5.1): the MDS owns the page bitmap of every replication
//! group and hands clients chunks of free pages; a client allocates inside its chunks
//! without asking again. The MDS remembers which chunk pages each client has committed,
//! refuses pages outside a client's chunks, and takes back the uncommitted rest when
//! the client goes away.

use std::collections::BTreeMap;
use std::time::Duration;

use orion_format::{Gpa, MAX_WRITE_PAGES};
use orion_meta::alloc::PageAllocator;
use orion_meta::{FsError, FsResult, MetaEngine};

/// Most pages one chunk request may ask for.
pub const MAX_CHUNK_PAGES: u32 = MAX_WRITE_PAGES;

/// A replication group: its page bitmap and the data store serving it.
pub struct Group {
    pub alloc: PageAllocator,
    /// Pages per store: every replica of the group has the same layout.
    pub page_count: u64,
    /// While a replica of the group resyncs, pages freed wait here instead of going
    /// back to the allocator: the resync copies pages that were in use when it began,
    /// and such a page must not be written anew before it is copied.
    pub held: Option<Vec<(u64, u64)>>,
}

impl Group {
    /// A group whose first store just joined with `page_count` pages: every page a
    /// file or symlink of `engine` names is in use, the rest is free.
    pub fn new(
        group: u16,
        page_count: u64,
        engine: &MetaEngine,
        grace: Duration,
    ) -> FsResult<Group> {
        let mut g = Group::empty(page_count, grace);
        for page in named_pages(engine, group, page_count)? {
            assert!(g.alloc.mark_used(page), "named_pages lists a page once");
        }
        Ok(g)
    }

    /// A group of `page_count` free pages. Its allocator never waits: a grant
    /// answers EAGAIN while the free pages are in their grace period, and the
    /// client waits (`grant`), not the MDS's loop.
    fn empty(page_count: u64, grace: Duration) -> Group {
        let reserve = (page_count / 100).max(8);
        Group {
            alloc: PageAllocator::new(page_count, reserve, grace)
                .never_waits()
                .of_data_pages(),
            page_count,
            held: None,
        }
    }

    /// Frees pages (after the grace period), or holds them while a replica resyncs.
    pub fn free_later(&mut self, page: u64, n: u64) {
        match &mut self.held {
            Some(held) => held.push((page, n)),
            None => self.alloc.free_later(page, n),
        }
    }

    /// Starts holding freed pages (a replica began a resync).
    pub fn hold(&mut self) {
        self.held.get_or_insert_with(Vec::new);
    }

    /// Stops holding freed pages: they go back to the allocator.
    pub fn release(&mut self) {
        for (page, n) in self.held.take().unwrap_or_default() {
            self.alloc.free_later(page, n);
        }
    }
}

/// The pages of `group` that a file or symlink of `engine` names, each once, in
/// order; an error if one lies outside `page_count` pages or is named twice.
pub fn named_pages(engine: &MetaEngine, group: u16, page_count: u64) -> FsResult<Vec<u64>> {
    let mut seen = vec![0u64; page_count.div_ceil(64) as usize];
    let mut pages = Vec::new();
    for ino in engine.inode_numbers() {
        let inode = engine.inode(ino)?;
        for g in inode
            .state
            .data_pages()
            .into_iter()
            .filter(|g| g.group() == group)
        {
            let p = g.page();
            let (w, bit) = ((p / 64) as usize, 1u64 << (p % 64));
            if p >= page_count || seen[w] & bit != 0 {
                return Err(FsError::Corrupt(format!(
                    "inode {ino} names page {p} of group {group}, but the store's pool has \
                     {page_count} pages (or the page is named twice): is this the store's \
                     pool of this cluster?"
                )));
            }
            seen[w] |= bit;
            pages.push(p);
        }
    }
    pages.sort_unstable();
    Ok(pages)
}

/// A chunk handed to one client, and which of its pages the client has committed.
pub struct ChunkGrant {
    pub start: Gpa,
    pub pages: u32,
    committed: Vec<u64>,
    left: u32,
}

impl ChunkGrant {
    pub fn new(start: Gpa, pages: u32) -> ChunkGrant {
        ChunkGrant {
            start,
            pages,
            committed: vec![0; (pages as usize).div_ceil(64)],
            left: pages,
        }
    }

    fn index(&self, g: Gpa) -> Option<u64> {
        let s = self.start;
        (g.group() == s.group() && g.page() >= s.page() && g.page() < s.page() + self.pages as u64)
            .then(|| g.page() - s.page())
    }

    fn is_committed(&self, i: u64) -> bool {
        self.committed[(i / 64) as usize] & (1 << (i % 64)) != 0
    }
}

/// The chunks granted to one client (not a lease: a grant lasts until the client
/// commits its pages or goes away).
#[derive(Default)]
pub struct ChunkGrants(Vec<ChunkGrant>);

impl ChunkGrants {
    /// Records a chunk just granted. No page is granted twice: the group's allocator
    /// handed it out as free, so no grant holds it uncommitted (an older grant may
    /// hold it committed: the file that took it has freed it since).
    pub fn add(&mut self, start: Gpa, pages: u32) {
        assert!(pages > 0, "an empty chunk grant");
        debug_assert!(
            (0..pages as u64).all(|k| self.holder(start.offset_by(k)).is_none()),
            "a page of a new chunk is still uncommitted in an older grant"
        );
        self.0.push(ChunkGrant::new(start, pages));
    }

    /// The grant holding `g` uncommitted, and the page's index in it.
    fn holder(&self, g: Gpa) -> Option<(usize, u64)> {
        self.0
            .iter()
            .enumerate()
            .find_map(|(k, l)| l.index(g).filter(|&i| !l.is_committed(i)).map(|i| (k, i)))
    }

    /// Checks that `n` pages from `start` all lie in this client's chunks and are not
    /// committed yet.
    pub fn check(&self, start: Gpa, n: u64) -> FsResult<()> {
        for k in 0..n {
            let g = start.offset_by(k);
            if self.holder(g).is_none() {
                // EKEYREVOKED: the grant is not (or no longer) this connection's, as after
                // a reconnection or a fail-over; the client writes the data again into
                // pages of a fresh chunk.
                return Err(FsError::Errno(libc::EKEYREVOKED));
            }
        }
        Ok(())
    }

    /// Records pages as committed (they now belong to a file); drops full grants.
    /// The caller checked them ([`ChunkGrants::check`]): each lies in exactly one
    /// grant, uncommitted.
    pub fn commit(&mut self, start: Gpa, n: u64) {
        for k in 0..n {
            let g = start.offset_by(k);
            let (at, i) = self
                .holder(g)
                .unwrap_or_else(|| panic!("page {g:?} committed outside this client's grants"));
            let l = &mut self.0[at];
            // `holder` found page `i` uncommitted: the count of those cannot be zero.
            assert!(
                l.left > 0,
                "a grant holding an uncommitted page has none left"
            );
            l.committed[(i / 64) as usize] |= 1 << (i % 64);
            l.left -= 1;
        }
        self.0.retain(|l| l.left > 0);
    }

    /// Takes back `n` pages from `start` that the client gives up unused: they must
    /// all lie in its chunks, uncommitted (else `EKEYREVOKED`, and nothing changes).
    /// They leave its grants as committed pages do: no longer the client's to write.
    pub fn give_back(&mut self, start: Gpa, n: u64) -> FsResult<()> {
        self.check(start, n)?;
        self.commit(start, n);
        Ok(())
    }

    /// The pages never committed, as runs, to give back to their groups.
    pub fn uncommitted(&self) -> Vec<(Gpa, u64)> {
        let mut out: Vec<(Gpa, u64)> = Vec::new();
        for l in &self.0 {
            for i in 0..l.pages as u64 {
                if !l.is_committed(i) {
                    match out.last_mut() {
                        Some((g, n)) if g.offset_by(*n) == l.start.offset_by(i) => *n += 1,
                        _ => out.push((l.start.offset_by(i), 1)),
                    }
                }
            }
        }
        // The pair of `commit`'s count: what goes back to the groups is what is left.
        debug_assert_eq!(
            out.iter().map(|&(_, n)| n).sum::<u64>(),
            self.0.iter().map(|l| l.left as u64).sum::<u64>(),
            "a grant's count of pages left disagrees with its bitmap"
        );
        out
    }
}

/// Picks a group and a run of free pages for a client: its own group when it asks for
/// one (an internal client), else the group with the most free pages.
pub fn grant(
    groups: &mut BTreeMap<u16, Group>,
    serves: impl Fn(u16) -> bool,
    want: Option<u16>,
    pages: u32,
) -> FsResult<(Gpa, u32)> {
    let pages = pages.clamp(1, MAX_CHUNK_PAGES);
    // The client's own group first (an internal client's store), then the live
    // groups with the most free pages first.
    let mut order: Vec<(u16, u64)> = groups
        .iter()
        .filter(|(g, _)| serves(**g))
        .map(|(g, x)| (*g, x.alloc.free()))
        .collect();
    // EAGAIN: a store may be rejoining (after an MDS restart); clients wait a while.
    if order.is_empty() {
        return Err(FsError::Errno(libc::EAGAIN));
    }
    order.sort_by_key(|&(g, free)| (Some(g) != want, std::cmp::Reverse(free)));
    for (g, _) in order {
        let grp = groups.get_mut(&g).expect("listed group exists");
        // No client takes more than an eighth of what is free: on a small store, the
        // pages others need must not sit unused in one client's chunk.
        let cap = (grp.alloc.free() / 8).max(1);
        if let Some((start, n)) = grp.alloc.alloc_run((pages as u64).min(cap), false) {
            assert!(n >= 1 && n <= pages as u64 && start + n <= grp.page_count);
            return Ok((Gpa::new(g, start), n as u32));
        }
        // The client's own group (its local store), full until freed pages end their
        // grace period (`grace_ms`) and then not: the client waits for them, rather
        // than put data on a store it can only read remotely. (It asks for any
        // group once it has waited a grace period: `client/src/alloc.rs`.)
        if Some(g) == want && grp.alloc.available() > 0 {
            return Err(FsError::Errno(libc::EAGAIN));
        }
    }
    // Every serving group is full. Room that is coming is waited for (EAGAIN: the
    // client asks again), as when none serves: a group that does not serve now (its
    // store rejoining, or late with a heartbeat on a loaded host), or freed pages
    // still in their grace period (readers may hold them for up to that long). The
    // write is not failed for space the file system has.
    if groups.iter().any(|(_, x)| x.alloc.available() > 0) {
        return Err(FsError::Errno(libc::EAGAIN));
    }
    Err(orion_meta::error::NO_DATA_PAGES)
}

impl crate::server::Mds {
    /// `MdsRequest::AllocChunk`: a chunk of `want`'s group (or any group serving),
    /// recorded as the connection's. None in the first `grant_quiet_ms` of this
    /// MDS's service (EAGAIN: the client waits): a client of the MDS before (one
    /// that restarted, or a primary that lost its role) writes into a chunk only
    /// within half that time of an answer it got, and the pages of its chunk look
    /// free here.
    pub(crate) fn alloc_chunk(
        &mut self,
        conn: orion_fabric::ConnId,
        want: Option<u16>,
        pages: u32,
    ) -> FsResult<orion_proto::ReplyBody> {
        if std::time::Instant::now() < self.grants_from {
            return Err(FsError::Errno(libc::EAGAIN));
        }
        let peer = self
            .peers
            .get_mut(&conn)
            .ok_or(FsError::Errno(libc::ENOTCONN))?;
        let map = &self.map;
        let pages = pages.min(self.cfg.max_chunk_pages);
        let (start, n) = grant(&mut self.groups, |g| map.serves(g), want, pages)?;
        peer.grants.add(start, n);
        // A notice about these pages from before they were free again (a write never
        // committed) must not vouch for new writes.
        self.strong.forget_pages(start, n as u64);
        Ok(orion_proto::ReplyBody::Chunk { start, pages: n })
    }

    /// `MdsRequest::ReturnPages`: pages of a client's chunks it gives up go back to
    /// their groups at once (no file names them, so no reader can hold them), as when
    /// a client leaves. Every run is checked before any is taken back.
    pub(crate) fn return_pages(
        &mut self,
        conn: orion_fabric::ConnId,
        runs: &[(Gpa, u32)],
    ) -> FsResult<orion_proto::ReplyBody> {
        let peer = self
            .peers
            .get_mut(&conn)
            .ok_or(FsError::Errno(libc::ENOTCONN))?;
        for &(g, n) in runs {
            if n == 0 || n > MAX_CHUNK_PAGES {
                return Err(FsError::Errno(libc::EINVAL));
            }
            peer.grants.check(g, n as u64)?;
        }
        for &(g, n) in runs {
            // Two runs naming the same page: the second finds it taken back already.
            peer.grants.give_back(g, n as u64)?;
            if let Some(grp) = self.groups.get_mut(&g.group()) {
                grp.alloc.free_now(g.page(), n as u64);
            }
            self.strong.forget_pages(g, n as u64);
        }
        Ok(orion_proto::ReplyBody::Empty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ENOSPC only when no group has room: a full serving group and one with room
    /// that does not serve now is EAGAIN (the client waits for the store), not ENOSPC.
    #[test]
    fn a_group_not_serving_with_room_is_waited_for_not_reported_full() {
        let group = |free: u64| {
            let mut alloc = orion_meta::alloc::PageAllocator::new(64, 8, Duration::ZERO);
            for p in 0..64 - free {
                alloc.mark_used(p);
            }
            Group {
                alloc,
                page_count: 64,
                held: None,
            }
        };
        let mut groups: BTreeMap<u16, Group> = [(0, group(8)), (1, group(40))].into();
        let only_0 = |g: u16| g == 0;
        assert_eq!(
            grant(&mut groups, only_0, Some(0), 16),
            Err(FsError::Errno(libc::EAGAIN)),
            "group 1 has room and may come back"
        );
        let (start, n) = grant(&mut groups, |_| true, Some(0), 16).unwrap();
        assert_eq!(
            (start.group(), n),
            (1, 5),
            "an eighth of group 1's free pages"
        );
        let mut groups: BTreeMap<u16, Group> = [(0, group(8)), (1, group(8))].into();
        assert_eq!(
            grant(&mut groups, only_0, Some(0), 16),
            Err(orion_meta::error::NO_DATA_PAGES)
        );
    }

    /// A full group whose freed pages are still in their grace period answers
    /// EAGAIN at once: the MDS's loop does not sleep the grace out (it used to, for
    /// up to a second, and its stores' heartbeats went unanswered meanwhile), and
    /// the pages are granted once the grace is over.
    #[test]
    fn pages_in_their_grace_period_are_waited_for_by_the_client_not_the_mds() {
        let grace = Duration::from_secs(5);
        let full = || {
            let mut g = Group::empty(64, grace);
            (0..64).for_each(|p| assert!(g.alloc.mark_used(p)));
            g
        };
        let mut grp = full();
        grp.free_later(0, 32);
        let mut groups: BTreeMap<u16, Group> = [(0, grp)].into();
        let asked = std::time::Instant::now();
        assert_eq!(
            grant(&mut groups, |_| true, None, 16),
            Err(FsError::Errno(libc::EAGAIN))
        );
        assert!(
            asked.elapsed() < grace / 2,
            "the grant waited the grace out"
        );
        // Another group has room: an internal client of the full one waits for its
        // own store's pages; any other client gets the other group's.
        let mut spare = Group::empty(64, grace);
        (0..32).for_each(|p| assert!(spare.alloc.mark_used(p)));
        groups.insert(1, spare);
        assert_eq!(
            grant(&mut groups, |_| true, Some(0), 16),
            Err(FsError::Errno(libc::EAGAIN))
        );
        assert_eq!(grant(&mut groups, |_| true, None, 16).unwrap().0.group(), 1);
        let mut groups: BTreeMap<u16, Group> = [(0, full())].into();
        assert_eq!(
            grant(&mut groups, |_| true, None, 16),
            Err(orion_meta::error::NO_DATA_PAGES),
            "nothing in its grace period: full"
        );
    }

    #[test]
    fn pages_given_back_leave_the_grant_and_only_held_ones_may_be() {
        let mut grants = ChunkGrants::default();
        grants.add(Gpa::new(0, 100), 8);
        // Outside the grant: refused, and nothing changes.
        assert_eq!(
            grants.give_back(Gpa::new(0, 106), 4),
            Err(FsError::Errno(libc::EKEYREVOKED))
        );
        assert!(grants.check(Gpa::new(0, 106), 2).is_ok());
        grants.give_back(Gpa::new(0, 102), 3).unwrap();
        // Given back: no longer the client's to commit, nor to give back twice.
        assert!(grants.check(Gpa::new(0, 103), 1).is_err());
        assert!(grants.give_back(Gpa::new(0, 104), 1).is_err());
        grants.commit(Gpa::new(0, 100), 2);
        assert_eq!(grants.uncommitted(), vec![(Gpa::new(0, 105), 3)]);
    }
}
