//! A run collected by a Kafka consumer group: every member writes its own files and logs
//! under `members/<member>/` (`ownership.jsonl`: the partitions it was assigned and the
//! position it started from; `segments.jsonl`: each checkpointed stretch of a partition,
//! its files and what it counted), and readers merge them into one run with
//! [`open_group`], setting aside the segments a killed member wrote that its successor
//! repeated. `docs/scale-out.md` explains why that neither loses nor counts a trace twice.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::run::{Accounting, GroupInfo, PartFile, PublisherAccount, RunSummary};

/// Directory of a group run that holds one directory per member.
pub const MEMBERS_DIR: &str = "members";
/// A member's log of the partitions it was assigned, one JSON [`Ownership`] per line.
pub const OWNERSHIP_FILE: &str = "ownership.jsonl";
/// A member's log of checkpointed segments, one JSON [`Segment`] per line.
pub const SEGMENTS_FILE: &str = "segments.jsonl";

/// Rows written for one publisher.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rows {
    /// Complete traces.
    pub complete: u64,
    /// Incomplete traces.
    pub incomplete: u64,
}

/// What a stretch of a partition's log came to, counted when buckets close (traces) or
/// records arrive late.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// Records of the stretch's closed buckets and late records.
    pub records: u64,
    /// Records whose bucket had closed, or whose trace had completed.
    pub late: u64,
    /// Records of a hop the spec does not declare.
    pub unknown_hop: u64,
    /// Records whose stamp was implausible.
    #[serde(default)]
    pub implausible: u64,
    /// Traces flagged for an implausible intended time.
    #[serde(default)]
    pub implausible_traces: u64,
    /// Records by hop index (stored, duplicate or late).
    pub records_by_hop: Vec<u64>,
    /// Incomplete traces by the expected hop index they miss.
    pub missing_by_hop: Vec<u64>,
    /// Traces with a duplicate stamp.
    pub duplicate_traces: u64,
    /// Traces with a negative stage delta.
    pub negative_delta_traces: u64,
    /// (complete, incomplete) traces by publisher: the rows written.
    pub publishers: BTreeMap<u16, (u64, u64)>,
    /// Distinct keys written by publisher, counted apart from the rows: a key the
    /// partition had already written is not counted again, so a key with two rows makes
    /// the rows exceed the keys.
    #[serde(default)]
    pub keys: BTreeMap<u16, u64>,
    /// Records in a partition their trace key does not map to (the topic's partition
    /// count changed, or another producer wrote to it): counted, not joined.
    #[serde(default)]
    pub misplaced: u64,
    /// Partitions taken over whose replay from the partition's first offset did not
    /// reach the previous owner's checkpoint (records deleted from Kafka since, or another
    /// log): what the previous owner wrote may be written again.
    #[serde(default)]
    pub replay_mismatches: u64,
}

impl Tally {
    /// Adds `other` to this tally.
    pub fn add(&mut self, other: &Self) {
        self.records += other.records;
        self.late += other.late;
        self.unknown_hop += other.unknown_hop;
        self.implausible += other.implausible;
        self.implausible_traces += other.implausible_traces;
        self.duplicate_traces += other.duplicate_traces;
        self.negative_delta_traces += other.negative_delta_traces;
        add_counts(&mut self.records_by_hop, &other.records_by_hop);
        add_counts(&mut self.missing_by_hop, &other.missing_by_hop);
        for (p, (c, i)) in &other.publishers {
            let e = self.publishers.entry(*p).or_default();
            e.0 += c;
            e.1 += i;
        }
        for (p, k) in &other.keys {
            *self.keys.entry(*p).or_default() += k;
        }
        self.misplaced += other.misplaced;
        self.replay_mismatches += other.replay_mismatches;
    }

    /// The rows written per publisher.
    #[must_use]
    pub fn rows(&self) -> BTreeMap<u16, Rows> {
        self.publishers
            .iter()
            .map(|(p, (c, i))| {
                (
                    *p,
                    Rows {
                        complete: *c,
                        incomplete: *i,
                    },
                )
            })
            .collect()
    }

