use std::collections::VecDeque;

use rumqttc::{PubRel, Publish, QoS, Request};

use super::resend::{Keeper, Kind};
use super::*;

fn publish(pkid: u16, body: &str) -> Request {
    let mut p = Publish::new("t", QoS::AtLeastOnce, body.as_bytes().to_vec());
    p.pkid = pkid;
    Request::Publish(p)
}

fn pkid_dup(r: &Request) -> (u16, bool) {
    match r {
        Request::Publish(p) => (p.pkid, p.dup),
        other => panic!("not a publish: {other:?}"),
    }
}

#[test]
fn a_break_keeps_in_flight_and_queued_publishes_and_counts_each_resend_once() {
    let shared = Shared::default();
    let mut k = Keeper::new();
    // rumqttc's pending list after a break: two publishes in flight (with packet ids),
    // one from the request channel, a QoS 2 release; and a publish parked on a
    // packet id collision.
    let mut pending: VecDeque<Request> = VecDeque::from([
        publish(5, "a"),
        publish(6, "b"),
        publish(0, "c"),
        Request::PubRel(PubRel::new(7)),
    ]);
    k.take(&mut pending, Some(publish(0, "d")), &shared);
    assert!(pending.is_empty());
    assert_eq!(k.kept.len(), 4);
    assert_eq!(k.unacked(), 3, "a, b and the released one were written");

    // No room in the window: nothing is handed back.
    k.feed(&mut pending, false);
    assert!(pending.is_empty());
    // One at a time, with a fresh packet id and DUP for one written before.
    k.feed(&mut pending, true);
    k.feed(&mut pending, true);
    assert_eq!(pending.len(), 1);
    assert_eq!(pkid_dup(&pending[0]), (0, true));
    k.settle(&pending, &shared);
    assert_eq!(shared.retransmitted.load(Relaxed), 0, "not taken yet");
    pending.clear(); // rumqttc writes it
    k.settle(&pending, &shared);
    assert_eq!(shared.retransmitted.load(Relaxed), 1);

    // b is handed back, then the connection breaks before rumqttc takes it: it stays
    // kept, at the front, and a publish written on the new connection joins it.
    k.feed(&mut pending, true);
    let b = pending.pop_front().unwrap();
    pending.push_back(b);
    pending.push_back(publish(9, "e"));
    k.take(&mut pending, None, &shared);
    assert_eq!(shared.retransmitted.load(Relaxed), 1, "b was not sent");
    let order: Vec<_> = k.kept.iter().map(|(_, kind)| *kind).collect();
    assert_eq!(
        order,
        [Kind::InFlight, Kind::Queued, Kind::Queued, Kind::InFlight]
    );

    // b is handed back and written, then the connection breaks while it is in flight:
    // rumqttc returns it with its new packet id. Its write counts, and it is kept again.
    k.feed(&mut pending, true);
    let Request::Publish(mut b) = pending.pop_front().unwrap() else {
        unreachable!()
    };
    b.pkid = 3;
    pending.push_back(Request::Publish(b));
    k.take(&mut pending, None, &shared);
    assert_eq!(shared.retransmitted.load(Relaxed), 2);
    assert_eq!(k.kept.len(), 4);

    // The queued ones count as requeued when written.
    for _ in 0..4 {
        k.feed(&mut pending, true);
        pending.clear();
        k.settle(&pending, &shared);
    }
    assert_eq!(
        (
            shared.retransmitted.load(Relaxed),
            shared.requeued.load(Relaxed)
        ),
        (4, 2)
    );
    assert_eq!(k.unacked(), 1, "only the dropped release is left");
}
