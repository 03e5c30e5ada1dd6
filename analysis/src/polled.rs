//! What the store taps said, read back from `probes.parquet`: for each polled hop, the
//! poll brackets that bound its stamps ([`PollBracket`], beside the stages that start or
//! end there) and what each tap cost ([`StoreTapCost`]: polls, query time, the store's
//! own query duration).

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{Int64Type, UInt64Type};
use datafusion::prelude::SessionContext;
use serde::{Deserialize, Serialize};

use crate::AnalysisError;
use crate::figures::CLOCK_WARN_FRACTION;
use crate::session::RunSet;

/// Which end of a stage a polled hop is, and so which way its late stamp moves the stage.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PolledEnd {
    /// The stage ends at the polled hop (`publish → queryable`): the stamp is late, so the
    /// stage is measured long by up to the bracket: the true value is within `+0/−max`.
    To,
    /// The stage starts at the polled hop (`queryable → report_seen`): the stamp is late,
    /// so the stage is measured short by up to the bracket: the true value is within
    /// `+max/−0`.
    From,
}

impl PolledEnd {
    /// The bound on the true value against the measured one, for a bracket of `bound`:
    /// `+0/−15.1ms` or `+15.1ms/−0`.
    #[must_use]
    pub fn bound(self, bound: &str) -> String {
        match self {
            Self::To => format!("+0/−{bound}"),
            Self::From => format!("+{bound}/−0"),
        }
    }
}

/// A polled hop's poll brackets (previous poll's send → the response of the poll that
/// first returned the data), from the store taps' counters (`docs/dataset.md`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PollBracket {
    /// The polled hop.
    pub hop: String,
    /// Which end of the stage it is: the sign of the bound.
    pub end: PolledEnd,
    /// Keys the taps found (brackets measured).
    pub keys: u64,
    /// Mean bracket, ns.
    pub mean_ns: f64,
    /// P50 of the brackets (the largest of the taps' P50s when several taps polled), ns.
    #[serde(default)]
    pub p50_ns: u64,
    /// P99 of the brackets (the largest of the taps' P99s when several taps polled), ns.
    pub p99_ns: u64,
    /// Largest bracket, ns: the bound on every stamp of the hop, so on every figure of
    /// the stage.
    pub max_ns: u64,
    /// The taps' poll interval (the largest), ns.
    pub poll_interval_ns: u64,
    /// Polls sent, and of those failed.
    pub polls: u64,
    /// Polls that failed.
    pub poll_errors: u64,
    /// The brackets' P99 is not small against the stage's P50 (above 10 %).
    pub warning: bool,
}

/// What one store tap cost, from its counters (`docs/collector-protocol.md`, ids 64–113):
/// its polls, its query time as it saw it, and the store's own query duration where the
/// store reports one (ClickHouse).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StoreTapCost {
    /// The run it polled for.
    pub run_id: String,
    /// Its process name and host, as its connection announced them.
    pub process: String,
    /// Host name.
    pub host: String,
    /// The hop it stamps (`queryable`).
    pub hop: String,
    /// Its poll interval, ns.
    pub poll_interval_ns: u64,
    /// Polls sent, answered or not.
    pub polls: u64,
    /// Polls that failed.
    pub poll_errors: u64,
    /// How long it polled, seconds (`None` for a tap that did not say).
    pub polling_s: Option<f64>,
    /// Polls per second over that time.
    pub polls_per_s: Option<f64>,
    /// Response − send of the answered polls, as the tap saw it.
    pub query_time: CostSpread,
    /// The query durations the store itself reported; `None` when it reports none.
    pub server_elapsed: Option<CostSpread>,
    /// New keys reported.
    pub keys_found: u64,
    /// Rows read that carried a key (new or re-read).
    pub rows: u64,
    /// Of those, rows of keys already reported or present at start (the overlap's re-reads).
    pub rows_repeated: u64,
    /// Polls that found at least one new key.
    pub polls_with_keys: u64,
    /// Key values that did not decode.
    pub bad_keys: u64,
    /// Row times after the response that returned them (a clock ahead of the tap's), and
    /// the most one was after it, ns.
    #[serde(default)]
    pub store_time_ahead: (u64, u64),
    /// Row times before their publish stamp beyond their resolution (a clock behind the
    /// publisher's, or a time the writer took from the message), and the most one was
    /// before it, ns.
    #[serde(default)]
    pub store_time_behind: (u64, u64),
    /// Connections to the store it found lost and opened again.
    #[serde(default)]
    pub reconnections: u64,
    /// What its listener took, where it listened for the store's notifications
    /// (PostgreSQL `notify=`); `None` for a tap that did not listen.
    #[serde(default)]
    pub notified: Option<Notified>,
}

