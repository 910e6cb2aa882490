//! A caller that waits for two requests at once (a call and the ping that asks
//! whether its server is still there) gets the call's reply when both replies arrive
//! together, the ping's first: the call's reply is not dropped as a late one.

use std::time::Duration;

use orion_fabric::{Backend, Domain, FabricConfig, Secret};
use orion_proto::{Channel, Reply, ReplyBody};

/// A server and a client channel, connected over the local fabric.
fn pair() -> (Channel, Channel, orion_fabric::CompletionQueue, Vec<Domain>) {
    let cfg = FabricConfig::new(Backend::Local, Secret::generate());
    let server = Domain::open(cfg.clone()).unwrap();
    let listener = server.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let server_cq = server.completion_queue().unwrap();
    let client = Domain::open(cfg).unwrap();
    let client_cq = client.completion_queue().unwrap();
    let connecting = std::thread::spawn(move || {
        let conn = client.connect(&addr, &client_cq).unwrap();
        (client, client_cq, conn)
    });
    let accepted = listener
        .accept(&server_cq, Duration::from_secs(10))
        .unwrap();
    let (client, client_cq, conn) = connecting.join().unwrap();
    let at_server = Channel::new(&server, accepted).unwrap();
    let at_client = Channel::new(&client, conn).unwrap();
    (at_server, at_client, client_cq, vec![server, client])
}

#[test]
fn the_calls_reply_wins_over_a_ping_reply_that_came_with_it() {
    let (mut at_server, mut at_client, client_cq, _domains) = pair();
    let (call, ping) = (7, 8);
    // Both replies leave together, the ping's first, and both have arrived before
    // the caller looks.
    at_server
        .send_reply(ping, &Reply::Ok(ReplyBody::Empty))
        .unwrap();
    let answer = Reply::Ok(ReplyBody::Unknown);
    at_server.send_reply(call, &answer).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut other = Vec::new();
    let (id, reply) = at_client
        .wait_reply(
            &client_cq,
            &[call, ping],
            Duration::from_secs(5),
            &mut other,
        )
        .unwrap();
    assert_eq!((id, reply), (call, answer));
}

/// Of two replies to one id in one batch (a malformed message's error reply carries
/// id 0), the first stands.
#[test]
fn of_two_replies_to_one_id_the_first_stands() {
    let (mut at_server, mut at_client, client_cq, _domains) = pair();
    let first = Reply::Err {
        errno: 71,
        message: "first".into(),
    };
    at_server.send_reply(0, &first).unwrap();
    at_server
        .send_reply(0, &Reply::Ok(ReplyBody::Empty))
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut other = Vec::new();
    let (id, reply) = at_client
        .wait_reply(&client_cq, &[0], Duration::from_secs(5), &mut other)
        .unwrap();
    assert_eq!((id, reply), (0, first));
}
