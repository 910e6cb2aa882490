//! The connection handshake: mutual challenge-response with the cluster secret, then the epoch.
//!
//! ```text
//! client -> server  HELLO     magic, version, backend, epoch, client nonce
//! server -> client  CHALLENGE server nonce, server epoch, HMAC(secret, "server", nonces, epoch)
//! client -> server  PROOF     HMAC(secret, "client", nonces, client epoch)
//! server -> client  VERDICT   accepted | epoch mismatch (server epoch) | refused (reason)
//! ```
//! A backend whose setup is one frame each way (the local one) sends its frame right
//! behind the PROOF, and the server answers with the VERDICT and its own frame in one
//! write ([`client_with_setup`], [`server_with_setup`]): two round trips in all, not
//! three, each a wake-up of a sleeping acceptor. The client has verified the server's
//! proof before it sends its frame; the server reads the frame only once the client's
//! proof verified.
//! The secret never crosses the wire; each side proves it knows it over both fresh nonces, so a
//! recorded handshake cannot be replayed. After an accepted verdict, the backend exchanges its
//! own setup frames (endpoint names, shared-memory file names) on the same stream, sealed with
//! a session key derived from the secret and both nonces, so a man in the middle cannot swap
//! them. Every frame is length-prefixed and bounded, and the whole handshake has one deadline
//! (a peer that trickles bytes cannot hold a listener); malformed frames are errors, never
//! panics.

use std::io::{Read, Write};
use std::time::Instant;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::config::{Backend, Secret};
use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"ORFB";
/// Version 2: the local backend's setup frames ride with the PROOF and the VERDICT.
const VERSION: u16 = 2;
const MAX_FRAME: usize = 64 * 1024;
const HELLO_LEN: usize = 4 + 2 + 1 + 1 + 8 + 32;
const MAC_LEN: usize = 32;

const VERDICT_OK: u8 = 0;
const VERDICT_EPOCH: u8 = 1;
const VERDICT_REFUSED: u8 = 2;

pub(crate) struct Params<'a> {
    pub secret: &'a Secret,
    pub epoch: u64,
    pub backend: &'a Backend,
    /// The peer's address, for errors and logs.
    pub peer: String,
    /// When the whole handshake, setup frames included, must be over.
    pub deadline: Instant,
}

impl<'a> Params<'a> {
    /// This node's side of a handshake with `peer`, due within the connect timeout.
    pub(crate) fn new(cfg: &'a crate::config::FabricConfig, peer: String) -> Params<'a> {
        Params {
            secret: &cfg.secret,
            epoch: cfg.epoch,
            backend: &cfg.backend,
            peer,
            deadline: Instant::now() + cfg.connect_timeout,
        }
    }
}

/// Proof that a handshake succeeded: the key that seals the setup frames that follow it.
pub(crate) struct Session {
    key: [u8; 32],
    /// This side's role, so that a frame reflected back at its sender does not verify.
    client: bool,
}

impl Session {
    fn new(secret: &Secret, nc: &[u8], ns: &[u8], client: bool) -> Session {
        let key = mac(secret, b"session", nc, ns, 0)
            .finalize()
            .into_bytes()
            .into();
        Session { key, client }
    }

    fn seal(&self, from_client: bool, body: &[u8]) -> Hmac<Sha256> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key length");
        m.update(if from_client { b"c" } else { b"s" });
        m.update(body);
        m
    }

    pub(crate) fn send<S: Write>(&self, s: &mut S, p: &Params<'_>, body: &[u8]) -> Result<()> {
        send_frame(s, &p.peer, &self.sealed(body))
    }

    /// `body` with this side's seal: a setup frame's bytes.
    fn sealed(&self, body: &[u8]) -> Vec<u8> {
        let mut f = body.to_vec();
        f.extend_from_slice(&self.seal(self.client, body).finalize().into_bytes());
        f
    }

    pub(crate) fn recv<S: Read>(&self, s: &mut S, p: &Params<'_>) -> Result<Vec<u8>> {
        let mut f = recv_frame(s, &p.peer, p.deadline)?;
        if f.len() < MAC_LEN {
            return Err(protocol(&p.peer, "setup frame without a seal"));
        }
        let tag = f.split_off(f.len() - MAC_LEN);
        if self.seal(!self.client, &f).verify_slice(&tag).is_err() {
            return Err(Error::AuthFailed {
                peer: p.peer.clone(),
                why: "a setup frame's seal does not verify (tampered with in transit?)".into(),
            });
        }
        Ok(f)
    }
}