/// What a store tap's listener took from the store's notifications (counters 110–113).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Notified {
    /// Notifications received.
    pub notifications: u64,
    /// Keys a notification reported before any poll found them: `queryable` is its
    /// arrival, `query_start` the same instant (their Query Duration is 0).
    pub keys: u64,
    /// Notifications whose payload was not `KEY TIME_US`.
    pub bad: u64,
    /// Listener connections that failed to open or were lost.
    pub errors: u64,
}

/// A distribution a tap sends as counters: count, mean, P50, P99 and maximum, ns. A figure
/// the tap did not send (an older tap) is `None`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CostSpread {
    /// Values.
    pub count: u64,
    /// Mean, ns (`None` for a count of 0).
    pub mean_ns: Option<f64>,
    /// P50 (HDR, 3 digits), ns.
    pub p50_ns: Option<u64>,
    /// P99 (HDR, 3 digits), ns.
    pub p99_ns: Option<u64>,
    /// Maximum (exact), ns.
    pub max_ns: Option<u64>,
}

/// What the store taps said about one polled hop, and the hops their connections
/// announced (a stage between two hops of one poll has no bracket).
#[derive(Debug, Clone, Default)]
pub struct PolledHop {
    /// The polled hop.
    pub hop: String,
    /// Every hop announced by the taps that polled it.
    pub same_poll: Vec<String>,
    /// What each tap that polled it cost.
    pub taps: Vec<StoreTapCost>,
    keys: u64,
    sum_ns: u64,
    p50_ns: u64,
    p99_ns: u64,
    max_ns: u64,
    interval_ns: u64,
    polls: u64,
    poll_errors: u64,
}

