//! Where every sent message ended up: the accounting of a summary, from the collector's
//! counts and the probes' counters.

use std::collections::BTreeMap;

use crate::session::RunSet;
use crate::stats::TraceCounts;

use super::model::AccountingSummary;

/// The probes' `resent` counters in a run: cumulative per exporter instance, so the
/// largest of each instance's connections, summed.
pub(super) fn resent_by_probes(run: &hoptrace_format::run::RunSummary) -> u64 {
    let mut by_instance: BTreeMap<u64, u64> = BTreeMap::new();
    for p in &run.probes {
        let n = p.counters.get("resent").copied().unwrap_or(0);
        let e = by_instance.entry(p.instance_id).or_default();
        *e = (*e).max(n);
    }
    by_instance.values().sum()
}

pub(super) fn accounting(
    runs: &RunSet,
    rows: u64,
    counts: &TraceCounts,
    hops: &[String],
) -> AccountingSummary {
    let complete = counts.complete;
    let incomplete = rows - complete.min(rows);
    let mut missing_by_hop = BTreeMap::new();
    for (i, hop) in hops.iter().enumerate() {
        let n = counts.missing(i);
        if n > 0 {
            missing_by_hop.insert(hop.clone(), n);
        }
    }
    let acc = runs.runs.iter().map(|r| &r.summary.accounting);
    let pubs = || acc.clone().flat_map(|a| a.publishers.iter());
    let sent: u64 = pubs().map(|p| p.sent).sum();
    let unseen: u64 = pubs().map(|p| p.unseen).sum();
    let several = runs.runs.len() > 1;
    let mut discrepancies: Vec<String> = Vec::new();
    for r in &runs.runs {
        let a = &r.summary.accounting;
        let prefix = if several {
            format!("{}: ", r.summary.run_id)
        } else {
            String::new()
        };
        discrepancies.extend(a.discrepancies.iter().map(|d| format!("{prefix}{d}")));
        if !a.adds_up && a.discrepancies.is_empty() {
            discrepancies.push(format!(
                "{prefix}the collector found that its counts do not add up"
            ));
        }
    }
    let run_complete: u64 = pubs().map(|p| p.complete).sum();
    let run_incomplete: u64 = pubs().map(|p| p.incomplete).sum();
    // Files an interrupted earlier collector left are read but are not in its accounting.
    let recovered: u64 = runs
        .runs
        .iter()
        .filter_map(|r| r.summary.recovered.as_ref())
        .map(|r| r.rows)
        .sum();
    // A key with two rows is counted twice by every figure above: the rows are checked
    // against the distinct keys of the files themselves.
    if counts.repeated_keys() > 0 {
        discrepancies.push(format!(
            "the Parquet holds {rows} rows for {} distinct trace keys: {} rows repeat a key",
            counts.distinct_keys(),
            counts.repeated_keys()
        ));
    }
    if rows != run_complete + run_incomplete + recovered {
        discrepancies.push(format!(
            "the Parquet holds {rows} rows, the run's accounting {} (complete {run_complete} + incomplete {run_incomplete} + recovered {recovered})",
            run_complete + run_incomplete + recovered
        ));
    } else if recovered == 0 && complete != run_complete {
        discrepancies.push(format!(
            "the Parquet holds {complete} complete rows, the run's accounting {run_complete}"
        ));
    }
    // The line every report prints, checked on the figures it prints.
    if sent != complete + incomplete + unseen {
        discrepancies.push(format!(
            "sent {sent} != complete {complete} + incomplete {incomplete} + unseen {unseen} (the Parquet's rows and the publishers' reports)"
        ));
    }
    let adds_up = discrepancies.is_empty();
    AccountingSummary {
        sent,
        sent_metrics: pubs().map(|p| p.sent_metrics).sum(),
        complete,
        incomplete,
        missing_by_hop,
        unseen,
        records_lost_by_probes: acc.clone().map(|a| a.records_lost_by_probes).sum(),
        duplicates: counts.flag(0),
        negative_deltas: counts.flag(1),
        late_records: acc.clone().map(|a| a.late_records).sum(),
        unknown_hop_records: acc.clone().map(|a| a.unknown_hop_records).sum(),
        not_sent: pubs().map(|p| p.not_sent).sum(),
        unannounced_hop_records: acc.clone().map(|a| a.unannounced_hop_records).sum(),
        implausible_records: acc.clone().map(|a| a.implausible_records).sum(),
        resent_records_dropped: acc.clone().map(|a| a.resent_records_dropped).sum(),
        records_resent_by_probes: runs.runs.iter().map(|r| resent_by_probes(&r.summary)).sum(),
        implausible_traces: acc.clone().map(|a| a.implausible_traces).sum(),
        adds_up,
        discrepancies,
    }
}
