//! The report's tail attribution: per headline stage, each component's share of the time
//! of the messages at or above its P99, P99.9 (and P99.99), and its slowest messages as
//! timelines.

use hoptrace_format::units::{count, duration_f64, signed_ns};

use super::block::{Block, TimelineRow, Timelines};
use crate::summary::Summary;
use crate::tail::{Concentrated, Concentration, TailAttribution, TailLevel};

/// Rows shown per dimension in the report (the flagged ones always): the JSON lists more.
const SHOWN: usize = 3;

/// A p-value: two significant digits, in scientific notation below 0.001.
fn p_value(p: f64) -> String {
    if p < 1e-300 {
        "< 1e-300".into()
    } else if p < 1e-3 {
        format!("{p:.1e}")
    } else {
        format!("{p:.3}")
    }
}

/// ", which lines up with …" for a second that lines up with events of the run.
fn lines_up(v: &Concentrated) -> String {
    match v.lines_up_with.as_slice() {
        [] => String::new(),
        [one] => format!(", which lines up with {one}"),
        [first, rest @ ..] => format!(
            ", which lines up with {first} and {} more event{}",
            rest.len(),
            if rest.len() == 1 { "" } else { "s" }
        ),
    }
}

/// The sentence on a tail's likely causes, or that it is spread as chance would spread it.
fn causes_sentence(c: &Concentration) -> String {
    let causes = c.causes();
    if causes.is_empty() {
        let around = c
            .dimensions
            .iter()
            .any(|d| d.dimension == crate::tail::concentration::AROUND_EVENTS);
        return format!(
            " It is spread over publishers, streams, metric counts and seconds{} as chance would spread it: no value holds significantly more of it than of all messages.",
            if around {
                ", and before and after the run's events,"
            } else {
                ""
            }
        );
    }
    let named: Vec<String> = causes
        .iter()
        .take(3)
        .map(|(d, v)| {
            format!(
                "{d} {} (×{:.1} the tail's rate, p {}{})",
                v.value,
                v.times,
                p_value(v.p_value),
                lines_up(v)
            )
        })
        .collect();
    let more = causes.len().saturating_sub(3);
    format!(
        " It concentrates in {}{}: likely causes.",
        named.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    )
}

/// The table of where one tail set concentrates.
fn concentration_blocks(l: &TailLevel, c: &Concentration) -> Vec<Block> {
    let label = l.percentile.label();
    let mut b = vec![Block::Para(format!(
        "**Where the {label} tail concentrates.** Per dimension, the values holding the most tail messages above what chance would give them (expected: the value's messages times the tail's share of all messages; tail rate: the value's share over that). p: the probability of that many or more were the tail spread by chance (one-sided binomial test); a value is a likely cause when p is below {} over the {} values tested ({}).{}",
        crate::tail::concentration::ALPHA,
        count(c.tested),
        p_value(c.level),
        if c.cluster_size > 1.05 {
            format!(
                " Messages leave the last hop in groups (one stamp for each, a batch) of {:.1} on average, weighted by size: the test counts each group once.",
                c.cluster_size
            )
        } else {
            String::new()
        }
    ))];
    let mut rows = Vec::new();
    let mut single = Vec::new();
    for d in &c.dimensions {
        if d.values < 2 {
            single.push(format!("{} (one value)", d.dimension));
            continue;
        }
        for (i, v) in d.listed.iter().enumerate() {
            // Beyond the first few, a value shows when it is a likely cause or a second
            // that lines up with an event (listed below the table).
            if i >= SHOWN && !v.likely_cause && v.lines_up_with.is_empty() {
                continue;
            }
            rows.push(vec![
                format!("{} ({} values)", d.dimension, count(d.values)),
                v.value.clone(),
                count(v.messages),
                count(v.in_tail),
                expected(v.expected),
                format!("×{:.1}", v.times),
                p_value(v.p_value),
                if v.likely_cause { "yes" } else { "no" }.into(),
            ]);
        }
    }
    if !rows.is_empty() {
        b.push(Block::Table(
            [
                "Dimension",
                "Value",
                "Messages",
                "In tail",
                "Expected",
                "Tail rate",
                "p",
                "Likely cause",
            ]
            .map(String::from)
            .to_vec(),
            rows,
        ));
    }
    if !single.is_empty() {
        b.push(Block::Para(format!(
            "Nothing to compare in: {}.",
            single.join(", ")
        )));
    }
    let lined: Vec<String> = c
        .dimensions
        .iter()
        .flat_map(|d| &d.listed)
        .filter(|v| !v.lines_up_with.is_empty())
        .map(|v| {
            format!(
                "second {}{}: {}",
                v.value,
                if v.likely_cause {
                    " (likely cause)"
                } else {
                    ""
                },
                v.lines_up_with.join("; ")
            )
        })
        .collect();
    if !lined.is_empty() {
        b.push(Block::Para(format!(
            "Seconds above that line up with an event of the run (within {} s of it; see Events):",
            crate::events::LINE_UP_NS / 1_000_000_000
        )));
        b.push(Block::Bullets(lined));
    }
    b
}