/// Counter ids of a store tap that [`polled_hops`] reads (`docs/collector-protocol.md`).
mod tap_counter {
    pub(super) const POLLS: u16 = 64;
    pub(super) const POLL_ERRORS: u16 = 65;
    pub(super) const KEYS_FOUND: u16 = 66;
    pub(super) const BAD_KEYS: u16 = 67;
    pub(super) const ROWS: u16 = 68;
    pub(super) const ROWS_REPEATED: u16 = 69;
    pub(super) const BRACKET_SUM_NS: u16 = 73;
    pub(super) const BRACKET_MAX_NS: u16 = 74;
    pub(super) const BRACKET_P50_NS: u16 = 75;
    pub(super) const BRACKET_P99_NS: u16 = 76;
    pub(super) const QUERY_TIME_SUM_NS: u16 = 77;
    pub(super) const POLLS_ANSWERED: u16 = 78;
    pub(super) const SERVER_ELAPSED_SUM_NS: u16 = 79;
    pub(super) const SERVER_ELAPSED_POLLS: u16 = 80;
    pub(super) const POLLS_WITH_KEYS: u16 = 81;
    pub(super) const POLL_INTERVAL_NS: u16 = 82;
    pub(super) const BRACKET_HOP: u16 = 83;
    pub(super) const QUERY_TIME_P99_NS: u16 = 85;
    pub(super) const QUERY_TIME_P50_NS: u16 = 86;
    pub(super) const QUERY_TIME_MAX_NS: u16 = 87;
    pub(super) const SERVER_ELAPSED_P50_NS: u16 = 88;
    pub(super) const SERVER_ELAPSED_P99_NS: u16 = 89;
    pub(super) const SERVER_ELAPSED_MAX_NS: u16 = 90;
    pub(super) const POLLING_NS: u16 = 91;
    pub(super) const STORE_TIME_AHEAD: u16 = 105;
    pub(super) const STORE_TIME_AHEAD_MAX_NS: u16 = 106;
    pub(super) const STORE_TIME_BEHIND: u16 = 107;
    pub(super) const STORE_TIME_BEHIND_MAX_NS: u16 = 108;
    pub(super) const RECONNECTIONS: u16 = 109;
    pub(super) const NOTIFICATIONS: u16 = 110;
    pub(super) const KEYS_NOTIFIED: u16 = 111;
    pub(super) const BAD_NOTIFICATIONS: u16 = 112;
    pub(super) const LISTEN_ERRORS: u16 = 113;
    /// Every id read, the ones a tap has sent since the first version first.
    pub(super) const READ: [u16; 33] = [
        BRACKET_HOP,
        KEYS_FOUND,
        BRACKET_SUM_NS,
        BRACKET_MAX_NS,
        BRACKET_P50_NS,
        BRACKET_P99_NS,
        POLL_INTERVAL_NS,
        POLLS,
        POLL_ERRORS,
        BAD_KEYS,
        ROWS,
        ROWS_REPEATED,
        QUERY_TIME_SUM_NS,
        POLLS_ANSWERED,
        SERVER_ELAPSED_SUM_NS,
        SERVER_ELAPSED_POLLS,
        POLLS_WITH_KEYS,
        QUERY_TIME_P99_NS,
        QUERY_TIME_P50_NS,
        QUERY_TIME_MAX_NS,
        SERVER_ELAPSED_P50_NS,
        SERVER_ELAPSED_P99_NS,
        SERVER_ELAPSED_MAX_NS,
        POLLING_NS,
        STORE_TIME_AHEAD,
        STORE_TIME_AHEAD_MAX_NS,
        STORE_TIME_BEHIND,
        STORE_TIME_BEHIND_MAX_NS,
        RECONNECTIONS,
        NOTIFICATIONS,
        KEYS_NOTIFIED,
        BAD_NOTIFICATIONS,
        LISTEN_ERRORS,
    ];
    /// The ids without which a tap's counters are not read at all.
    pub(super) const REQUIRED: usize = 9;
}

