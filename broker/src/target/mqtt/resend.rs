//! The publishes a broken connection sets aside, kept and handed back after the
//! reconnection within the in-flight window (see the parent module).

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;

use rumqttc::QoS;

use super::shared::Shared;

/// What a request set aside at a broken connection was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A publish written before the break and not acknowledged.
    InFlight,
    /// A publish still queued in the client at the break.
    Queued,
}

/// The requests of either protocol version that a break sets aside.
pub(super) trait Resendable: Sized {
    /// What a request taken from rumqttc's pending list at a break is: a publish with a
    /// packet id was written (rumqttc's in-flight state); one without came from the
    /// request channel. `None`: not a publish.
    fn kind(&self) -> Option<Kind>;
    /// Makes a kept publish fit for the next session: rumqttc gives it a fresh packet id,
    /// and DUP says it may have been sent before.
    fn renew(&mut self, kind: Kind);
    /// Identifies a publish while it moves between lists: its payload's address and length.
    fn identity(&self) -> Option<(usize, usize)>;
    /// Whether this is a QoS 2 release (PUBREL).
    fn is_release(&self) -> bool;
}

impl Resendable for rumqttc::Request {
    fn kind(&self) -> Option<Kind> {
        match self {
            Self::Publish(p) if p.pkid != 0 => Some(Kind::InFlight),
            Self::Publish(_) => Some(Kind::Queued),
            _ => None,
        }
    }

    fn renew(&mut self, kind: Kind) {
        if let Self::Publish(p) = self
            && p.qos != QoS::AtMostOnce
        {
            p.pkid = 0;
            p.dup = kind == Kind::InFlight;
        }
    }

    fn identity(&self) -> Option<(usize, usize)> {
        match self {
            Self::Publish(p) => Some((p.payload.as_ptr() as usize, p.payload.len())),
            _ => None,
        }
    }

    fn is_release(&self) -> bool {
        matches!(self, Self::PubRel(_))
    }
}

impl Resendable for rumqttc::v5::Request {
    fn kind(&self) -> Option<Kind> {
        match self {
            Self::Publish(p) if p.pkid != 0 => Some(Kind::InFlight),
            Self::Publish(_) => Some(Kind::Queued),
            _ => None,
        }
    }

    fn renew(&mut self, kind: Kind) {
        if let Self::Publish(p) = self
            && p.qos != rumqttc::v5::mqttbytes::QoS::AtMostOnce
        {
            p.pkid = 0;
            p.dup = kind == Kind::InFlight;
        }
    }

    fn identity(&self) -> Option<(usize, usize)> {
        match self {
            Self::Publish(p) => Some((p.payload.as_ptr() as usize, p.payload.len())),
            _ => None,
        }
    }

    fn is_release(&self) -> bool {
        matches!(self, Self::PubRel(_))
    }
}

/// Publishes kept across broken connections of one publishing connection.
///
/// At a break, rumqttc moves what was in flight and what was still queued into its
/// pending list, which it clears when the broker answers the reconnection with a new
/// session. [`Keeper::take`] empties that list at the break; after the reconnection
/// [`Keeper::feed`] puts one kept publish at a time back into it, only while the in-flight
/// window has room (rumqttc sends pending requests before anything else and without
/// flow control, so a longer list would overrun the window and collide on packet ids);
/// [`Keeper::settle`] counts each one once rumqttc has taken it.
pub(super) struct Keeper<R> {
    pub(super) kept: VecDeque<(R, Kind)>,
    /// The kept publish now in rumqttc's pending list: its kind and identity.
    pub(super) given: Option<(Kind, Option<(usize, usize)>)>,
    /// QoS 2 releases set aside at a break, dropped (a new session knows nothing of them):
    /// their publishes were written and are never acknowledged.
    pub(super) dropped_unacked: u64,
}

impl<R: Resendable> Keeper<R> {
    pub(super) fn new() -> Self {
        Self {
            kept: VecDeque::new(),
            given: None,
            dropped_unacked: 0,
        }
    }

    /// At a break: takes everything rumqttc set aside, and a publish it parked on a packet
    /// id collision (which it would never send after a new session).
    pub(super) fn take(&mut self, pending: &mut VecDeque<R>, parked: Option<R>, shared: &Shared) {
        let mut taken = std::mem::take(pending);
        if let Some((kind, id)) = self.given.take() {
            // Still where it was put (rumqttc gives a publish its packet id when it takes
            // it): it goes back to the front, and is counted once it is sent.
            let unsent = taken
                .front()
                .is_some_and(|r| r.kind() == Some(Kind::Queued) && r.identity() == id);
            if unsent {
                let r = taken.pop_front().expect("checked");
                self.kept.push_front((r, kind));
            } else {
                // rumqttc took it before the break: written (again), and if it is still
                // unacknowledged it comes back below as in flight.
                count_resent(kind, shared);
            }
        }
        for r in taken.into_iter().chain(parked) {
            match r.kind() {
                Some(Kind::InFlight) => self.kept.push_back((r, Kind::InFlight)),
                Some(Kind::Queued) => self.kept.push_back((r, Kind::Queued)),
                None if r.is_release() => self.dropped_unacked += 1,
                None => {}
            }
        }
    }

    /// Before a poll on a live connection: hands the next kept publish back to rumqttc
    /// when none is waiting there and the in-flight window has `room`.
    pub(super) fn feed(&mut self, pending: &mut VecDeque<R>, room: bool) {
        if self.given.is_none()
            && pending.is_empty()
            && room
            && let Some((mut r, kind)) = self.kept.pop_front()
        {
            r.renew(kind);
            self.given = Some((kind, r.identity()));
            pending.push_back(r);
        }
    }

    /// After a poll: counts the handed-back publish once rumqttc has taken and written it.
    pub(super) fn settle(&mut self, pending: &VecDeque<R>, shared: &Shared) {
        if pending.is_empty()
            && let Some((kind, _)) = self.given.take()
        {
            count_resent(kind, shared);
        }
    }

    /// Publishes held here that were written before and never acknowledged.
    pub(super) fn unacked(&self) -> u64 {
        let given = u64::from(matches!(self.given, Some((Kind::InFlight, _))));
        self.kept
            .iter()
            .filter(|(_, k)| *k == Kind::InFlight)
            .count() as u64
            + given
            + self.dropped_unacked
    }
}

fn count_resent(kind: Kind, shared: &Shared) {
    match kind {
        Kind::InFlight => shared.retransmitted.fetch_add(1, Relaxed),
        Kind::Queued => shared.requeued.fetch_add(1, Relaxed),
    };
}
