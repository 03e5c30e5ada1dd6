//! The run's accounting per publisher, computed from counts that do not depend on each
//! other, so that "counts add up" is a finding and never an assumption:
//!
//! - **sent**: what each publisher says it sent, per stream (its Sent reports: messages and
//!   the first and last sequence);
//! - **rows**: the traces written, complete or incomplete, counted as they are written;
//! - **keys**: the distinct keys written ([`WrittenKeys`]), and of those the ones within
//!   the sequences the publisher reported.
//!
//! A continued run (`collect --run-id ID` on a run directory that kept part files from an
//! earlier collector) takes the keys of those files as written: they are never written
//! again, and a message whose key is in them is **recovered** (seen, by the earlier
//! collector), not unseen. Their rows are not this collector's rows.
//!
//! `unseen` = sent − keys within the reported ranges (kept ones included). The publisher
//! adds up when `sent = complete + incomplete + recovered + unseen` holds with those
//! independent figures; it fails when a key got two rows, when rows exist for keys the
//! publisher never reported sending, when more distinct keys were seen than the publisher
//! says it sent, or when a publisher wrote rows and sent no report at all. Every failure
//! is named in [`Accounting::discrepancies`](hoptrace_format::run::Accounting::discrepancies).

use std::collections::BTreeMap;

use hoptrace_protocol::SentEntry;

use crate::keys::WrittenKeys;
pub(crate) use hoptrace_format::group::Rows;
use hoptrace_format::run::PublisherAccount;

/// Per publisher, what was sent and what became of it, and the discrepancies found
/// (empty when every publisher adds up).
pub(crate) fn publishers(
    sent: &BTreeMap<(u16, u32), SentEntry>,
    rows: &BTreeMap<u16, Rows>,
    written: &WrittenKeys,
    kept: &WrittenKeys,
) -> (Vec<PublisherAccount>, Vec<String>) {
    let mut accounts: BTreeMap<u16, PublisherAccount> = BTreeMap::new();
    let mut within: BTreeMap<u16, u64> = BTreeMap::new();
    let mut within_kept: BTreeMap<u16, u64> = BTreeMap::new();
    let mut distinct: BTreeMap<u16, u64> = BTreeMap::new();
    let account = |m: &mut BTreeMap<u16, PublisherAccount>, p: u16| {
        m.entry(p).or_insert_with(|| PublisherAccount {
            publisher: p,
            ..PublisherAccount::default()
        });
    };
    for (&(p, stream), e) in sent {
        account(&mut accounts, p);
        let a = accounts.get_mut(&p).expect("just added");
        a.sent += e.messages;
        a.sent_metrics += e.metrics;
        let count = |keys: &WrittenKeys| {
            keys.stream(p, stream)
                .map_or(0, |s| s.count_within(e.first_sequence, e.last_sequence))
        };
        *within.entry(p).or_default() += count(written);
        *within_kept.entry(p).or_default() += count(kept);
    }
    for (&(p, stream), keys) in written.streams() {
        // This collector's keys: the written ones less those kept from before.
        let own = keys
            .len()
            .saturating_sub(kept.stream(p, stream).map_or(0, |k| k.len()));
        if own > 0 {
            account(&mut accounts, p);
            *distinct.entry(p).or_default() += own;
        }
    }
    for (&p, r) in rows {
        account(&mut accounts, p);
        let a = accounts.get_mut(&p).expect("just added");
        a.complete = r.complete;
        a.incomplete = r.incomplete;
    }
    let mut discrepancies = Vec::new();
    for a in accounts.values_mut() {
        let p = a.publisher;
        let within_all = within.get(&p).copied().unwrap_or(0);
        let recovered = within_kept.get(&p).copied().unwrap_or(0);
        let distinct = distinct.get(&p).copied().unwrap_or(0);
        let rows = a.complete + a.incomplete;
        a.recovered = recovered;
        a.not_sent = distinct.saturating_sub(within_all.saturating_sub(recovered));
        if rows != distinct {
            discrepancies.push(format!(
                "publisher {p}: {rows} rows written for {distinct} distinct keys"
            ));
        }
        if a.sent == 0 && rows > 0 && !sent.keys().any(|(sp, _)| *sp == p) {
            discrepancies.push(format!(
                "publisher {p}: {rows} traces written but the publisher never reported what it sent"
            ));
        } else if a.not_sent > 0 {
            discrepancies.push(format!(
                "publisher {p}: {} traces whose keys lie outside the sequences it reported sending",
                a.not_sent
            ));
        }
        match a.sent.checked_sub(within_all) {
            Some(unseen) => a.unseen = unseen,
            None => discrepancies.push(format!(
                "publisher {p}: {within_all} distinct keys seen within the sequences it reported, more than the {} messages it says it sent",
                a.sent
            )),
        }
        // The invariant itself, from the independent figures.
        if a.sent != rows + a.recovered + a.unseen {
            discrepancies.push(format!(
                "publisher {p}: sent {} != complete {} + incomplete {} + recovered {} + unseen {}",
                a.sent, a.complete, a.incomplete, a.recovered, a.unseen
            ));
        }
    }
    (accounts.into_values().collect(), discrepancies)
}

