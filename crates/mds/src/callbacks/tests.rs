//! Unit tests of the callbacks' bookkeeping (leases, watches, recalls, held replies).

use super::*;

fn conn(n: u32) -> ConnId {
    n
}

/// A change of directory `ino` (removing `removed`), or with no names, of a file.
fn changed(ino: u64, removed: &[&str]) -> Changed {
    Changed {
        ino,
        removed: removed.iter().map(|n| n.as_bytes().to_vec()).collect(),
        dir: !removed.is_empty(),
    }
}

fn ok() -> Reply {
    Reply::Ok(orion_proto::ReplyBody::Empty)
}

const LEASE: Duration = Duration::from_millis(200);

/// Callbacks past their first quiet time, at the returned instant, with instance
/// `i` holding a lease on connection `10 * i` for each `i` of `instances`.
fn started(instances: &[u64]) -> (Callbacks, Instant) {
    let t0 = Instant::now();
    let mut cb = Callbacks::new(LEASE, t0);
    let t = t0 + LEASE;
    for &i in instances {
        assert_eq!(cb.lease(i, conn(10 * i as u32), false, t), 200);
    }
    (cb, t)
}

/// A number freed by a destroyed inode and taken by a new one stays watched by
/// whoever watched it, until that client unwatches it (its kernel forgot the
/// old inode) or answers the recall the destruction sent (nothing answers here):
/// the client counts its watches by number, and one that still counts this
/// number caches the new inode on the strength of that watch.
#[test]
fn the_number_of_a_destroyed_inode_stays_watched_until_unwatched() {
    let (mut cb, _) = started(&[1, 2]);
    cb.watch(2, &[7, 8]).unwrap();
    assert_eq!(cb.on_changes(Some(1), &[changed(7, &[])]).len(), 1);
    // 7 destroyed and taken again: a change to it still calls 2 back.
    assert_eq!(cb.on_changes(Some(1), &[changed(7, &[])]).len(), 1);
    cb.unwatch(2, &[7]);
    assert!(cb.on_changes(Some(1), &[changed(7, &[])]).is_empty());
    assert_eq!(
        cb.on_changes(Some(1), &[changed(8, &[])]).len(),
        1,
        "8 lives"
    );
}

#[test]
fn a_change_waits_for_the_other_watchers_and_not_for_its_author() {
    let (mut cb, t) = started(&[1, 2]);
    cb.watch(2, &[5, 9]).unwrap();
    // Instance 1 removes a name from directory 5 and changes inode 7 (nobody's).
    let waits = cb.on_changes(Some(1), &[changed(5, &["x"]), changed(7, &[])]);
    assert_eq!(waits.len(), 1, "only instance 2 watches");
    assert!(cb
        .hold((conn(11), 1, ok()), (Some(1), None), waits, t)
        .is_none());
    let (msgs, cut) = cb.take_outgoing(t);
    assert!(cut.is_empty());
    assert_eq!(msgs.len(), 1);
    let (c, id, MdsToClient::Invalidate { items }) = &msgs[0];
    assert_eq!(*c, conn(20));
    assert_eq!(
        items,
        &vec![
            Invalidation::Inode(5),
            Invalidation::Entry {
                parent: 5,
                name: b"x".to_vec()
            }
        ]
    );
    assert!(cb.release(t).is_empty(), "not answered yet");
    assert!(cb.answered(conn(20), *id, |_, _| false));
    assert_eq!(cb.release(t).len(), 1);
    assert_eq!(cb.lease(2, conn(20), false, t), 200);
    // Once instance 2 unwatches 9, a change of 9 waits for nobody.
    cb.unwatch(2, &[9]);
    assert!(cb.on_changes(Some(1), &[changed(9, &[])]).is_empty());
    // The author watches what it changed: instance 2's change of 7 waits for it.
    let waits = cb.on_changes(Some(2), &[changed(7, &[])]);
    assert_eq!(waits.len(), 1);
    assert_eq!(waits[0].0, 1);
}

