//! Hand-over names: how a front-end that holds an open file with no path to it (the
//! preload library, for a descriptor whose file was renamed or unlinked since it
//! was opened) has the mount open that same file, so that mmap, fork and exec of the
//! descriptor go through the kernel.
//!
//! A hand-over name is `.orion-handover.<ino>.<generation>.<expires>.<tag>`, looked
//! up in the mount's root: the tag is a keyed MAC of the other three under the
//! cluster secret, and `expires` (Unix seconds) is [`VALID_FOR`] after it was made.
//! It is no directory entry: the mount answers a lookup of it with that inode if the
//! tag is right, the name has not expired and the inode still has that generation,
//! with a zero TTL, and never lists it. Only a holder of the cluster secret can make
//! one (and such a holder reaches every file through the fabric anyway); whoever
//! learns one (it shows in `/proc/PID/fd` of the process, which only its user and
//! root may read) can use it for those few seconds, as they could have used the
//! descriptor itself. A name that is not a well-formed hand-over name is looked up
//! as any other name.
//!
//! The lookup also holds the inode in this client's open table for [`HOLD_FOR`] (the
//! keeper thread then lets go, within its period), so that the open that follows is
//! not this client's first hold of the file: the file may have no link left, and a
//! first hold of a file with none gives up (`handles.rs`, `read_held`), as it must
//! when an unlink may have come first. Here the front-end that made the name holds
//! the file throughout its hand-over, so the MDS cannot destroy it; the generation,
//! read after the hold is written, shows it is the same file, and from then on the
//! hold keeps it (the MDS sees the word). The hold outlives the open by some seconds
//! rather than being matched to it: FUSE's open does not say which lookup it
//! follows, and an unlinked file is destroyed that much later.
//!
//! It replaced a hard link in the root for the moment of the open, which a crash
//! left behind, which let anyone reach a file of a 0700 directory while it lasted,
//! and which changed the root's times.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use orion_meta::error::ENOENT;
use orion_meta::{Attr, FsResult};

use super::*;

/// What every hand-over name starts with.
pub const HANDOVER_PREFIX: &[u8] = b".orion-handover.";
/// How long a name opens its file: a hand-over looks it up at once.
pub const VALID_FOR: Duration = Duration::from_secs(10);
/// How long a lookup's hold lasts: the open that follows it comes within
/// microseconds (each lookup of the name holds anew).
const HOLD_FOR: Duration = Duration::from_secs(2);
/// Keeps these tags from serving any other use of the secret.
const CONTEXT: &[u8] = b"hand-over name: inode, generation, expiry";

/// The hand-over holds of a client: by inode, how many, and since the last.
pub(crate) type HandoverHolds = HashMap<u64, (u32, Instant)>;

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn tagged(ino: u64, generation: u64, expires: u64) -> [u8; 24] {
    let mut d = [0u8; 24];
    d[..8].copy_from_slice(&ino.to_le_bytes());
    d[8..16].copy_from_slice(&generation.to_le_bytes());
    d[16..].copy_from_slice(&expires.to_le_bytes());
    d
}

fn spell(ino: u64, generation: u64, expires: u64, tag: &[u8]) -> String {
    format!("{ino}.{generation}.{expires}.{}", orion_format::hex(tag))
}

