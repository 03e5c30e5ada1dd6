//! The earliest instant a polled row can have become queryable, per row.
//!
//! A poll sent at `send` with a lower bound `since` returns every row visible at its
//! snapshot (some instant between its send and its response) whose time is at or after
//! `since`. So a row with time `t` that a poll did **not** return, though `since <= t`,
//! was not visible at that poll's snapshot, hence became visible after its send. The
//! earliest instant a newly found row can have become visible is the latest send among
//! the polls answered before that covered its time: [`Covering::earliest`]. Nothing
//! here depends on the polls' order or on how many pollers sent them: each answered poll
//! that covered the row and did not return it is a proof, and the latest one is the
//! sharpest.
//!
//! Where the store's own time of the row is this host's clock (the store runs here) and is
//! the time the store took the row (InfluxDB's point time, a PostgreSQL insert default),
//! it is a second proof: a row cannot be queryable before the store took it.

use std::collections::VecDeque;

/// Most answered polls remembered. The oldest are forgotten first; a row older than every
/// remembered poll's lower bound falls back to [`Earliest::Fallback`].
const CAPACITY: usize = 1 << 16;

/// The answered polls, as `(since, latest send so far)`: `since` made non-decreasing
/// (a poll is taken to cover only rows at or after the largest `since` seen so far, which
/// can only leave out proofs, never claim a wrong one), and the latest send of every poll
/// up to it.
#[derive(Debug, Default)]
pub(crate) struct Covering {
    polls: VecDeque<(i64, i64)>,
}

/// Where a row's earliest instant comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Earliest {
    /// The send of the last answered poll that covered the row's time and did not return
    /// it.
    Poll(i64),
    /// The row's own store time, later than any such poll's send.
    StoreTime(i64),
    /// No answered poll covered the row (they were all forgotten): the message's publish
    /// stamp, a bound that holds whatever the store did.
    Fallback(i64),
}

impl Earliest {
    /// The instant, `CLOCK_REALTIME` ns.
    pub(crate) fn ns(self) -> i64 {
        match self {
            Self::Poll(n) | Self::StoreTime(n) | Self::Fallback(n) => n,
        }
    }
}

impl Covering {
    /// An answered poll: sent at `send_ns`, returning rows at or after `since_ns` (`None`:
    /// every row).
    pub(crate) fn push(&mut self, since_ns: Option<i64>, send_ns: i64) {
        let since = since_ns.unwrap_or(i64::MIN);
        let (since, latest) = match self.polls.back() {
            Some(&(s, l)) => (since.max(s), send_ns.max(l)),
            None => (since, send_ns),
        };
        self.polls.push_back((since, latest));
        if self.polls.len() > CAPACITY {
            self.polls.pop_front();
        }
    }

    /// The latest send of the remembered polls that covered time `row_ns` (returned no
    /// such row), if any.
    pub(crate) fn latest_covering(&self, row_ns: i64) -> Option<i64> {
        let n = self.polls.partition_point(|&(since, _)| since <= row_ns);
        n.checked_sub(1).map(|i| self.polls[i].1)
    }

    /// The earliest instant a row of time `row_ns`, first returned by a poll answered at
    /// `resp_ns`, can have become queryable. `store_time`: the row time is this host's
    /// clock and the store's own time of taking the row. `fallback`: the message's publish
    /// stamp, for a row no remembered poll covered. `proof_after`: only a poll sent after
    /// this instant asked for the row's series (`i64::MIN`: every poll did); the latest
    /// covering poll sent no later proves nothing. An instant after `resp_ns` (a clock
    /// that disagrees) is never used.
    pub(crate) fn earliest(
        &self,
        row_ns: i64,
        resp_ns: i64,
        store_time: bool,
        fallback: i64,
        proof_after: i64,
    ) -> Earliest {
        let poll = self
            .latest_covering(row_ns)
            .filter(|&s| s <= resp_ns && s > proof_after);
        let own = (store_time && row_ns <= resp_ns).then_some(row_ns);
        match (poll, own) {
            (Some(p), Some(o)) if o > p => Earliest::StoreTime(o),
            (Some(p), _) => Earliest::Poll(p),
            (None, Some(o)) => Earliest::StoreTime(o.max(fallback.min(resp_ns))),
            (None, None) => Earliest::Fallback(fallback.min(resp_ns)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_poll_that_covered_the_row_bounds_it() {
        let mut c = Covering::default();
        // The baseline returns every row; then polls from newest - 1 s.
        c.push(None, 100);
        c.push(Some(1_000), 200);
        c.push(Some(1_500), 300);
        // A row at 1,200: the baseline and the poll from 1,000 covered it; the one from
        // 1,500 did not.
        assert_eq!(c.latest_covering(1_200), Some(200));
        assert_eq!(c.latest_covering(2_000), Some(300));
        assert_eq!(
            c.latest_covering(-5),
            Some(100),
            "the baseline covers everything"
        );
        assert_eq!(
            c.earliest(1_200, 400, false, 50, i64::MIN),
            Earliest::Poll(200)
        );
        // Its own store time, later than that poll's send, is sharper.
        assert_eq!(
            c.earliest(250, 400, true, 50, i64::MIN),
            Earliest::StoreTime(250)
        );
        // A store time after the response is a clock that disagrees: not used.
        assert_eq!(
            c.earliest(2_000, 400, true, 50, i64::MIN),
            Earliest::Poll(300)
        );
        // A row of a series first asked for by polls sent after 250: the latest covering
        // poll (sent at 200) did not ask for it, so only its store time or the fallback
        // bound it.
        assert_eq!(
            c.earliest(1_200, 400, false, 50, 250),
            Earliest::Fallback(50)
        );
        assert_eq!(
            c.earliest(350, 400, true, 50, 250),
            Earliest::StoreTime(350)
        );
        assert_eq!(c.earliest(2_000, 400, false, 50, 250), Earliest::Poll(300));
    }

    #[test]
    fn polls_answered_out_of_order_never_claim_more_than_they_proved() {
        let mut c = Covering::default();
        // Two pollers: the poll from 1,000 sent at 300 answered before the one from 900
        // sent at 250. The second is taken to cover from 1,000 only (left out below it).
        c.push(Some(1_000), 300);
        c.push(Some(900), 250);
        assert_eq!(c.latest_covering(950), None);
        assert_eq!(c.latest_covering(1_000), Some(300));
        // Nothing covered: the publish stamp, and never after the response.
        assert_eq!(
            c.earliest(950, 400, false, 120, i64::MIN),
            Earliest::Fallback(120)
        );
        assert_eq!(
            c.earliest(950, 400, false, 900, i64::MIN),
            Earliest::Fallback(400)
        );
    }

    #[test]
    fn it_stays_bounded() {
        let mut c = Covering::default();
        for i in 0..(CAPACITY as i64 + 10) {
            c.push(Some(i), i);
        }
        assert_eq!(c.polls.len(), CAPACITY);
        assert_eq!(c.latest_covering(5), None, "the oldest polls are forgotten");
        assert_eq!(
            c.latest_covering(CAPACITY as i64 + 9),
            Some(CAPACITY as i64 + 9)
        );
    }
}