/// One recall per grant: changes to a watched file wait for the one recall's
/// answer, then call nobody back until the file is watched again; a watch asked
/// while the recall is under way keeps the file watched.
#[test]
fn a_file_is_recalled_once_and_called_back_again_only_once_watched_again() {
    let (mut cb, t) = started(&[1, 2]);
    cb.watch(2, &[7]).unwrap();
    let first = cb.on_changes(Some(1), &[changed(7, &[])]);
    assert_eq!(first.len(), 1);
    // A second change before the answer waits for the same callback.
    assert_eq!(cb.on_changes(Some(1), &[changed(7, &[])]), first);
    let (msgs, _) = cb.take_outgoing(t);
    assert_eq!(msgs.len(), 1, "one message for both changes");
    let (_, id, MdsToClient::Invalidate { items }) = &msgs[0];
    assert_eq!(items, &vec![Invalidation::Recall(7)]);
    assert!(cb.answered(conn(20), *id, |_, _| false));
    // The grant is gone: later changes wait for nobody, and send nothing.
    for _ in 0..100 {
        assert!(cb.on_changes(Some(1), &[changed(7, &[])]).is_empty());
    }
    assert!(cb.take_outgoing(t).0.is_empty());
    // Watched again (the client looked at it): one more recall.
    cb.watch(2, &[7]).unwrap();
    let again = cb.on_changes(Some(1), &[changed(7, &[])]);
    assert_eq!(again.len(), 1);
    let (msgs, _) = cb.take_outgoing(t);
    let (_, id, _) = &msgs[0];
    // A watch that came while the recall was under way outlives its answer.
    cb.watch(2, &[7]).unwrap();
    assert!(cb.answered(conn(20), *id, |_, _| false));
    assert_eq!(cb.on_changes(Some(1), &[changed(7, &[])]).len(), 1);
}

/// A client whose kernel keeps files' data keeps its watches: every change calls
/// it back.
#[test]
fn a_data_caching_client_is_called_back_at_every_change_of_a_file() {
    let (mut cb, t) = started(&[1]);
    cb.lease(2, conn(20), true, t);
    cb.watch(2, &[7]).unwrap();
    for _ in 0..3 {
        assert_eq!(cb.on_changes(Some(1), &[changed(7, &[])]).len(), 1);
        let (msgs, _) = cb.take_outgoing(t);
        let (_, id, MdsToClient::Invalidate { items }) = &msgs[0];
        assert_eq!(items, &vec![Invalidation::Inode(7)]);
        assert!(cb.answered(conn(20), *id, |_, _| false));
    }
}

/// A recalled file the client holds open stays watched once the recall is
/// answered (it may be mapped): the next change calls it back again.
#[test]
fn a_recalled_file_held_open_stays_watched() {
    let (mut cb, t) = started(&[1, 2]);
    cb.watch(2, &[7, 8]).unwrap();
    assert_eq!(
        cb.on_changes(Some(1), &[changed(7, &[]), changed(8, &[])])
            .len(),
        1
    );
    let (msgs, _) = cb.take_outgoing(t);
    let (_, id, _) = &msgs[0];
    assert!(cb.answered(conn(20), *id, |i, ino| i == 2 && ino == 7));
    assert_eq!(
        cb.on_changes(Some(1), &[changed(7, &[])]).len(),
        1,
        "7 is open"
    );
    assert!(
        cb.on_changes(Some(1), &[changed(8, &[])]).is_empty(),
        "8 is not"
    );
}

#[test]
fn a_directory_is_called_back_at_every_change() {
    let (mut cb, t) = started(&[1, 2]);
    cb.watch(2, &[5]).unwrap();
    for name in ["a", "b", "c"] {
        let waits = cb.on_changes(Some(1), &[changed(5, &[name])]);
        assert_eq!(waits.len(), 1);
        let (msgs, _) = cb.take_outgoing(t);
        let (_, id, _) = &msgs[0];
        assert!(cb.answered(conn(20), *id, |_, _| false));
    }
}

#[test]
fn a_silent_watcher_is_waited_for_until_its_lease_ends() {
    let (mut cb, t) = started(&[2]);
    cb.watch(2, &[5]).unwrap();
    let waits = cb.on_changes(None, &[changed(5, &[])]);
    assert!(cb
        .hold((conn(11), 1, ok()), (None, None), waits, t)
        .is_none());
    cb.take_outgoing(t);
    assert!(cb.release(t + LEASE / 2).is_empty());
    assert_eq!(cb.release(t + LEASE).len(), 1, "its lease ran out");
}