/// The inode, generation, expiry and tag a name holds after the prefix, if it is
/// spelled exactly as [`spell`] spells them (one name per file and expiry).
fn parse(rest: &[u8]) -> Option<(u64, u64, u64, [u8; 16])> {
    let text = std::str::from_utf8(rest).ok()?;
    let mut parts = text.split('.');
    let ino = parts.next()?.parse().ok()?;
    let generation = parts.next()?.parse().ok()?;
    let expires = parts.next()?.parse().ok()?;
    let tag_hex = parts.next()?;
    if parts.next().is_some() || tag_hex.len() != 32 {
        return None;
    }
    let mut tag = [0u8; 16];
    for (i, t) in tag.iter_mut().enumerate() {
        *t = u8::from_str_radix(tag_hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    (spell(ino, generation, expires, &tag) == text).then_some((ino, generation, expires, tag))
}

impl Client {
    /// A hand-over name of the file open as `fd`, good for [`VALID_FOR`] (see the
    /// module's doc).
    pub fn handover_name(&self, fd: Fd) -> FsResult<Vec<u8>> {
        self.handover_name_until(fd, unix_now() + VALID_FOR.as_secs())
    }

    /// A hand-over name of the file open as `fd` that opens it until `expires`
    /// (Unix seconds; [`Client::handover_name`] is the one front-ends use).
    pub fn handover_name_until(&self, fd: Fd, expires: u64) -> FsResult<Vec<u8>> {
        let (ino, _, _) = self.handle(fd)?;
        let generation = self.generation(fd)?;
        let secret = &self.lanes.domain.config().secret;
        let tag = secret.tag(CONTEXT, &tagged(ino, generation, expires));
        let name = spell(ino, generation, expires, &tag);
        Ok([HANDOVER_PREFIX, name.as_bytes()].concat())
    }

    /// If `name` is a hand-over name: the attributes of the inode it names, held
    /// for [`HOLD_FOR`], or ENOENT if it expired or that inode is gone (its number
    /// may name another file now). `None`: not a well-formed hand-over name with a
    /// right tag (an ordinary name).
    pub fn handover_target(&self, name: &[u8]) -> Option<FsResult<Attr>> {
        let (ino, generation, expires, tag) = parse(name.strip_prefix(HANDOVER_PREFIX)?)?;
        let secret = &self.lanes.domain.config().secret;
        if !secret.verify_tag(CONTEXT, &tagged(ino, generation, expires), &tag) {
            return None;
        }
        if unix_now() > expires {
            return Some(Err(ENOENT));
        }
        let r = self.run_on(ino, |i| {
            i.remote.hold_open(ino)?;
            let same = i
                .cache
                .refresh(&mut i.remote, ino)
                .map(|c| (c.generation() == generation).then(|| c.state.attr.clone()));
            match same {
                Ok(Some(a)) => Ok(a),
                other => {
                    i.remote.unhold_open(ino)?;
                    other.and(Err(ENOENT.into()))
                }
            }
        });
        if r.is_ok() {
            let mut h = lock(&self.lanes.handovers);
            let e = h.entry(ino).or_insert((0, Instant::now()));
            e.0 += 1;
            e.1 = Instant::now();
        }
        Some(r)
    }
}

impl Lanes {
    /// Lets go of the holds hand-over lookups took that are older than
    /// [`HOLD_FOR`] (the keeper calls it while the client holds files).
    pub(crate) fn drop_handover_holds(&self) {
        let mut going = Vec::new();
        {
            let mut h = lock(&self.handovers);
            h.retain(|&ino, e| {
                let stale = e.1.elapsed() > HOLD_FOR;
                if stale {
                    going.extend(std::iter::repeat_n(ino, e.0 as usize));
                }
                !stale
            });
        }
        for ino in going {
            if let Some(place) = self.opens.release(ino) {
                // A failure leaves the word: the MDS keeps the file until this
                // client's table is written whole again (a reconnection).
                let _ = self.run_background(|i| i.remote.clear_open(ino, place));
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
        let name = spell(12, 7, 99, &tag);
        assert_eq!(parse(name.as_bytes()), Some((12, 7, 99, tag)));
        let ab = "ab".repeat(16);
        for bad in [
            "12.7.99".to_string(),
            "12.7.99.abc".to_string(),
            format!("x.7.99.{ab}"),
            format!("12.7.99.{ab}.1"),
            format!("12.7.99.zz{}", "ab".repeat(15)),
            format!("12.-7.99.{ab}"),
            // Other spellings of the same numbers.
            format!("+12.7.99.{ab}"),
            format!("012.7.99.{ab}"),
            format!("12.7.99.{}", "AB".repeat(16)),
            format!("12.7.99.+a{}", "ab".repeat(15)),
            // What the hard links of the old hand-over were called.
            "4242.17.3".to_string(),
            String::new(),
        ] {
            assert_eq!(parse(bad.as_bytes()), None, "{bad:?}");
        }
        assert_eq!(parse(&[0xff, 0xfe]), None, "not UTF-8");
        // A multi-byte character across a hex pair: no panic.
        let split = format!("1.2.3.a\u{e9}{}", "b".repeat(29));
        assert_eq!(split.len(), 6 + 32);
        assert_eq!(parse(split.as_bytes()), None);
    }
}
