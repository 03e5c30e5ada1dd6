//! The records frames an exporter keeps until the collector acknowledges them as durable
//! (collector protocol version 2): bounded in bytes, oldest dropped first, and every
//! dropped record accounted for when the exporter learns what the collector holds.

use std::collections::VecDeque;

/// One numbered records frame, as written to the connection.
#[derive(Debug)]
pub(crate) struct Retained {
    /// The frame's number.
    pub(crate) seq: u64,
    /// Records in it.
    pub(crate) records: u64,
    /// The frame's bytes, length prefix included.
    pub(crate) bytes: Vec<u8>,
    /// It was written to a connection (else it was numbered while the collector was
    /// unreachable and waits for the next connection).
    pub(crate) written: bool,
}

/// Frames sent and not yet acknowledged.
#[derive(Debug)]
pub(crate) struct Retention {
    max_bytes: usize,
    frames: VecDeque<Retained>,
    bytes: usize,
    /// Frames dropped unacknowledged, (number, records), oldest first: whether they are
    /// lost is known only when the collector says what it holds.
    evicted: VecDeque<(u64, u64, bool)>,
    /// Highest number acknowledged.
    acked: u64,
}

impl Retention {
    /// Keeps at most `max_bytes` of frames.
    pub(crate) fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            frames: VecDeque::new(),
            bytes: 0,
            evicted: VecDeque::new(),
            acked: 0,
        }
    }

    /// Keeps a frame just written; returns the records of older frames dropped to make
    /// room (they are then `evicted`).
    pub(crate) fn push(&mut self, frame: Retained) -> u64 {
        self.bytes += frame.bytes.len();
        self.frames.push_back(frame);
        let mut dropped = 0;
        while self.bytes > self.max_bytes {
            let Some(old) = self.frames.pop_front() else {
                break;
            };
            self.bytes -= old.bytes.len();
            dropped += old.records;
            self.evicted.push_back((old.seq, old.records, old.written));
        }
        dropped
    }

    /// The collector holds every frame up to `seq` durably.
    pub(crate) fn ack(&mut self, seq: u64) {
        if seq <= self.acked {
            return;
        }
        self.acked = seq;
        while self.frames.front().is_some_and(|f| f.seq <= seq) {
            let f = self.frames.pop_front().expect("checked");
            self.bytes -= f.bytes.len();
        }
        while self.evicted.front().is_some_and(|&(s, _, _)| s <= seq) {
            self.evicted.pop_front();
        }
    }

    /// After a (re)connection the collector holds frames up to `resume_seq`: forgets
    /// those, and returns the records of evicted frames above it, which are lost. The
    /// frames still kept are then to be sent again ([`Self::frames`]).
    pub(crate) fn resume(&mut self, resume_seq: u64) -> u64 {
        // A restarted collector holds at most what it acknowledged before, or more.
        self.ack(resume_seq);
        self.acked = resume_seq;
        let lost = self.evicted.iter().map(|&(_, n, _)| n).sum();
        self.evicted.clear();
        lost
    }

    /// The frames kept, oldest first.
    #[cfg(test)]
    pub(crate) fn frames(&self) -> impl Iterator<Item = &Retained> {
        self.frames.iter()
    }

    /// The frames kept, oldest first, to mark them written.
    pub(crate) fn frames_mut(&mut self) -> impl Iterator<Item = &mut Retained> {
        self.frames.iter_mut()
    }

    /// At the end, records of evicted frames whose fate no collector told: (written, so
    /// perhaps held; never written, so lost).
    pub(crate) fn evicted_unresolved(&self) -> (u64, u64) {
        self.evicted.iter().fold(
            (0, 0),
            |(w, u), &(_, n, written)| if written { (w + n, u) } else { (w, u + n) },
        )
    }

    /// The newest frame, number `seq`, was written to a connection (kept or, when larger
    /// than the whole buffer, already evicted).
    pub(crate) fn mark_written(&mut self, seq: u64) {
        if let Some(f) = self.frames.back_mut().filter(|f| f.seq == seq) {
            f.written = true;
        } else if let Some(e) = self.evicted.back_mut().filter(|e| e.0 == seq) {
            e.2 = true;
        }
    }

    /// Records kept that were never written to a connection.
    pub(crate) fn unwritten_records(&self) -> u64 {
        self.frames
            .iter()
            .filter(|f| !f.written)
            .map(|f| f.records)
            .sum()
    }

    /// Records kept, not yet acknowledged.
    pub(crate) fn unacked_records(&self) -> u64 {
        self.frames.iter().map(|f| f.records).sum()
    }

    /// Highest number acknowledged.
    #[cfg(test)]
    pub(crate) fn acked(&self) -> u64 {
        self.acked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(seq: u64, records: u64) -> Retained {
        Retained {
            seq,
            records,
            bytes: vec![0; 100],
            written: true,
        }
    }

    #[test]
    fn acks_release_frames_and_the_bound_evicts_the_oldest() {
        let mut r = Retention::new(250);
        assert_eq!(r.push(frame(1, 10)), 0);
        assert_eq!(r.push(frame(2, 20)), 0);
        // A third frame does not fit: frame 1 is evicted.
        assert_eq!(r.push(frame(3, 30)), 10);
        assert_eq!(r.unacked_records(), 50);
        r.ack(2);
        assert_eq!(r.unacked_records(), 30);
        assert_eq!(r.frames().map(|f| f.seq).collect::<Vec<_>>(), [3]);
        // Frame 1 was acknowledged after all: not lost.
        assert_eq!(r.resume(3), 0);
        assert_eq!(r.unacked_records(), 0);
    }

    #[test]
    fn evicted_frames_the_collector_never_held_are_lost_exactly() {
        let mut r = Retention::new(250);
        for seq in 1..=6 {
            r.push(frame(seq, seq * 10));
        }
        // Kept: 5 and 6; evicted 1..=4. The restarted collector holds up to 2.
        let lost = r.resume(2);
        assert_eq!(lost, 30 + 40);
        assert_eq!(r.frames().map(|f| f.seq).collect::<Vec<_>>(), [5, 6]);
        assert_eq!(r.acked(), 2);
        // Nothing evicted is counted twice.
        assert_eq!(r.resume(2), 0);
    }

    #[test]
    fn resume_below_what_was_acknowledged_keeps_the_lower_mark() {
        let mut r = Retention::new(1_000);
        r.push(frame(1, 1));
        r.ack(1);
        r.push(frame(2, 2));
        // A collector that restarted with a shorter log than it acknowledged (a lost
        // disk) says 0: frame 1 is gone from here, frame 2 is sent again.
        assert_eq!(r.resume(0), 0);
        assert_eq!(r.frames().map(|f| f.seq).collect::<Vec<_>>(), [2]);
    }
}
