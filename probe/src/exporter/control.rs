//! The caller's control frames not yet written to a collector, kept in a size that does not
//! grow with the outage.

use hoptrace_protocol::{CountersFrame, Frame, MAX_SENT_PER_FRAME, SentEntry, SentFrame};

/// Counters a Counters frame holds.
pub(super) const MAX_COUNTERS_PER_FRAME: usize = 255;

/// The caller's control frames not yet written to a collector, kept in a size that does
/// not grow with time, however long the collector is away: a Sent entry is a snapshot of
/// its stream's totals that the collector keeps only the newest of
/// (`docs/collector-protocol.md`), so only the newest per (publisher, stream) is kept; the
/// caller's counters are kept as their newest value per counter id. The memory is one
/// entry per stream the caller reports (40 bytes each) and one per counter id (at most
/// 65,536), whatever the outage. What a superseded frame said is never needed: nothing is
/// dropped that the collector would have kept.
#[derive(Debug, Default)]
pub(super) struct PendingControl {
    /// The newest entry per (publisher, stream).
    pub(super) sent: std::collections::BTreeMap<(u16, u32), SentEntry>,
    /// Publishers whose empty Sent frame is waiting (it changes nothing at the collector,
    /// but a caller may send one to say it is there).
    pub(super) empty_sent: std::collections::BTreeSet<u16>,
    /// The newest value per counter id, and when the newest of those frames was read.
    pub(super) counters: std::collections::BTreeMap<u16, u64>,
    pub(super) counters_at_ns: Option<i64>,
}

impl PendingControl {
    pub(super) fn add_sent(&mut self, frame: SentFrame) {
        if frame.entries.is_empty() {
            self.empty_sent.insert(frame.publisher);
        }
        for e in frame.entries {
            self.sent.insert((frame.publisher, e.stream), e);
        }
    }

    pub(super) fn add_counters(&mut self, frame: CountersFrame) {
        self.counters.extend(frame.values);
        self.counters_at_ns = Some(
            self.counters_at_ns
                .map_or(frame.at_ns, |t| t.max(frame.at_ns)),
        );
    }

    /// Entries waiting (Sent entries and counter values).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.sent.len() + self.counters.len()
    }

    /// Encodes what is waiting into `buf`: Sent frames per publisher, as many as its
    /// entries need, then one Counters frame per 255 counters. The exporter takes what is
    /// waiting ([`std::mem::take`]), encodes it, and gives it back with
    /// [`PendingControl::restore`] when the write fails, so that a lost connection loses
    /// none of it.
    pub(super) fn encode(&self, buf: &mut Vec<u8>) {
        let mut frame = SentFrame::default();
        let flush = |frame: &mut SentFrame, buf: &mut Vec<u8>| {
            Frame::Sent(std::mem::take(frame))
                .encode(buf)
                .expect("a Sent frame of at most MAX_SENT_PER_FRAME entries encodes");
        };
        for (&(publisher, _), entry) in &self.sent {
            if !frame.entries.is_empty()
                && (frame.publisher != publisher || frame.entries.len() == MAX_SENT_PER_FRAME)
            {
                flush(&mut frame, buf);
            }
            frame.publisher = publisher;
            frame.entries.push(*entry);
        }
        if !frame.entries.is_empty() {
            flush(&mut frame, buf);
        }
        for &publisher in &self.empty_sent {
            if self.sent.keys().any(|&(p, _)| p == publisher) {
                continue; // its entries said it is there
            }
            flush(
                &mut SentFrame {
                    publisher,
                    entries: Vec::new(),
                },
                buf,
            );
        }
        if let Some(at_ns) = self.counters_at_ns {
            let values: Vec<(u16, u64)> = self.counters.iter().map(|(&k, &v)| (k, v)).collect();
            for chunk in values.chunks(MAX_COUNTERS_PER_FRAME) {
                Frame::Counters(CountersFrame {
                    at_ns,
                    values: chunk.to_vec(),
                })
                .encode(buf)
                .expect("a Counters frame of at most 255 counters encodes");
            }
        }
    }

    /// Gives back what a failed write did not deliver. What the caller reported since it
    /// was taken is newer and wins; the rest waits again for the next connection.
    pub(super) fn restore(&mut self, older: PendingControl) {
        for (key, entry) in older.sent {
            self.sent.entry(key).or_insert(entry);
        }
        self.empty_sent.extend(older.empty_sent);
        for (id, value) in older.counters {
            self.counters.entry(id).or_insert(value);
        }
        self.counters_at_ns = match (self.counters_at_ns, older.counters_at_ns) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}