#[cfg(test)]
mod tests {
    use hoptrace_protocol::TraceKey;

    use super::*;

    fn entry(stream: u32, messages: u64, first: u64, last: u64) -> SentEntry {
        SentEntry {
            stream,
            messages,
            metrics: messages * 10,
            first_sequence: first,
            last_sequence: last,
        }
    }

    fn keys(p: u16, stream: u32, seqs: impl IntoIterator<Item = u64>) -> WrittenKeys {
        let mut w = WrittenKeys::new();
        for sequence in seqs {
            w.insert(&TraceKey {
                publisher: p,
                stream,
                sequence,
            });
        }
        w
    }

    #[test]
    fn adds_up_when_rows_keys_and_sent_agree() {
        let sent = BTreeMap::from([((1, 7), entry(7, 10, 0, 9))]);
        let rows = BTreeMap::from([(
            1,
            Rows {
                complete: 6,
                incomplete: 2,
            },
        )]);
        let (a, d) = publishers(&sent, &rows, &keys(1, 7, 0..8), &WrittenKeys::new());
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(
            (a[0].sent, a[0].complete, a[0].incomplete, a[0].unseen),
            (10, 6, 2, 2)
        );
    }

    #[test]
    fn a_second_row_for_a_key_does_not_add_up() {
        let sent = BTreeMap::from([((1, 7), entry(7, 10, 0, 9))]);
        // 9 rows for 8 keys: one key written twice, one message unseen hides it in a
        // plain sent - rows subtraction.
        let rows = BTreeMap::from([(
            1,
            Rows {
                complete: 6,
                incomplete: 3,
            },
        )]);
        let (a, d) = publishers(&sent, &rows, &keys(1, 7, 0..8), &WrittenKeys::new());
        assert_eq!(a[0].unseen, 2);
        assert!(
            d.iter()
                .any(|x| x.contains("9 rows written for 8 distinct keys")),
            "{d:?}"
        );
    }

    #[test]
    fn keys_outside_what_was_sent_do_not_add_up() {
        let sent = BTreeMap::from([((1, 7), entry(7, 5, 0, 4))]);
        let rows = BTreeMap::from([(
            1,
            Rows {
                complete: 6,
                incomplete: 0,
            },
        )]);
        let (a, d) = publishers(
            &sent,
            &rows,
            &keys(1, 7, [0, 1, 2, 3, 4, 99]),
            &WrittenKeys::new(),
        );
        assert_eq!((a[0].unseen, a[0].not_sent), (0, 1));
        assert!(d.iter().any(|x| x.contains("outside")), "{d:?}");
        // A publisher that never reported at all.
        let (_, d) = publishers(
            &BTreeMap::new(),
            &BTreeMap::from([(
                3,
                Rows {
                    complete: 1,
                    incomplete: 0,
                },
            )]),
            &keys(3, 1, [0]),
            &WrittenKeys::new(),
        );
        assert!(d.iter().any(|x| x.contains("never reported")), "{d:?}");
    }

    #[test]
    fn keys_kept_from_an_earlier_collector_are_recovered_not_unseen() {
        // 10 sent over both collectors: 6 in the kept files, 3 written now, 1 unseen.
        let sent = BTreeMap::from([((1, 7), entry(7, 10, 0, 9))]);
        let kept = keys(1, 7, 0..6);
        let mut written = kept.clone();
        for s in 6..9 {
            written.insert(&TraceKey {
                publisher: 1,
                stream: 7,
                sequence: s,
            });
        }
        let rows = BTreeMap::from([(
            1,
            Rows {
                complete: 3,
                incomplete: 0,
            },
        )]);
        let (a, d) = publishers(&sent, &rows, &written, &kept);
        assert!(d.is_empty(), "{d:?}");
        assert_eq!((a[0].recovered, a[0].unseen, a[0].not_sent), (6, 1, 0));
        // A publisher only in the kept files, silent now: not this collector's account.
        let (a, d) = publishers(&BTreeMap::new(), &BTreeMap::new(), &kept, &kept);
        assert!(a.is_empty() && d.is_empty(), "{a:?} {d:?}");
    }

    #[test]
    fn more_keys_than_sent_does_not_add_up() {
        // The report says 3 messages over sequences 0..=9, but 5 distinct keys were seen.
        let sent = BTreeMap::from([((1, 7), entry(7, 3, 0, 9))]);
        let rows = BTreeMap::from([(
            1,
            Rows {
                complete: 5,
                incomplete: 0,
            },
        )]);
        let (_, d) = publishers(&sent, &rows, &keys(1, 7, 0..5), &WrittenKeys::new());
        assert!(d.iter().any(|x| x.contains("more than the 3")), "{d:?}");
    }
}