fn percent(x: Option<f64>) -> String {
    // -0.0 % reads as a sign where there is none.
    x.map_or_else(
        || "-".into(),
        |x| format!("{:.1} %", x * 100.0 + 0.0).replace("-0.0 %", "0.0 %"),
    )
}

/// An expected count, to a tenth, with thousands separators as the counts beside it.
fn expected(x: f64) -> String {
    let tenths = (x.max(0.0) * 10.0).round() as u64;
    format!("{}.{}", count(tenths / 10), tenths % 10)
}

fn times(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |x| format!("×{x:.1}"))
}

fn mean(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), duration_f64)
}

/// One sentence on a tail set: its size, its threshold, and the component with the
/// largest share of its time and of its excess over the rest.
fn level_sentence(t: &TailAttribution, l: &TailLevel) -> String {
    let label = l.percentile.label();
    let mut s = format!(
        "{label} tail: {} messages at or above {} (the lowest value of the {label}'s HDR bucket), mean {} against {} over all",
        count(l.messages),
        signed_ns(l.threshold_ns),
        mean(l.mean_ns),
        mean(t.mean_ns)
    );
    if let Some((c, share)) = t.dominant(l) {
        let excess = t
            .components
            .iter()
            .zip(&l.components)
            .find(|(x, _)| x.name == c.name)
            .and_then(|(_, s)| s.share_of_excess);
        s.push_str(&format!(
            ": {} of its time is {}",
            percent(Some(share)),
            c.name
        ));
        if let Some(e) = excess {
            s.push_str(&format!(
                ", and {} of what makes it slower than the rest",
                percent(Some(e))
            ));
        }
    }
    if l.with_components < l.messages {
        s.push_str(&format!(
            " ({} of them lack a component's hop and are left out of the shares)",
            count(l.messages - l.with_components)
        ));
    }
    s.push('.');
    if let Some(c) = &l.concentration {
        s.push_str(&causes_sentence(c));
    }
    s
}

