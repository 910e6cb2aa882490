//! Hand-over names: how a front-end that holds an open file with no path to it (the
//! preload library, for a descriptor whose file was renamed or unlinked since it
//! was opened) has the mount open that same file, so that mmap, fork and exec of the
//! descriptor go through the kernel.
//!
//! A hand-over name is `.orion-handover.<ino>.<generation>.<tag>`, looked up in the
//! mount's root, where the tag is a keyed MAC of the inode and its generation under
//! the cluster secret. It is no directory entry: the mount answers a lookup of it
//! with that inode if the tag is right and the inode still has that generation, and
//! lets the kernel keep nothing of it (it is never listed). The lookup also holds
//! the inode in this client's open table until the open that follows: the file may
//! have no link left, and an open that is a client's first hold of a file with none
//! gives up (`handles.rs`, `read_held`), as it must when an unlink may have come
//! first. Here the front-end that made the name holds the file throughout, so the
//! MDS cannot destroy it, and the generation, read after the hold is written, shows
//! it is the same file. Only a holder of the
//! cluster secret can make one, and a holder of the secret reaches every file
//! through the fabric anyway, so the name opens nothing that was closed. It replaced
//! a hard link in the root for the moment of the open, which a crash left behind,
//! which let anyone reach a file of a 0700 directory while it lasted, and which
//! changed the root's times.

use orion_meta::error::ENOENT;
use orion_meta::{Attr, FsResult};

use super::*;

/// What every hand-over name starts with.
pub const HANDOVER_PREFIX: &[u8] = b".orion-handover.";
/// Keeps these tags from serving any other use of the secret.
const CONTEXT: &[u8] = b"hand-over name of an inode and generation";

fn tagged(ino: u64, generation: u64) -> [u8; 16] {
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&ino.to_le_bytes());
    d[8..].copy_from_slice(&generation.to_le_bytes());
    d
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The inode, generation and tag a name holds after the prefix (None: malformed).
fn parse(rest: &[u8]) -> Option<(u64, u64, [u8; 16])> {
    let text = std::str::from_utf8(rest).ok()?;
    let mut parts = text.split('.');
    let ino = parts.next()?.parse().ok()?;
    let generation = parts.next()?.parse().ok()?;
    let tag_hex = parts.next()?;
    if parts.next().is_some() || tag_hex.len() != 32 {
        return None;
    }
    let mut tag = [0u8; 16];
    for (i, t) in tag.iter_mut().enumerate() {
        *t = u8::from_str_radix(tag_hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some((ino, generation, tag))
}

impl Client {
    /// The hand-over name of the file open as `fd` (see the module's doc).
    pub fn handover_name(&self, fd: Fd) -> FsResult<Vec<u8>> {
        let (ino, _, _) = self.handle(fd)?;
        let generation = self.generation(fd)?;
        let tag = self
            .lanes
            .domain
            .config()
            .secret
            .tag(CONTEXT, &tagged(ino, generation));
        let name = format!("{ino}.{generation}.{}", hex(&tag));
        Ok([HANDOVER_PREFIX, name.as_bytes()].concat())
    }

    /// If `name` is a hand-over name: the attributes of the inode it names, held
    /// until the next [`Client::open_ino`] of it (or the kernel forgets it), or
    /// ENOENT if its tag is wrong or that inode is gone (its number may name
    /// another file now). `None`: an ordinary name.
    pub fn handover_target(&self, name: &[u8]) -> Option<FsResult<Attr>> {
        let rest = name.strip_prefix(HANDOVER_PREFIX)?;
        let secret = &self.lanes.domain.config().secret;
        let (ino, generation) = match parse(rest) {
            Some((ino, generation, tag))
                if secret.verify_tag(CONTEXT, &tagged(ino, generation), &tag) =>
            {
                (ino, generation)
            }
            _ => return Some(Err(ENOENT)),
        };
        let r = self.run_on(ino, |i| {
            i.remote.hold_open(ino)?;
            let same = i
                .cache
                .refresh(&mut i.remote, ino)
                .map(|c| (c.generation == generation).then(|| c.state.attr.clone()));
            match same {
                Ok(Some(a)) => Ok(a),
                other => {
                    if let Some(place) = i.remote.opens.release(ino) {
                        i.remote.clear_open(ino, place)?;
                    }
                    other.and(Err(ENOENT.into()))
                }
            }
        });
        if r.is_ok() {
            *lock(&self.handovers).entry(ino).or_default() += 1;
        }
        Some(r)
    }

    /// Lets go of up to `n` holds hand-over lookups took on `ino`.
    pub(crate) fn drop_handover_holds(&self, ino: u64, n: u32) {
        let k = {
            let mut h = lock(&self.handovers);
            let Some(have) = h.get_mut(&ino) else {
                return;
            };
            let k = n.min(*have);
            *have -= k;
            if *have == 0 {
                h.remove(&ino);
            }
            k
        };
        for _ in 0..k {
            if let Some(place) = self.lanes.opens.release(ino) {
                // A failure leaves the word: the MDS keeps the file until this
                // client's table is written whole again (a reconnection).
                let _ = self
                    .lanes
                    .run(Pick::Inode(ino), false, |i| i.remote.clear_open(ino, place));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_malformed_ones_do_not() {
        let tag = [0xabu8; 16];
        let name = format!("12.7.{}", hex(&tag));
        assert_eq!(parse(name.as_bytes()), Some((12, 7, tag)));
        for bad in [
            "12.7",
            "12.7.abc",
            "x.7.abababababababababababababababab",
            "12.7.abababababababababababababababab.1",
            "12.7.zzababababababababababababababab",
            "12.-7.abababababababababababababababab",
            "",
        ] {
            assert_eq!(parse(bad.as_bytes()), None, "{bad:?}");
        }
        assert_eq!(parse(&[0xff, 0xfe]), None, "not UTF-8");
        // A multi-byte character where a hex digit should be: no panic.
        let split = format!("1.2.a\u{e9}{}", "b".repeat(29));
        assert_eq!(split.len(), 4 + 32);
        assert_eq!(parse(split.as_bytes()), None);
    }
}