/// The store taps' counters (`probes.parquet`, ids 64–113 of `docs/collector-protocol.md`),
/// per polled hop, with what each tap cost. Runs without store taps have none; counters
/// an older tap did not send are left out (`None`).
///
/// # Errors
/// When the probes table cannot be read.
pub async fn polled_hops(
    runs: &RunSet,
    ctx: &SessionContext,
) -> Result<Vec<PolledHop>, AnalysisError> {
    use tap_counter as id;
    let schema = ctx.table("probes").await?.schema().clone();
    let col = |id: u16| format!("counter_{id}");
    let present: Vec<u16> = id::READ
        .iter()
        .copied()
        .filter(|id| schema.has_column_with_unqualified_name(&col(*id)))
        .collect();
    if present.len() < id::REQUIRED || present[..id::REQUIRED] != id::READ[..id::REQUIRED] {
        return Ok(Vec::new());
    }
    // The latest value of each counter per tap connection (they are cumulative).
    let last = |id: u16| {
        format!(
            "CAST(last_value({c} ORDER BY at_ns) AS BIGINT) AS {c}",
            c = col(id)
        )
    };
    let sql = format!(
        "SELECT run_id, instance_id, {} FROM probes WHERE {} IS NOT NULL GROUP BY run_id, instance_id ORDER BY run_id, instance_id",
        present
            .iter()
            .map(|i| last(*i))
            .collect::<Vec<_>>()
            .join(", "),
        col(id::BRACKET_HOP)
    );
    let batches = ctx.sql(&sql).await?.collect().await?;
    let pipeline = runs.pipeline();
    let mut out: Vec<PolledHop> = Vec::new();
    for b in &batches {
        // A counter's value, `None` when the tap did not send it.
        let opt = |name: &str, row: usize| -> Option<u64> {
            b.column_by_name(name)
                .and_then(|c| c.as_primitive_opt::<Int64Type>())
                .filter(|c| c.is_valid(row))
                .map(|c| u64::try_from(c.value(row)).unwrap_or(0))
        };
        let run_ids = b.column_by_name("run_id").map(|c| {
            datafusion::arrow::compute::cast(c, &datafusion::arrow::datatypes::DataType::Utf8)
        });
        let run_ids = run_ids
            .transpose()
            .map_err(|e| AnalysisError::DataFusion(e.into()))?;
        for row in 0..b.num_rows() {
            let get = |id: u16| opt(&col(id), row).unwrap_or(0);
            let hop_id = get(id::BRACKET_HOP);
            let Some(hop) = pipeline
                .hop_ids()
                .find(|(_, id)| u64::from(id.0) == hop_id)
                .map(|(name, _)| name.to_owned())
            else {
                continue;
            };
            let run_id = run_ids
                .as_ref()
                .and_then(|a| a.as_string_opt::<i32>())
                .filter(|a| a.is_valid(row))
                .map(|a| a.value(row).to_owned())
                .unwrap_or_default();
            // Instance ids are random 64-bit numbers: read as they are, never as BIGINT.
            let instance = b
                .column_by_name("instance_id")
                .and_then(|c| c.as_primitive_opt::<UInt64Type>())
                .filter(|c| c.is_valid(row))
                .map_or(0, |c| c.value(row));
            let probe = runs
                .runs
                .iter()
                .filter(|r| run_id.is_empty() || r.summary.run_id == run_id)
                .flat_map(|r| r.summary.probes.iter())
                .find(|p| p.instance_id == instance);
            let announced: Vec<String> = probe.map(|p| p.hops.clone()).unwrap_or_default();
            let i = match out.iter().position(|p| p.hop == hop) {
                Some(i) => i,
                None => {
                    out.push(PolledHop {
                        hop: hop.clone(),
                        ..PolledHop::default()
                    });
                    out.len() - 1
                }
            };
            let p = &mut out[i];
            for h in announced {
                if !p.same_poll.contains(&h) {
                    p.same_poll.push(h);
                }
            }
            p.keys += get(id::KEYS_FOUND);
            p.sum_ns = p.sum_ns.saturating_add(get(id::BRACKET_SUM_NS));
            p.max_ns = p.max_ns.max(get(id::BRACKET_MAX_NS));
            p.p50_ns = p.p50_ns.max(get(id::BRACKET_P50_NS));
            p.p99_ns = p.p99_ns.max(get(id::BRACKET_P99_NS));
            p.interval_ns = p.interval_ns.max(get(id::POLL_INTERVAL_NS));
            p.polls += get(id::POLLS);
            p.poll_errors += get(id::POLL_ERRORS);

            let polls = get(id::POLLS);
            let polling_s = opt(&col(id::POLLING_NS), row)
                .filter(|n| *n > 0)
                .map(|n| n as f64 / 1e9);
            let answered = get(id::POLLS_ANSWERED);
            let mean = |sum: u64, n: u64| (n > 0).then(|| sum as f64 / n as f64);
            let server_polls = get(id::SERVER_ELAPSED_POLLS);
            p.taps.push(StoreTapCost {
                run_id,
                process: probe
                    .map_or_else(|| format!("instance {instance}"), |p| p.process.clone()),
                host: probe.map(|p| p.host.clone()).unwrap_or_default(),
                hop,
                poll_interval_ns: get(id::POLL_INTERVAL_NS),
                polls,
                poll_errors: get(id::POLL_ERRORS),
                polling_s,
                polls_per_s: polling_s.map(|s| polls as f64 / s),
                query_time: CostSpread {
                    count: answered,
                    mean_ns: mean(get(id::QUERY_TIME_SUM_NS), answered),
                    p50_ns: opt(&col(id::QUERY_TIME_P50_NS), row).filter(|_| answered > 0),
                    p99_ns: opt(&col(id::QUERY_TIME_P99_NS), row).filter(|_| answered > 0),
                    max_ns: opt(&col(id::QUERY_TIME_MAX_NS), row).filter(|_| answered > 0),
                },
                server_elapsed: (server_polls > 0).then(|| CostSpread {
                    count: server_polls,
                    mean_ns: mean(get(id::SERVER_ELAPSED_SUM_NS), server_polls),
                    p50_ns: opt(&col(id::SERVER_ELAPSED_P50_NS), row),
                    p99_ns: opt(&col(id::SERVER_ELAPSED_P99_NS), row),
                    max_ns: opt(&col(id::SERVER_ELAPSED_MAX_NS), row),
                }),
                keys_found: get(id::KEYS_FOUND),
                rows: get(id::ROWS),
                rows_repeated: get(id::ROWS_REPEATED),
                polls_with_keys: get(id::POLLS_WITH_KEYS),
                bad_keys: get(id::BAD_KEYS),
                store_time_ahead: (get(id::STORE_TIME_AHEAD), get(id::STORE_TIME_AHEAD_MAX_NS)),
                store_time_behind: (
                    get(id::STORE_TIME_BEHIND),
                    get(id::STORE_TIME_BEHIND_MAX_NS),
                ),
                reconnections: get(id::RECONNECTIONS),
                notified: opt(&col(id::NOTIFICATIONS), row).map(|notifications| Notified {
                    notifications,
                    keys: get(id::KEYS_NOTIFIED),
                    bad: get(id::BAD_NOTIFICATIONS),
                    errors: get(id::LISTEN_ERRORS),
                }),
            });
        }
    }
    Ok(out)
}