#[test]
fn a_broken_callback_connection_and_a_new_mds_hold_every_change_for_a_lease() {
    let lease = LEASE;
    let t0 = Instant::now();
    let mut cb = Callbacks::new(lease, t0);
    // The first lease after the start: a change nobody watches still waits.
    assert!(cb
        .hold((conn(1), 1, ok()), (None, None), vec![], t0)
        .is_none());
    assert!(cb.release(t0 + lease / 2).is_empty());
    assert_eq!(cb.release(t0 + lease).len(), 1);
    let t = t0 + lease;
    cb.lease(2, conn(20), false, t);
    cb.watch(2, &[5]).unwrap();
    cb.departed(conn(20));
    assert!(cb.watch(2, &[6]).is_err(), "no callback connection");
    let waits = cb.on_changes(None, &[changed(9, &[])]);
    assert!(waits.is_empty());
    assert!(cb
        .hold((conn(1), 2, ok()), (None, None), waits, t)
        .is_none());
    assert!(cb.release(t + lease / 2).is_empty());
    assert_eq!(cb.release(t + lease).len(), 1);
}

#[test]
fn an_ended_lease_holds_nothing_up_and_a_retry_waits_as_the_first_answer() {
    let (mut cb, t) = started(&[1, 2]);
    cb.watch(2, &[5]).unwrap();
    // Instance 1's change (its client's nonce 7, request 3) waits for 2.
    let waits = cb.on_changes(Some(1), &[changed(5, &[])]);
    assert!(cb
        .hold(
            (conn(11), 3, ok()),
            (Some(1), Some((7, 3))),
            waits.clone(),
            t
        )
        .is_none());
    // Its connection broke; asked again, the answer waits for the same.
    assert_eq!(cb.waits_of(7, 3), waits);
    assert!(cb
        .hold((conn(12), 9, ok()), (None, None), waits, t)
        .is_none());
    // Instance 2 unmounts: its lease ends, no quiet time follows.
    cb.end_lease(conn(20));
    assert_eq!(cb.release(t).len(), 2);
    assert!(cb
        .hold((conn(11), 4, ok()), (None, None), vec![], t)
        .is_some());
}

#[test]
fn two_authors_that_wait_for_each_other_wait_briefly() {
    let (mut cb, t) = started(&[1, 2]);
    cb.watch(1, &[5]).unwrap();
    cb.watch(2, &[5]).unwrap();
    let w1 = cb.on_changes(Some(1), &[changed(5, &["a"])]);
    assert!(cb
        .hold((conn(11), 1, ok()), (Some(1), None), w1, t)
        .is_none());
    let w2 = cb.on_changes(Some(2), &[changed(5, &["b"])]);
    assert!(cb
        .hold((conn(21), 1, ok()), (Some(2), None), w2, t)
        .is_none());
    assert_eq!(cb.take_outgoing(t).0.len(), 2);
    assert!(cb.release(t).is_empty());
    assert_eq!(cb.release(t + BUSY_PATIENCE).len(), 2);
}

#[test]
fn a_lapsed_lease_holds_nothing_up_and_is_cut_only_when_its_callbacks_go_unanswered() {
    let (mut cb, t) = started(&[1, 2]);
    cb.watch(2, &[5]).unwrap();
    // Instance 2 went idle: its lease ran out, its watch stays.
    let idle = t + LEASE * 3;
    let waits = cb.on_changes(Some(1), &[changed(5, &[])]);
    assert_eq!(waits.len(), 1, "a lapsed lease keeps its watches");
    assert!(cb
        .hold((conn(10), 1, ok()), (Some(1), None), waits, idle)
        .is_none());
    let (msgs, cut) = cb.take_outgoing(idle);
    assert_eq!(msgs.len(), 1, "it is called back all the same");
    assert!(cut.is_empty());
    // Nothing waits for its answer: its kernel holds nothing any more.
    assert_eq!(cb.release(idle).len(), 1);
    // Unanswered for less than a lease: not stuck.
    assert!(cb.take_outgoing(idle + LEASE / 2).1.is_empty());
    // Answered: nothing left to cut, and a renewal grants a lease again.
    let (_, id, _) = &msgs[0];
    assert!(cb.answered(conn(20), *id, |_, _| false));
    assert!(cb.take_outgoing(idle + LEASE * 2).1.is_empty());
    assert_eq!(cb.lease(2, conn(20), false, idle + LEASE * 2), 200);
    // A callback unanswered for a whole lease past the lease's end is stuck.
    let later = idle + LEASE * 4;
    cb.watch(2, &[6]).unwrap();
    let waits = cb.on_changes(Some(1), &[changed(6, &[])]);
    assert_eq!(waits.len(), 1);
    assert_eq!(cb.take_outgoing(later).0.len(), 1);
    assert!(cb.take_outgoing(later + LEASE / 2).1.is_empty());
    assert_eq!(cb.take_outgoing(later + LEASE).1, vec![conn(20)]);
}