    /// The run accounting this tally makes, with hop names for its per-hop counts.
    #[must_use]
    pub fn accounting(
        &self,
        hops: &[String],
        publishers: Vec<PublisherAccount>,
        records_lost_by_probes: u64,
        unannounced_hop_records: u64,
        mut discrepancies: Vec<String>,
    ) -> Accounting {
        if self.misplaced > 0 {
            discrepancies.push(format!(
                "{} records arrived in a Kafka partition their trace key does not map to (the topic's partition count changed while the relay ran, or another producer wrote to it): counted, not joined",
                self.misplaced
            ));
        }
        if self.replay_mismatches > 0 {
            discrepancies.push(format!(
                "{} partition takeovers did not replay to the previous owner's checkpoint (records deleted from Kafka since?): keys it wrote may have been written again",
                self.replay_mismatches
            ));
        }
        let named = |counts: &[u64]| -> BTreeMap<String, u64> {
            hops.iter()
                .cloned()
                .zip(counts.iter().copied().chain(std::iter::repeat(0)))
                .collect()
        };
        Accounting {
            publishers,
            missing_by_hop: named(&self.missing_by_hop)
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect(),
            records_by_hop: named(&self.records_by_hop),
            records_lost_by_probes,
            duplicate_traces: self.duplicate_traces,
            negative_delta_traces: self.negative_delta_traces,
            late_records: self.late,
            unknown_hop_records: self.unknown_hop,
            unannounced_hop_records,
            implausible_records: self.implausible,
            implausible_traces: self.implausible_traces,
            in_flight: 0,
            backpressure_episodes: 0,
            resent_records_dropped: 0,
            adds_up: discrepancies.is_empty(),
            discrepancies,
        }
    }

    /// Whether nothing was counted.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.records == 0 && self.publishers.is_empty() && self.replay_mismatches == 0
    }
}

/// Adds `from` to `into` element by element, growing `into` as needed.
pub fn add_counts(into: &mut Vec<u64>, from: &[u64]) {
    if into.len() < from.len() {
        into.resize(from.len(), 0);
    }
    for (a, b) in into.iter_mut().zip(from) {
        *a += b;
    }
}

/// A member was assigned a partition, starting at `start`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ownership {
    /// The member.
    pub member: String,
    /// The partition.
    pub partition: i32,
    /// The position it continues from (the previous owner's checkpoint; the first offset
    /// it read when there was none).
    pub start: i64,
    /// When it was assigned, Unix ns (orders two owners starting at the same position).
    pub assigned_unix_ns: i64,
}

/// A checkpointed stretch `(from, to]` of a partition: the files of the traces emitted
/// in it and what it counted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// The member that wrote it.
    pub member: String,
    /// The partition.
    pub partition: i32,
    /// Position at the previous checkpoint.
    pub from: i64,
    /// Position at this checkpoint.
    pub to: i64,
    /// Files, relative to the member's directory.
    pub files: Vec<PartFile>,
    /// What was counted.
    pub tally: Tally,
}

/// Appends one JSON line to `path` and syncs it to disk.
///
/// # Errors
/// When the file cannot be opened, written or synced.
pub fn append_line<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let mut f = OpenOptions::new().create(true).append(true).open(path)?;
    let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    line.push(b'\n');
    f.write_all(&line)?;
    f.sync_data()
}

/// Reads a JSON-lines log; a torn last line (a member killed while writing it) is
/// ignored, any other bad line is an error naming the file and line.
fn read_lines<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>, GroupError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(GroupError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    let lines: Vec<String> = BufReader::new(file)
        .lines()
        .collect::<Result<_, _>>()
        .map_err(|source| GroupError::Io {
            path: path.to_owned(),
            source,
        })?;
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(v) => out.push(v),
            Err(_) if i + 1 == lines.len() => {
                tracing::warn!(
                    "{}: ignoring a torn last line (its writer was killed)",
                    path.display()
                );
            }
            Err(e) => {
                return Err(GroupError::Log {
                    path: path.to_owned(),
                    line: i + 1,
                    reason: e.to_string(),
                });
            }
        }
    }
    Ok(out)
}