/// The poll bracket of a stage from `from` to `to`: the polled hop at one end, unless one
/// poll stamped both ends (`query_start → queryable`). Its sign follows the end: a stage
/// ending at the polled hop is measured long, one starting there short.
#[must_use]
pub fn poll_bracket(
    polled: &[PolledHop],
    from: &str,
    to: &str,
    p50: Option<i64>,
) -> Option<PollBracket> {
    let p = polled.iter().find(|p| {
        (p.hop == from || p.hop == to)
            && !(p.same_poll.iter().any(|h| h == from) && p.same_poll.iter().any(|h| h == to))
    })?;
    Some(PollBracket {
        hop: p.hop.clone(),
        end: if p.hop == to {
            PolledEnd::To
        } else {
            PolledEnd::From
        },
        keys: p.keys,
        mean_ns: if p.keys == 0 {
            0.0
        } else {
            p.sum_ns as f64 / p.keys as f64
        },
        p50_ns: p.p50_ns,
        p99_ns: p.p99_ns,
        max_ns: p.max_ns,
        poll_interval_ns: p.interval_ns,
        polls: p.polls,
        poll_errors: p.poll_errors,
        warning: p50
            .is_some_and(|p50| p.p99_ns as f64 > CLOCK_WARN_FRACTION * p50.unsigned_abs() as f64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_poll_bracket_applies_to_stages_with_one_polled_end() {
        let polled = vec![PolledHop {
            hop: "queryable".into(),
            same_poll: vec!["query_start".into(), "queryable".into()],
            taps: Vec::new(),
            keys: 4,
            sum_ns: 40_000_000,
            p50_ns: 9_000_000,
            p99_ns: 12_000_000,
            max_ns: 15_000_000,
            interval_ns: 10_000_000,
            polls: 100,
            poll_errors: 1,
        }];
        let b = poll_bracket(&polled, "publish", "queryable", Some(200_000_000)).unwrap();
        assert_eq!(b.hop, "queryable");
        assert_eq!(b.end, PolledEnd::To, "a stage ending at the polled hop");
        assert_eq!(b.p50_ns, 9_000_000);
        assert!((b.mean_ns - 10_000_000.0).abs() < 1e-6);
        assert_eq!(
            (b.p99_ns, b.max_ns, b.polls, b.poll_errors),
            (12_000_000, 15_000_000, 100, 1)
        );
        assert!(!b.warning, "12 ms against a P50 of 200 ms is small");
        assert!(
            poll_bracket(&polled, "publish", "queryable", Some(20_000_000))
                .unwrap()
                .warning
        );
        assert!(poll_bracket(&polled, "store_in", "queryable", None).is_some());
        // A stage that starts at the polled hop is measured short, not long.
        let from = poll_bracket(&polled, "queryable", "reader_seen", Some(1)).unwrap();
        assert_eq!(from.end, PolledEnd::From);
        assert_eq!(PolledEnd::From.bound("15ms"), "+15ms/−0");
        assert_eq!(PolledEnd::To.bound("15ms"), "+0/−15ms");
        assert!(
            poll_bracket(&polled, "query_start", "queryable", Some(1)).is_none(),
            "one poll stamped both ends"
        );
        assert!(poll_bracket(&polled, "publish", "broker", Some(1)).is_none());
        assert!(poll_bracket(&[], "publish", "queryable", Some(1)).is_none());
    }
}

#[cfg(test)]
impl StoreTapCost {
    /// A tap that found 40 keys in 10 polls and has nothing more to say: for tests.
    pub(crate) fn example() -> Self {
        Self {
            run_id: "r".into(),
            process: "hoptrace tap".into(),
            host: "h".into(),
            hop: "queryable".into(),
            poll_interval_ns: 1_000_000,
            polls: 10,
            poll_errors: 0,
            polling_s: Some(1.0),
            polls_per_s: Some(10.0),
            query_time: CostSpread {
                count: 0,
                mean_ns: None,
                p50_ns: None,
                p99_ns: None,
                max_ns: None,
            },
            server_elapsed: None,
            keys_found: 40,
            rows: 40,
            rows_repeated: 0,
            polls_with_keys: 1,
            bad_keys: 0,
            store_time_ahead: (0, 0),
            store_time_behind: (0, 0),
            reconnections: 0,
            notified: None,
        }
    }
}

#[cfg(test)]
mod schema_tests {
    use super::{Notified, StoreTapCost};

    /// The keys of a JSON object, sorted.
    fn keys(v: &serde_json::Value) -> Vec<&str> {
        let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        k.sort_unstable();
        k
    }

    /// `summary.json`'s schema names every key a store tap's entry has, and no other
    /// (it allows no other): a field added here without the schema fails.
    #[test]
    fn the_schema_describes_every_store_tap_field() {
        let schema: serde_json::Value = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/schema/summary.schema.json"
        )))
        .unwrap();
        let items = &schema["properties"]["store_taps"]["items"];
        let tap = StoreTapCost {
            notified: Some(Notified {
                notifications: 1,
                keys: 1,
                bad: 0,
                errors: 0,
            }),
            ..StoreTapCost::example()
        };
        let value = serde_json::to_value(&tap).unwrap();
        assert_eq!(keys(&value), keys(&items["properties"]));
        assert_eq!(
            keys(&value["notified"]),
            keys(&items["properties"]["notified"]["oneOf"][1]["properties"])
        );
        for r in items["required"].as_array().unwrap() {
            assert!(value.get(r.as_str().unwrap()).is_some(), "{r}");
        }
    }
}