pub(crate) fn send_frame<S: Write>(s: &mut S, peer: &str, body: &[u8]) -> Result<()> {
    send_frames(s, peer, &[body])
}

/// Sends frames in one write (one segment on a stream with Nagle off).
fn send_frames<S: Write>(s: &mut S, peer: &str, bodies: &[&[u8]]) -> Result<()> {
    let mut buf = Vec::with_capacity(bodies.iter().map(|b| 4 + b.len()).sum());
    for body in bodies {
        debug_assert!(body.len() <= MAX_FRAME);
        buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
        buf.extend_from_slice(body);
    }
    s.write_all(&buf)
        .and_then(|_| s.flush())
        .map_err(|e| stream_error(peer, e))
}

pub(crate) fn recv_frame<S: Read>(s: &mut S, peer: &str, deadline: Instant) -> Result<Vec<u8>> {
    let mut len = [0u8; 4];
    read_by(s, &mut len, peer, deadline)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(protocol(
            peer,
            format!("handshake frame of {len} bytes (limit {MAX_FRAME})"),
        ));
    }
    let mut body = vec![0u8; len];
    read_by(s, &mut body, peer, deadline)?;
    Ok(body)
}

/// `read_exact` that gives up at `deadline` (each read is also bounded by the stream's timeout).
fn read_by<S: Read>(s: &mut S, buf: &mut [u8], peer: &str, deadline: Instant) -> Result<()> {
    let mut at = 0;
    while at < buf.len() {
        if Instant::now() > deadline {
            return Err(Error::gone(peer, "the connection handshake took too long"));
        }
        match s.read(&mut buf[at..]) {
            Ok(0) => return Err(stream_error(peer, std::io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(stream_error(peer, e)),
        }
    }
    Ok(())
}

fn stream_error(peer: &str, e: std::io::Error) -> Error {
    use std::io::ErrorKind::*;
    match e.kind() {
        WouldBlock | TimedOut => Error::gone(peer, "no answer during the connection handshake"),
        UnexpectedEof | ConnectionReset | BrokenPipe | ConnectionAborted => Error::gone(
            peer,
            format!("closed the connection during the handshake ({e})"),
        ),
        _ => Error::io(format!("handshake with {peer}"), e),
    }
}

fn protocol(peer: &str, why: impl Into<String>) -> Error {
    Error::Protocol {
        peer: peer.to_string(),
        why: why.into(),
    }
}

impl Secret {
    /// A keyed tag of `data` under the cluster secret (HMAC-SHA-256, its first 16
    /// bytes): for names and tokens that only holders of the secret can make.
    /// `context` keeps the tags of one use from serving another.
    pub fn tag(&self, context: &[u8], data: &[u8]) -> [u8; 16] {
        let full = self.tag_mac(context, data).finalize().into_bytes();
        let mut t = [0u8; 16];
        t.copy_from_slice(&full[..16]);
        t
    }

    /// Whether `tag` is [`Secret::tag`] of `data` (compared in constant time).
    pub fn verify_tag(&self, context: &[u8], data: &[u8], tag: &[u8]) -> bool {
        tag.len() == 16
            && self
                .tag_mac(context, data)
                .verify_truncated_left(tag)
                .is_ok()
    }

    fn tag_mac(&self, context: &[u8], data: &[u8]) -> Hmac<Sha256> {
        let mut m =
            Hmac::<Sha256>::new_from_slice(self.expose()).expect("HMAC takes any key length");
        m.update(b"orion-tag ");
        m.update(&(context.len() as u64).to_le_bytes());
        m.update(context);
        m.update(data);
        m
    }
}

fn mac(secret: &Secret, role: &[u8], nc: &[u8], ns: &[u8], epoch: u64) -> Hmac<Sha256> {
    let mut m = Hmac::<Sha256>::new_from_slice(secret.expose()).expect("HMAC takes any key length");
    m.update(b"orion-fabric ");
    m.update(role);
    m.update(nc);
    m.update(ns);
    m.update(&epoch.to_le_bytes());
    m
}

fn nonce() -> [u8; 32] {
    let mut n = [0u8; 32];
    getrandom::getrandom(&mut n).expect("the OS random source failed");
    n
}

/// The client side; returns once the server accepted.
pub(crate) fn client<S: Read + Write>(s: &mut S, p: &Params<'_>) -> Result<Session> {
    let (nc, ns) = challenged(s, p)?;
    let proof = mac(p.secret, b"client", &nc, &ns, p.epoch)
        .finalize()
        .into_bytes();
    send_frame(s, &p.peer, &proof)?;
    verdict(s, p)?;
    Ok(Session::new(p.secret, &nc, &ns, true))
}

/// The client side with the backend's setup frame sent behind the proof; returns
/// once the server accepted, with the server's setup frame.
pub(crate) fn client_with_setup<S: Read + Write>(
    s: &mut S,
    p: &Params<'_>,
    setup: &[u8],
) -> Result<(Session, Vec<u8>)> {
    let (nc, ns) = challenged(s, p)?;
    let proof = mac(p.secret, b"client", &nc, &ns, p.epoch)
        .finalize()
        .into_bytes();
    let session = Session::new(p.secret, &nc, &ns, true);
    send_frames(s, &p.peer, &[&proof, &session.sealed(setup)])?;
    verdict(s, p)?;
    let reply = session.recv(s, p)?;
    Ok((session, reply))
}

/// Sends the HELLO and checks the server's CHALLENGE: the nonces, once the server
/// proved it knows the secret.
fn challenged<S: Read + Write>(s: &mut S, p: &Params<'_>) -> Result<([u8; 32], [u8; 32])> {
    let nc = nonce();
    let mut hello = Vec::with_capacity(HELLO_LEN);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&VERSION.to_le_bytes());
    hello.push(p.backend.wire_id());
    hello.push(0);
    hello.extend_from_slice(&p.epoch.to_le_bytes());
    hello.extend_from_slice(&nc);
    send_frame(s, &p.peer, &hello)?;

    let ch = recv_frame(s, &p.peer, p.deadline)?;
    if ch.first() == Some(&VERDICT_REFUSED) {
        return Err(refusal(p, &ch));
    }
    if ch.len() != 1 + 32 + 8 + MAC_LEN || ch[0] != VERDICT_OK {
        return Err(protocol(&p.peer, "malformed challenge"));
    }
    let ns: [u8; 32] = ch[1..33].try_into().expect("length checked");
    let server_epoch = u64::from_le_bytes(ch[33..41].try_into().unwrap());
    if mac(p.secret, b"server", &nc, &ns, server_epoch)
        .verify_slice(&ch[41..])
        .is_err()
    {
        let mut abort = vec![VERDICT_REFUSED];
        abort.extend_from_slice(b"the server's proof does not match this client's cluster secret");
        let _ = send_frame(s, &p.peer, &abort);
        return Err(Error::AuthFailed {
            peer: p.peer.clone(),
            why: "the server does not know the cluster secret".into(),
        });
    }
    Ok((nc, ns))
}

/// Reads the server's VERDICT.
fn verdict<S: Read>(s: &mut S, p: &Params<'_>) -> Result<()> {
    let verdict = recv_frame(s, &p.peer, p.deadline)?;
    match verdict.first() {
        Some(&VERDICT_OK) if verdict.len() == 1 => Ok(()),
        Some(&VERDICT_EPOCH) if verdict.len() == 9 => Err(Error::EpochMismatch {
            peer: p.peer.clone(),
            ours: p.epoch,
            theirs: u64::from_le_bytes(verdict[1..9].try_into().unwrap()),
        }),
        Some(&VERDICT_REFUSED) => Err(refusal(p, &verdict)),
        _ => Err(protocol(&p.peer, "malformed verdict")),
    }
}

fn refusal(p: &Params<'_>, frame: &[u8]) -> Error {
    let why = String::from_utf8_lossy(&frame[1..]).into_owned();
    Error::AuthFailed {
        peer: p.peer.clone(),
        why: format!("refused by the server: {why}"),
    }
}

/// The server side; returns once the client is accepted. Refusals are logged and told to the
/// client before the error returns.
pub(crate) fn server<S: Read + Write>(s: &mut S, p: &Params<'_>) -> Result<Session> {
    let result = proven(s, p).and_then(|session| {
        send_frame(s, &p.peer, &[VERDICT_OK])?;
        Ok(session)
    });
    if let Err(e) = &result {
        tracing::warn!(peer = %p.peer, "refused fabric connection: {e}");
    }
    result
}

/// The server side of [`client_with_setup`]: once the client's proof verified, reads
/// its setup frame and answers with the VERDICT and `respond`'s frame in one write. A
/// setup `respond` refuses is refused to the client without the reason, which is
/// logged here (it may name this host's files).
pub(crate) fn server_with_setup<S: Read + Write>(
    s: &mut S,
    p: &Params<'_>,
    respond: impl FnOnce(&[u8]) -> Result<Vec<u8>>,
) -> Result<Session> {
    let result = proven(s, p).and_then(|session| {
        let setup = session.recv(s, p)?;
        match respond(&setup) {
            Ok(reply) => {
                send_frames(s, &p.peer, &[&[VERDICT_OK], &session.sealed(&reply)])?;
                Ok(session)
            }
            Err(e) => {
                refuse(
                    s,
                    p,
                    "the server could not use the connection's setup (its log says why)",
                );
                Err(e)
            }
        }
    });
    if let Err(e) = &result {
        tracing::warn!(peer = %p.peer, "refused fabric connection: {e}");
    }
    result
}

fn refuse<S: Write>(s: &mut S, p: &Params<'_>, why: &str) {
    let mut f = vec![VERDICT_REFUSED];
    f.extend_from_slice(why.as_bytes());
    let _ = send_frame(s, &p.peer, &f);
}

/// Runs the server's side up to its VERDICT: the session, once the client proved it
/// knows the secret and speaks this epoch (a refusal is told to it).
fn proven<S: Read + Write>(s: &mut S, p: &Params<'_>) -> Result<Session> {
    let hello = recv_frame(s, &p.peer, p.deadline)?;
    if hello.len() != HELLO_LEN || &hello[0..4] != MAGIC {
        refuse(s, p, "not an OrionFS fabric handshake");
        return Err(protocol(&p.peer, "not an OrionFS fabric handshake"));
    }
    let version = u16::from_le_bytes([hello[4], hello[5]]);
    if version != VERSION {
        let why = format!("handshake version {version}, this node speaks {VERSION}");
        refuse(s, p, &why);
        return Err(protocol(&p.peer, why));
    }
    if hello[6] != p.backend.wire_id() {
        let why = format!(
            "peer uses the {} backend, this node {}",
            Backend::name_of(hello[6]),
            p.backend.name()
        );
        refuse(s, p, &why);
        return Err(protocol(&p.peer, why));
    }
    let client_epoch = u64::from_le_bytes(hello[8..16].try_into().unwrap());
    let nc = &hello[16..48];
    let ns = nonce();
    let mut ch = vec![VERDICT_OK];
    ch.extend_from_slice(&ns);
    ch.extend_from_slice(&p.epoch.to_le_bytes());
    ch.extend_from_slice(
        &mac(p.secret, b"server", nc, &ns, p.epoch)
            .finalize()
            .into_bytes(),
    );
    send_frame(s, &p.peer, &ch)?;

    let proof = recv_frame(s, &p.peer, p.deadline)?;
    if proof.len() != MAC_LEN {
        let why = match proof.first() {
            Some(&VERDICT_REFUSED) => format!(
                "authentication failed: {}",
                String::from_utf8_lossy(&proof[1..])
            ),
            _ => "malformed proof".to_string(),
        };
        return Err(Error::AuthFailed {
            peer: p.peer.clone(),
            why,
        });
    }
    if mac(p.secret, b"client", nc, &ns, client_epoch)
        .verify_slice(&proof)
        .is_err()
    {
        refuse(s, p, "authentication failed");
        return Err(Error::AuthFailed {
            peer: p.peer.clone(),
            why: "the client does not know the cluster secret".into(),
        });
    }
    if client_epoch != p.epoch {
        let mut f = vec![VERDICT_EPOCH];
        f.extend_from_slice(&p.epoch.to_le_bytes());
        let _ = send_frame(s, &p.peer, &f);
        return Err(Error::EpochMismatch {
            peer: p.peer.clone(),
            ours: p.epoch,
            theirs: client_epoch,
        });
    }
    Ok(Session::new(p.secret, nc, &ns, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn later() -> Instant {
        Instant::now() + std::time::Duration::from_secs(10)
    }

    fn params<'a>(secret: &'a Secret, epoch: u64, be: &'a Backend, peer: &str) -> Params<'a> {
        Params {
            secret,
            epoch,
            backend: be,
            peer: peer.into(),
            deadline: later(),
        }
    }

    fn secrets(cs: &[u8], ss: &[u8]) -> (Secret, Secret) {
        (
            Secret::from_bytes(cs).unwrap(),
            Secret::from_bytes(ss).unwrap(),
        )
    }

    /// Runs both sides; returns each side's result and the client's stream.
    fn sessions(
        cs: &[u8],
        ss: &[u8],
        ce: u64,
        se: u64,
    ) -> (Result<Session>, Result<Session>, UnixStream, UnixStream) {
        let (mut a, b) = UnixStream::pair().unwrap();
        let (cs, ss) = secrets(cs, ss);
        let server = std::thread::spawn(move || {
            let mut b = b;
            let be = Backend::Local;
            let r = server(&mut b, &params(&ss, se, &be, "client"));
            (r, b)
        });
        let be = Backend::Local;
        let c = client(&mut a, &params(&cs, ce, &be, "server"));
        let (s, b) = server.join().unwrap();
        (c, s, a, b)
    }

    fn run(cs: &[u8], ss: &[u8], ce: u64, se: u64) -> (Result<()>, Result<()>) {
        let (c, s, _, _) = sessions(cs, ss, ce, se);
        (c.map(|_| ()), s.map(|_| ()))
    }

    /// Runs the pipelined handshake: the client's result (the server's frame) and
    /// whether the server's `respond` ran.
    fn pipelined(cs: &[u8], ss: &[u8], refuse_setup: bool) -> (Result<Vec<u8>>, bool) {
        pipelined_at(cs, ss, 1, refuse_setup)
    }

    fn pipelined_at(cs: &[u8], ss: &[u8], ce: u64, refuse_setup: bool) -> (Result<Vec<u8>>, bool) {
        let (mut a, b) = UnixStream::pair().unwrap();
        let (cs, ss) = secrets(cs, ss);
        let server = std::thread::spawn(move || {
            let mut b = b;
            let be = Backend::Local;
            let mut ran = false;
            let _ = server_with_setup(&mut b, &params(&ss, 1, &be, "client"), |setup| {
                ran = true;
                assert_eq!(setup, b"ring and bell");
                if refuse_setup {
                    return Err(protocol("client", "not a ring file"));
                }
                Ok(b"domain and bell".to_vec())
            });
            ran
        });
        let be = Backend::Local;
        let c = client_with_setup(&mut a, &params(&cs, ce, &be, "server"), b"ring and bell");
        let ran = server.join().unwrap();
        (c.map(|(_, reply)| reply), ran)
    }

    #[test]
    fn setup_frames_ride_with_the_proof_and_the_verdict() {
        let same = b"0123456789abcdef";
        let (reply, ran) = pipelined(same, same, false);
        assert_eq!(reply.unwrap(), b"domain and bell");
        assert!(ran);
        // A setup the server refuses is refused to the client (the reason stays in
        // the server's log).
        let (reply, ran) = pipelined(same, same, true);
        assert!(ran);
        match reply {
            Err(Error::AuthFailed { why, .. }) => assert!(why.contains("setup"), "{why}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        // A client without the secret stops at the server's challenge.
        let (reply, ran) = pipelined(b"fedcba9876543210", same, false);
        assert!(!ran);
        assert!(matches!(reply, Err(Error::AuthFailed { .. })), "{reply:?}");
        // A client of another epoch sends its proof and its setup: the server
        // refuses the proof's epoch and never looks at the setup.
        let (reply, ran) = pipelined_at(same, same, 2, false);
        assert!(!ran);
        assert!(
            matches!(reply, Err(Error::EpochMismatch { theirs: 1, .. })),
            "{reply:?}"
        );
    }

    #[test]
    fn setup_frames_are_sealed_against_tampering_and_reflection() {
        let (c, s, mut a, mut b) = sessions(b"0123456789abcdef", b"0123456789abcdef", 1, 1);
        let (c, s) = (c.unwrap(), s.unwrap());
        let secret = Secret::from_bytes(b"0123456789abcdef").unwrap();
        let be = Backend::Local;
        let p = params(&secret, 1, &be, "peer");
        c.send(&mut a, &p, b"endpoint-name").unwrap();
        assert_eq!(s.recv(&mut b, &p).unwrap(), b"endpoint-name");
        // The client's own frame reflected back to it does not verify.
        c.send(&mut a, &p, b"reflected").unwrap();
        let frame = recv_frame(&mut b, "x", later()).unwrap();
        send_frame(&mut b, "x", &frame).unwrap();
        assert!(matches!(c.recv(&mut a, &p), Err(Error::AuthFailed { .. })));
        // A frame altered in transit does not verify.
        s.send(&mut b, &p, b"genuine").unwrap();
        let mut frame = recv_frame(&mut a, "x", later()).unwrap();
        frame[0] ^= 1;
        send_frame(&mut b, "x", &frame).unwrap();
        assert!(matches!(c.recv(&mut a, &p), Err(Error::AuthFailed { .. })));
    }

    #[test]
    fn same_secret_and_epoch_is_accepted() {
        let (c, s) = run(b"0123456789abcdef", b"0123456789abcdef", 7, 7);
        assert!(c.is_ok() && s.is_ok(), "{c:?} {s:?}");
    }

    #[test]
    fn wrong_secret_is_refused_on_both_sides() {
        let (c, s) = run(b"0123456789abcdef", b"0123456789abcdeX", 1, 1);
        assert!(matches!(c, Err(Error::AuthFailed { .. })), "{c:?}");
        assert!(matches!(s, Err(Error::AuthFailed { .. })), "{s:?}");
    }

    #[test]
    fn epoch_mismatch_names_both_epochs() {
        let (c, s) = run(b"0123456789abcdef", b"0123456789abcdef", 3, 5);
        assert_eq!(
            c,
            Err(Error::EpochMismatch {
                peer: "server".into(),
                ours: 3,
                theirs: 5
            })
        );
        assert!(matches!(
            s,
            Err(Error::EpochMismatch {
                ours: 5,
                theirs: 3,
                ..
            })
        ));
    }

    #[test]
    fn a_tag_verifies_only_for_its_secret_context_and_data() {
        let (a, b) = (Secret::generate(), Secret::generate());
        let t = a.tag(b"ctx", b"data");
        assert!(a.verify_tag(b"ctx", b"data", &t));
        assert!(!b.verify_tag(b"ctx", b"data", &t), "another secret");
        assert!(!a.verify_tag(b"ctx2", b"data", &t), "another context");
        assert!(!a.verify_tag(b"ctx", b"datb", &t), "other data");
        // The context's length is part of the tag: ("ab", "c") is not ("a", "bc").
        assert!(!a.verify_tag(b"ab", b"c", &a.tag(b"a", b"bc")));
        assert!(!a.verify_tag(b"ctx", b"data", &t[..15]), "a cut tag");
        let mut bent = t;
        bent[15] ^= 1;
        assert!(!a.verify_tag(b"ctx", b"data", &bent), "a changed tag");
    }

    #[test]
    fn garbage_hello_is_refused_without_panic() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let secret = Secret::from_bytes(b"0123456789abcdef").unwrap();
        let t = std::thread::spawn(move || {
            let be = Backend::Local;
            server(&mut b, &params(&secret, 1, &be, "x")).map(|_| ())
        });
        send_frame(&mut a, "s", b"GET / HTTP/1.1\r\n").unwrap();
        assert!(matches!(t.join().unwrap(), Err(Error::Protocol { .. })));
        let reply = recv_frame(&mut a, "s", later()).unwrap();
        assert_eq!(reply[0], VERDICT_REFUSED);
        // A frame claiming 4 GiB is refused before anything is allocated.
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&u32::MAX.to_le_bytes()).unwrap();
        assert!(matches!(
            recv_frame(&mut b, "x", later()),
            Err(Error::Protocol { .. })
        ));
        // A peer that trickles bytes is cut off at the handshake deadline.
        let (mut a, mut b) = UnixStream::pair().unwrap();
        a.write_all(&[4, 0]).unwrap();
        let soon = Instant::now() + std::time::Duration::from_millis(50);
        b.set_read_timeout(Some(std::time::Duration::from_millis(20)))
            .unwrap();
        let t = std::thread::spawn(move || {
            for _ in 0..20 {
                std::thread::sleep(std::time::Duration::from_millis(10));
                if a.write_all(&[0]).is_err() {
                    break;
                }
            }
        });
        assert!(matches!(
            recv_frame(&mut b, "x", soon),
            Err(Error::PeerGone { .. })
        ));
        drop(b);
        t.join().unwrap();
    }
}