/// Why a group run cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// A file cannot be read.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A log line is not what a member writes.
    #[error("{path}:{line}: {reason}")]
    Log {
        /// The log.
        path: PathBuf,
        /// Line number (1-based).
        line: usize,
        /// Why.
        reason: String,
    },
    /// No member finished: there is no `run.json` to take the pipeline and probes from.
    #[error("{0}: no member of the group wrote run.json (none stopped cleanly)")]
    NoFinishedMember(PathBuf),
    /// A member's `run.json` does not parse.
    #[error("{path}: {reason}")]
    RunJson {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// A group run read as one run.
#[derive(Debug, Clone)]
pub struct GroupRun {
    /// The merged summary: the pipeline, probes and clocks of the member that finished
    /// last, the accounting of every valid segment of every member.
    pub summary: RunSummary,
    /// The part files of the valid segments.
    pub parts: Vec<PathBuf>,
    /// The directory of the member that finished last (its `clock.parquet` and
    /// `probes.parquet` hold what every member read from the control topic).
    pub tables_dir: PathBuf,
    /// Part files of segments repeated by a later owner, set aside.
    pub set_aside: Vec<PathBuf>,
}

/// Whether `dir` is a group run (it holds `members/`, not `run.json`).
#[must_use]
pub fn is_group_run(dir: &Path) -> bool {
    !dir.join("run.json").exists() && dir.join(MEMBERS_DIR).is_dir()
}

/// Which segments are valid: for each partition, owners ordered by (start, assignment
/// time); a segment counts when it lies within its owner's stretch, from its start to
/// the next owner's start.
#[must_use]
pub fn valid_segments(owners: &[Ownership], segments: &[Segment]) -> Vec<bool> {
    let mut by_partition: BTreeMap<i32, Vec<&Ownership>> = BTreeMap::new();
    for o in owners {
        by_partition.entry(o.partition).or_default().push(o);
    }
    for v in by_partition.values_mut() {
        v.sort_by(|a, b| {
            (a.start, a.assigned_unix_ns, &a.member).cmp(&(b.start, b.assigned_unix_ns, &b.member))
        });
    }
    segments
        .iter()
        .map(|s| {
            let Some(chain) = by_partition.get(&s.partition) else {
                return false;
            };
            chain.iter().enumerate().any(|(i, o)| {
                let end = chain.get(i + 1).map_or(i64::MAX, |n| n.start);
                o.member == s.member && s.from >= o.start && s.to <= end
            })
        })
        .collect()
}

/// Reads the group run in `dir` as one run.
///
/// # Errors
/// A log or `run.json` that does not read, or no member that finished.
pub fn open_group(dir: &Path) -> Result<GroupRun, GroupError> {
    let members_dir = dir.join(MEMBERS_DIR);
    let mut names: Vec<String> = std::fs::read_dir(&members_dir)
        .map_err(|source| GroupError::Io {
            path: members_dir.clone(),
            source,
        })?
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    let mut owners = Vec::new();
    let mut segments = Vec::new();
    let mut finished: Vec<(String, RunSummary)> = Vec::new();
    let mut members = BTreeMap::new();
    for name in &names {
        let mdir = members_dir.join(name);
        owners.extend(read_lines::<Ownership>(&mdir.join(OWNERSHIP_FILE))?);
        segments.extend(read_lines::<Segment>(&mdir.join(SEGMENTS_FILE))?);
        let run_json = mdir.join("run.json");
        let done = run_json.exists();
        members.insert(name.clone(), done);
        if done {
            let text = std::fs::read_to_string(&run_json).map_err(|source| GroupError::Io {
                path: run_json.clone(),
                source,
            })?;
            let s: RunSummary = serde_json::from_str(&text).map_err(|e| GroupError::RunJson {
                path: run_json.clone(),
                reason: e.to_string(),
            })?;
            finished.push((name.clone(), s));
        }
    }
    let Some((base_name, base)) = finished
        .iter()
        .max_by_key(|(_, s)| s.ended_unix_ns)
        .cloned()
    else {
        return Err(GroupError::NoFinishedMember(dir.to_owned()));
    };
    let valid = valid_segments(&owners, &segments);
    let mut total = Tally::default();
    let mut parts = Vec::new();
    let mut set_aside = Vec::new();
    let mut files = Vec::new();
    let mut info = GroupInfo {
        group: base
            .group
            .as_ref()
            .map(|g| g.group.clone())
            .unwrap_or_default(),
        members,
        ..GroupInfo::default()
    };
    for g in finished.iter().filter_map(|(_, s)| s.group.as_ref()) {
        info.bad_messages += g.bad_messages;
        info.bad_control_messages = info.bad_control_messages.max(g.bad_control_messages);
    }
    for (s, ok) in segments.iter().zip(&valid) {
        let mdir = members_dir.join(&s.member);
        let paths = s.files.iter().map(|f| mdir.join(&f.name));
        if *ok {
            info.segments += 1;
            total.add(&s.tally);
            parts.extend(paths);
            files.extend(s.files.iter().map(|f| PartFile {
                name: format!("{MEMBERS_DIR}/{}/{}", s.member, f.name),
                ..f.clone()
            }));
        } else {
            info.segments_set_aside += 1;
            info.rows_set_aside += s.files.iter().map(|f| f.rows).sum::<u64>();
            set_aside.extend(paths);
        }
    }
    parts.sort();
    let mut chain = owners.clone();
    chain.sort_by(|a, b| {
        (a.partition, a.start, a.assigned_unix_ns).cmp(&(b.partition, b.start, b.assigned_unix_ns))
    });
    for o in chain {
        info.owners.entry(o.partition).or_default().push(o.member);
    }
    // Partitions whose last owner did not finish still hold traces nobody emitted.
    let unfinished_owner = info.owners.values().any(|v| {
        v.last()
            .is_some_and(|m| !info.members.get(m).copied().unwrap_or(false))
    });
    let hops: Vec<String> = base.pipeline.hops.iter().map(|h| h.name.clone()).collect();
    // Sent snapshots are cumulative and every member read all of them.
    let mut sent: BTreeMap<u16, (u64, u64)> = BTreeMap::new();
    for (_, s) in &finished {
        for p in &s.accounting.publishers {
            if p.sent > 0 || sent.contains_key(&p.publisher) {
                let e = sent.entry(p.publisher).or_default();
                e.0 = e.0.max(p.sent);
                e.1 = e.1.max(p.sent_metrics);
            }
        }
    }
    let (publishers, mut discrepancies) = publishers_by_keys(&sent, &total.rows(), &total.keys);
    if unfinished_owner {
        discrepancies.push(
            "a partition's last owner did not finish: traces it held were never written".into(),
        );
    }
    let mut summary = base;
    summary.started_unix_ns = finished
        .iter()
        .map(|(_, s)| s.started_unix_ns)
        .min()
        .unwrap_or(summary.started_unix_ns);
    summary.files = files;
    summary.stages = Vec::new();
    // Every member read the relay's counters from the control topic.
    let unannounced = finished
        .iter()
        .map(|(_, s)| s.accounting.unannounced_hop_records)
        .max()
        .unwrap_or(0);
    summary.accounting = total.accounting(
        &hops,
        publishers,
        summary.accounting.records_lost_by_probes,
        unannounced,
        discrepancies,
    );
    summary.group = Some(info);
    Ok(GroupRun {
        summary,
        parts,
        tables_dir: members_dir.join(base_name),
        set_aside,
    })
}

/// The accounting of a run whose keys are not kept in one place (a consumer group: each
/// partition's keys are written once by whoever joins it), from counts that do not
/// depend on each other: `sent` per publisher as (messages, metrics) from its Sent
/// reports, `rows` as written, and `keys`, the distinct keys written (a key written a
/// second time is not counted again). `unseen` = sent − keys. A publisher adds up when
/// its rows equal its keys (no key has two rows), its keys do not exceed what it sent,
/// and it reported what it sent; every failure is named.
#[must_use]
pub fn publishers_by_keys(
    sent: &BTreeMap<u16, (u64, u64)>,
    rows: &BTreeMap<u16, Rows>,
    keys: &BTreeMap<u16, u64>,
) -> (Vec<PublisherAccount>, Vec<String>) {
    let mut accounts: BTreeMap<u16, PublisherAccount> = BTreeMap::new();
    for p in sent.keys().chain(rows.keys()).chain(keys.keys()) {
        let (messages, metrics) = sent.get(p).copied().unwrap_or_default();
        let r = rows.get(p).copied().unwrap_or_default();
        accounts.insert(
            *p,
            PublisherAccount {
                publisher: *p,
                sent: messages,
                sent_metrics: metrics,
                complete: r.complete,
                incomplete: r.incomplete,
                ..PublisherAccount::default()
            },
        );
    }
    let mut discrepancies = Vec::new();
    for a in accounts.values_mut() {
        let p = a.publisher;
        let rows = a.complete + a.incomplete;
        let distinct = keys.get(&p).copied().unwrap_or(0);
        if rows != distinct {
            discrepancies.push(format!(
                "publisher {p}: {rows} rows written for {distinct} distinct keys"
            ));
        }
        if !sent.contains_key(&p) && rows > 0 {
            discrepancies.push(format!(
                "publisher {p}: {rows} traces written but the publisher never reported what it sent"
            ));
        }
        match a.sent.checked_sub(distinct) {
            Some(unseen) => a.unseen = unseen,
            None => discrepancies.push(format!(
                "publisher {p}: {distinct} distinct keys written, more than the {} messages it says it sent",
                a.sent
            )),
        }
        if a.sent != rows + a.unseen {
            discrepancies.push(format!(
                "publisher {p}: sent {} != complete {} + incomplete {} + unseen {}",
                a.sent, a.complete, a.incomplete, a.unseen
            ));
        }
    }
    (accounts.into_values().collect(), discrepancies)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(member: &str, partition: i32, from: i64, to: i64) -> Segment {
        Segment {
            member: member.into(),
            partition,
            from,
            to,
            files: Vec::new(),
            tally: Tally::default(),
        }
    }

    fn own(member: &str, partition: i32, start: i64, at: i64) -> Ownership {
        Ownership {
            member: member.into(),
            partition,
            start,
            assigned_unix_ns: at,
        }
    }

    fn rows(complete: u64, incomplete: u64) -> BTreeMap<u16, Rows> {
        BTreeMap::from([(
            1,
            Rows {
                complete,
                incomplete,
            },
        )])
    }

    #[test]
    fn adds_up_when_rows_keys_and_sent_agree() {
        let sent = BTreeMap::from([(1, (10, 100))]);
        let (a, d) = publishers_by_keys(&sent, &rows(6, 2), &BTreeMap::from([(1, 8)]));
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(
            (a[0].sent, a[0].complete, a[0].incomplete, a[0].unseen),
            (10, 6, 2, 2)
        );
    }

    #[test]
    fn a_key_with_two_rows_does_not_add_up_behind_an_unseen_message() {
        // 9 rows for 8 keys of 10 sent: sent − rows = 1 would hide the second row
        // behind the one message nobody saw.
        let sent = BTreeMap::from([(1, (10, 100))]);
        let (a, d) = publishers_by_keys(&sent, &rows(6, 3), &BTreeMap::from([(1, 8)]));
        assert_eq!(a[0].unseen, 2);
        assert!(
            d.iter()
                .any(|x| x.contains("9 rows written for 8 distinct keys")),
            "{d:?}"
        );
        assert!(
            d.iter().any(|x| x.contains("sent 10 != complete 6")),
            "{d:?}"
        );
    }

    #[test]
    fn more_keys_than_sent_or_no_report_does_not_add_up() {
        let sent = BTreeMap::from([(1, (3, 30))]);
        let (_, d) = publishers_by_keys(&sent, &rows(5, 0), &BTreeMap::from([(1, 5)]));
        assert!(d.iter().any(|x| x.contains("more than the 3")), "{d:?}");
        let (_, d) = publishers_by_keys(&BTreeMap::new(), &rows(1, 0), &BTreeMap::from([(1, 1)]));
        assert!(d.iter().any(|x| x.contains("never reported")), "{d:?}");
    }

    #[test]
    fn misplaced_records_and_failed_replays_are_named() {
        let t = Tally {
            misplaced: 3,
            replay_mismatches: 1,
            ..Tally::default()
        };
        let a = t.accounting(&[], Vec::new(), 0, 0, Vec::new());
        assert!(!a.adds_up);
        assert_eq!(a.discrepancies.len(), 2, "{:?}", a.discrepancies);
    }

    #[test]
    fn segments_after_a_successors_start_are_set_aside() {
        let owners = [
            own("a", 0, 0, 1),
            own("b", 0, 50, 5),
            own("a", 1, 0, 1),
            // c took partition 1 at 30 and was killed before committing; d took it at 30.
            own("c", 1, 30, 3),
            own("d", 1, 30, 4),
        ];
        let segments = [
            seg("a", 0, 0, 20),
            seg("a", 0, 20, 50),
            seg("a", 0, 50, 60), // after b's start: b repeated it
            seg("b", 0, 50, 90),
            seg("a", 1, 0, 30),
            seg("c", 1, 30, 40), // d repeated it
            seg("d", 1, 30, 70),
            seg("x", 1, 0, 10), // no ownership
        ];
        assert_eq!(
            valid_segments(&owners, &segments),
            [true, true, false, true, true, false, true, false]
        );
    }
}