/// The blocks of one headline stage's attribution.
fn stage_blocks(t: &TailAttribution, date_of: fn(i64) -> String) -> Vec<Block> {
    let mut b = vec![Block::Heading(
        3,
        format!("{}: where the tail's time goes", t.stage),
    )];
    let chain: Vec<String> = t
        .components
        .iter()
        .map(|c| {
            if c.spec_stage {
                format!("{} ({} → {})", c.name, c.from, c.to)
            } else {
                format!("{} (consecutive hops, no stage of the spec)", c.name)
            }
        })
        .collect();
    b.push(Block::Para(format!(
        "Components, in order: {}. They add up to {} for each message that has every hop. \"All\" is each component over all messages with its two hops ({} over {} messages); a tail's figures are over its messages that have every hop. Every figure here counts messages, whatever the stage tables count.",
        chain.join(", "),
        t.stage,
        t.stage,
        count(t.messages)
    )));
    let mut bullets: Vec<String> = t.levels.iter().map(|l| level_sentence(t, l)).collect();
    bullets.extend(t.notes.iter().cloned());
    b.push(Block::Bullets(bullets));
    if !t.levels.is_empty() {
        let mut head = vec!["Component".into(), "Median, all".into(), "Mean, all".into()];
        for l in &t.levels {
            let label = l.percentile.label();
            head.extend([
                format!("{label} tail: median"),
                format!("{label}: share of time"),
                format!("{label}: share of excess"),
            ]);
        }
        let rows = t
            .components
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let all = &t.overall[i];
                let mut row = vec![
                    c.name.clone(),
                    all.median.map_or_else(|| "-".into(), |p| p.shown()),
                    mean(all.mean_ns),
                ];
                for l in &t.levels {
                    let s = &l.components[i];
                    row.extend([
                        s.median.map_or_else(
                            || "-".into(),
                            |p| format!("{} ({})", p.shown(), times(s.times_median)),
                        ),
                        percent(s.share),
                        percent(s.share_of_excess),
                    ]);
                }
                row
            })
            .collect();
        b.push(Block::Table(head, rows));
        b.push(Block::Para(
            "Share of time: the component's mean over the tail's mean. Share of excess: how much of the tail's mean above the mean over all messages the component's own rise accounts for. (×n): the tail's median over the median over all messages.".into(),
        ));
    }
    for l in &t.levels {
        if let Some(c) = &l.concentration {
            b.extend(concentration_blocks(l, c));
        }
    }
    if !t.exemplars.is_empty() {
        b.push(Block::Para(format!(
            "**The {} slowest messages** (key publisher/stream/sequence; time: the message's first stamp, else its intended send time):",
            t.exemplars.len()
        )));
        let has_ids = t.exemplars.iter().any(|e| e.otel_trace_id.is_some());
        let mut head = vec!["#".into(), "Key".into(), "Time".into(), t.stage.clone()];
        if has_ids {
            head.push("Trace id".into());
        }
        let rows = t
            .exemplars
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let mut cells = vec![
                    (i + 1).to_string(),
                    format!("{}/{}/{}", e.publisher, e.stream, e.sequence),
                    e.time_unix_ns.map_or_else(|| "-".into(), date_of),
                    signed_ns(e.delta_ns),
                ];
                if has_ids {
                    cells.push(e.otel_trace_id.clone().unwrap_or_else(|| "-".into()));
                }
                TimelineRow {
                    cells,
                    segments: e.components_ns.clone(),
                }
            })
            .collect();
        b.push(Block::Timelines(Timelines {
            legend: t.components.iter().map(|c| c.name.clone()).collect(),
            head,
            rows,
        }));
    }
    b
}

/// The report's "Tail Attribution" section; empty when no headline stage splits.
pub(super) fn tail_blocks(s: &Summary) -> Vec<Block> {
    if s.tails.is_empty() {
        return Vec::new();
    }
    let mut b = vec![
        Block::Heading(2, "Tail Attribution".into()),
        Block::Para(
            "Why the slowest messages of each headline stage are slow: the stage split into the stages that chain from its first hop to its last (two consecutive hops where no stage of the spec joins them), each component's share of the tail's time against all messages, and the slowest messages one by one.".into(),
        ),
    ];
    for t in &s.tails {
        b.extend(stage_blocks(t, super::blocks::date_of_ms));
    }
    b
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_expected_count_reads_like_the_counts_beside_it() {
        assert_eq!(super::expected(1_234_567.449), "1,234,567.4");
        assert_eq!(super::expected(999.96), "1,000.0");
        assert_eq!(super::expected(0.04), "0.0");
        assert_eq!(super::expected(12.3), "12.3");
    }
}
