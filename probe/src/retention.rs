//! The records frames an exporter keeps until the collector acknowledges them as durable
//! (collector protocol version 2): bounded in bytes, oldest dropped first, and every
//! dropped record accounted for when the exporter learns what the collector holds.
//!
//! Whether a frame dropped after it was written is lost is known only when the collector
//! says what it holds, so each such frame is remembered (24 bytes) until then. A
//! collector that reads and never acknowledges would make that list grow without end:
//! once it holds [`MAX_UNRESOLVED`] frames the exporter drops the connection
//! ([`Retention::stalled`]), and the next Welcome's resume number settles them exactly.

use std::collections::VecDeque;

/// Most frames dropped after they were written whose fate is remembered before the
/// exporter reconnects to learn it (about 1.5 MiB).
pub(crate) const MAX_UNRESOLVED: usize = 1 << 16;

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
    /// Frames dropped unacknowledged, (number, records, written), oldest first: whether
    /// a written one is lost is known only when the collector says what it holds. Only
    /// the newest frame may be unwritten here (it can still be marked written).
    evicted: VecDeque<(u64, u64, bool)>,
    /// Records of older frames dropped before they were ever written: no collector holds
    /// them, so they are lost whatever it says. A sum, not a list, so that a long outage
    /// costs no memory beyond the bound.
    evicted_unwritten: u64,
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
            evicted_unwritten: 0,
            acked: 0,
        }
    }

    /// Keeps a frame just written; returns the records of older frames dropped to make
    /// room (they are then `evicted`).
    pub(crate) fn push(&mut self, frame: Retained) -> u64 {
        self.settle_evicted_unwritten();
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
            // An unwritten frame that is not the newest will never be written.
            if self.frames.back().is_some_and(|f| f.seq > old.seq) {
                self.settle_evicted_unwritten();
            }
        }
        dropped
    }

    /// Moves an evicted frame that was never written from the list into the sum.
    fn settle_evicted_unwritten(&mut self) {
        if let Some(&(_, n, false)) = self.evicted.back() {
            self.evicted.pop_back();
            self.evicted_unwritten += n;
        }
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
        let lost = self.evicted.iter().map(|&(_, n, _)| n).sum::<u64>() + self.evicted_unwritten;
        self.evicted.clear();
        self.evicted_unwritten = 0;
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
        self.evicted
            .iter()
            .fold((0, self.evicted_unwritten), |(w, u), &(_, n, written)| {
                if written { (w + n, u) } else { (w, u + n) }
            })
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

    /// The collector has acknowledged none of the last [`MAX_UNRESOLVED`] frames dropped
    /// after they were written: reconnect, so that its Welcome says what it holds.
    pub(crate) fn stalled(&self) -> bool {
        self.evicted.len() >= MAX_UNRESOLVED
    }

    /// Highest number acknowledged.
    #[cfg(test)]
    pub(crate) fn acked(&self) -> u64 {
        self.acked
    }

    /// Bytes of frames kept, and entries kept about evicted frames.
    #[cfg(test)]
    pub(crate) fn footprint(&self) -> (usize, usize) {
        (self.bytes, self.evicted.len())
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

    fn unwritten(seq: u64, records: u64, len: usize) -> Retained {
        Retained {
            seq,
            records,
            bytes: vec![0; len],
            written: false,
        }
    }

    /// A collector that reads every frame and never acknowledges one: the frames dropped
    /// after they were written are remembered up to the limit, where the retention says
    /// it is stalled; the resume after reconnecting settles every one of them exactly.
    #[test]
    fn a_collector_that_never_acknowledges_is_bounded_then_settled() {
        let mut r = Retention::new(1000);
        let mut dropped = 0;
        let mut seq = 0;
        while !r.stalled() {
            seq += 1;
            dropped += r.push(frame(seq, 2));
            assert!(r.footprint().1 <= MAX_UNRESOLVED);
        }
        assert_eq!(r.footprint().1, MAX_UNRESOLVED);
        assert_eq!(dropped, 2 * MAX_UNRESOLVED as u64);
        assert_eq!(r.evicted_unresolved(), (dropped, 0));
        // The collector held the first 1000 frames: the rest of those dropped are lost.
        assert_eq!(r.resume(1000), dropped - 2000);
        assert!(!r.stalled());
        assert_eq!(r.footprint().1, 0);
        assert_eq!(r.unacked_records(), 2 * (seq - MAX_UNRESOLVED as u64));
    }

    /// A collector away for long: a million frames numbered and never written through a
    /// 64 KiB buffer. What is kept stays within the bound, the bookkeeping of what was
    /// dropped does not grow with the outage, and every dropped record is counted lost.
    #[test]
    fn a_long_outage_stays_within_the_bound_and_counts_every_record() {
        let bound = 64 * 1024;
        let mut r = Retention::new(bound);
        let (mut dropped, mut pushed, mut most_entries) = (0, 0, 0);
        for seq in 1..=1_000_000u64 {
            // Mostly small frames; every 1000th larger than the whole buffer.
            let len = if seq % 1000 == 0 { bound + 1 } else { 200 };
            dropped += r.push(unwritten(seq, 3, len));
            pushed += 3;
            let (bytes, entries) = r.footprint();
            assert!(bytes <= bound, "{bytes} bytes kept at frame {seq}");
            most_entries = most_entries.max(entries);
        }
        assert!(
            most_entries <= 1,
            "{most_entries} entries about evicted frames"
        );
        let kept = r.unacked_records();
        assert_eq!(dropped + kept, pushed);
        assert_eq!(r.evicted_unresolved(), (0, dropped));
        // The collector comes back holding nothing of these: exactly the dropped are lost.
        assert_eq!(r.resume(0), dropped);
        assert_eq!(r.evicted_unresolved(), (0, 0));
        assert_eq!(r.unacked_records(), kept);
    }

    /// A frame larger than the whole buffer is evicted at once and may still be written:
    /// it then waits, as written, for the collector to say whether it holds it.
    #[test]
    fn an_oversized_frame_written_after_eviction_is_not_lost_if_held() {
        let mut r = Retention::new(100);
        assert_eq!(r.push(unwritten(1, 5, 500)), 5);
        r.mark_written(1);
        assert_eq!(r.evicted_unresolved(), (5, 0));
        assert_eq!(r.resume(1), 0);
        // Evicted and never written: lost once the next frame comes.
        assert_eq!(r.push(unwritten(2, 7, 500)), 7);
        assert_eq!(r.push(unwritten(3, 1, 10)), 0);
        assert_eq!(r.evicted_unresolved(), (0, 7));
        assert_eq!(r.resume(1), 7);
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
