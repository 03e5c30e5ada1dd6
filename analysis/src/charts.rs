//! Vega-Lite chart specs (v6) with their data inlined, built from the HDR histograms of a
//! [`crate::summary::compute`]:
//!
//! - `latency-histograms`: one panel per stage (small multiples, each on its own
//!   scales): the share of the stage's messages per logarithmic latency bin;
//! - `latency-cdf`: HDR percentile spectra, latency (log axis) against `1/(1-p)` on a log
//!   axis, so P50, P90 ... P99.999 are evenly spaced and every stage shows its shape;
//! - `heatmap-<stage>`: time × latency, messages per cell, one per stage;
//! - `throughput`: metrics per second over time, a bar per time bucket.

use hdrhistogram::Histogram;
use serde_json::{Value, json};

use crate::summary::{StageHistograms, Summary};

/// The Vega-Lite schema the specs follow.
pub const SCHEMA: &str = "https://vega.github.io/schema/vega-lite/v6.json";
/// Logarithmic bins per decade in histograms and heatmaps.
pub const BINS_PER_DECADE: f64 = 10.0;

/// One chart: a file stem, a title and its spec.
#[derive(Debug, Clone)]
pub struct Chart {
    /// File stem (`latency-cdf`); the spec is written as `<stem>.vl.json`.
    pub stem: String,
    /// Title shown above it.
    pub title: String,
    /// The Vega-Lite spec.
    pub spec: Value,
}

/// Logarithmic bins of `h`: (low ns, high ns, count), non-empty bins only.
#[must_use]
pub fn log_bins(h: &Histogram<u64>) -> Vec<(f64, f64, u64)> {
    let mut bins: std::collections::BTreeMap<i64, u64> = std::collections::BTreeMap::new();
    for v in h.iter_recorded() {
        let value = h.median_equivalent(v.value_iterated_to()).max(1) as f64;
        let bin = (value.log10() * BINS_PER_DECADE).floor() as i64;
        *bins.entry(bin).or_default() += v.count_at_value();
    }
    bins.into_iter()
        .map(|(b, n)| {
            (
                10f64.powf(b as f64 / BINS_PER_DECADE),
                10f64.powf((b + 1) as f64 / BINS_PER_DECADE),
                n,
            )
        })
        .collect()
}

fn us(ns: f64) -> f64 {
    (ns / 1e3 * 1000.0).round() / 1000.0
}

/// Every chart of a summary.
#[must_use]
pub fn all(summary: &Summary, hists: &[StageHistograms]) -> Vec<Chart> {
    let mut charts = vec![histograms(hists), cdf(hists), throughput(summary)];
    for h in hists {
        charts.push(heatmap(summary, h));
    }
    charts
}

pub(crate) fn base(title: &str) -> Value {
    json!({
        "$schema": SCHEMA,
        "title": title,
        "width": 640,
        "height": 320,
        "config": {"font": "sans-serif", "view": {"stroke": null}},
    })
}

pub(crate) fn merge(mut a: Value, b: Value) -> Value {
    if let (Some(a), Value::Object(b)) = (a.as_object_mut(), b) {
        a.extend(b);
    }
    a
}

/// Height of one stage's panel in the small-multiple charts, pixels.
pub const PANEL_HEIGHT: u32 = 110;

/// Latency histograms, one panel per stage (small multiples): bars of the share of the
/// stage's messages per logarithmic latency bin, each panel with its own latency range
/// (log axis) and share axis from 0, so a 60 µs stage reads as well as a 24 ms one.
#[must_use]
pub fn histograms(hists: &[StageHistograms]) -> Chart {
    let unit = "messages";
    let mut values = Vec::new();
    for h in hists {
        let total = h.whole.len().max(1) as f64;
        for (lo, hi, n) in log_bins(&h.whole) {
            values.push(json!({
                "stage": h.name, "lo_us": us(lo), "hi_us": us(hi),
                "share": n as f64 / total, "count": n,
            }));
        }
    }
    let order: Vec<&str> = hists.iter().map(|h| h.name.as_str()).collect();
    let spec = json!({
        "$schema": SCHEMA,
        "title": format!("Latency histograms, share of {unit} (one panel per stage, each on its own scale)"),
        "config": {"font": "sans-serif", "view": {"stroke": "#ddd"}},
        "data": {"values": values},
        "facet": {"row": {"field": "stage", "type": "nominal", "sort": order,
                          "title": null,
                          "header": {"labelAngle": 0, "labelAlign": "left",
                                     "labelAnchor": "start", "labelOrient": "top",
                                     "labelFontWeight": "bold", "labelFontSize": 12}}},
        "spec": {
            "width": 640,
            "height": PANEL_HEIGHT,
            "mark": {"type": "rect", "color": "#4c78a8"},
            "encoding": {
                "x": {"field": "lo_us", "type": "quantitative",
                      "scale": {"type": "log", "nice": false},
                      "title": "latency (µs, log scale)"},
                "x2": {"field": "hi_us"},
                "y": {"field": "share", "type": "quantitative",
                      "scale": {"domainMin": 0, "nice": true, "zero": true},
                      "title": format!("share of {unit}"), "axis": {"format": ".0%", "tickCount": 3}},
                "y2": {"datum": 0},
                "tooltip": [
                    {"field": "stage"}, {"field": "lo_us", "title": "from µs"},
                    {"field": "hi_us", "title": "to µs"}, {"field": "count", "title": unit},
                    {"field": "share", "format": ".3%"}
                ]
            }
        },
        "resolve": {"scale": {"x": "independent", "y": "independent"},
                    "axis": {"x": "independent"}},
    });
    Chart {
        stem: "latency-histograms".into(),
        title: "Latency histograms".into(),
        spec,
    }
}

/// Tick positions of the percentile axis, as `1/(1-p)`: 0 %, 50 %, 90 %, 99 % ... up to
/// the highest the data reaches.
fn percentile_ticks(highest_inv: f64) -> Vec<u64> {
    let mut ticks = vec![1, 2];
    let mut t = 10_u64;
    while t as f64 <= highest_inv * 1.0001 {
        ticks.push(t);
        t *= 10;
    }
    ticks
}

/// HDR percentile spectra of every stage on one panel, as HdrHistogram's plotter draws
/// them: the percentile on a `1/(1-p)` log axis (P50, P90, P99, P99.9 ... evenly
/// spaced) against the latency on a log axis, so stages microseconds and milliseconds
/// apart all show their shape.
#[must_use]
pub fn cdf(hists: &[StageHistograms]) -> Chart {
    let mut values = Vec::new();
    let mut highest: f64 = 10.0;
    for h in hists {
        if h.whole.is_empty() {
            continue;
        }
        for v in h.whole.iter_quantiles(5) {
            let p = v.quantile_iterated_to();
            if p >= 1.0 {
                break;
            }
            let inv = 1.0 / (1.0 - p);
            highest = highest.max(inv);
            values.push(json!({
                "stage": h.name,
                "inv": inv,
                "percentile": p * 100.0,
                // A log axis has no 0: values below 1 ns sit at 1 ns. The bucket's middle
                // never above the exact maximum, as every reported percentile.
                "latency_us": us(h.whole.median_equivalent(v.value_iterated_to())
                    .min(u64::try_from(h.max_ns).unwrap_or(0))
                    .max(1) as f64),
            }));
        }
    }
    let order: Vec<&str> = hists.iter().map(|h| h.name.as_str()).collect();
    let spec = merge(
        base("Latency percentile spectrum (log latency)"),
        json!({
            "data": {"values": values},
            "mark": {"type": "line", "interpolate": "step-after"},
            "encoding": {
                "x": {"field": "inv", "type": "quantitative",
                      "scale": {"type": "log", "domainMin": 1},
                      "title": "percentile",
                      "axis": {"values": percentile_ticks(highest),
                               "labelExpr": "format(100 - 100 / datum.value, '.4~f') + '%'"}},
                "y": {"field": "latency_us", "type": "quantitative",
                      "scale": {"type": "log"},
                      "title": "latency (µs, log scale)"},
                "color": {"field": "stage", "type": "nominal", "title": "stage",
                          "sort": order},
                "tooltip": [{"field": "stage"}, {"field": "percentile", "format": ".4f"},
                            {"field": "latency_us", "title": "µs"}]
            }
        }),
    );
    Chart {
        stem: "latency-cdf".into(),
        title: "Latency cumulative distribution (percentile spectrum)".into(),
        spec,
    }
}

/// Time × latency heatmap of one stage.
#[must_use]
pub fn heatmap(summary: &Summary, h: &StageHistograms) -> Chart {
    let step = summary.throughput.bucket_s;
    let unit = "messages";
    let mut values = Vec::new();
    for (b, hist) in h.by_time.iter().enumerate() {
        let t = b as f64 * step;
        for (lo, hi, n) in log_bins(hist) {
            values.push(json!({
                "t_s": t, "t2_s": t + step, "lo_us": us(lo), "hi_us": us(hi), "count": n,
            }));
        }
    }
    let title = format!("{}: latency over time", h.name);
    let spec = merge(
        base(&title),
        json!({
            "data": {"values": values},
            "mark": "rect",
            "encoding": {
                "x": {"field": "t_s", "type": "quantitative", "title": "time (s from start)"},
                "x2": {"field": "t2_s"},
                "y": {"field": "lo_us", "type": "quantitative", "scale": {"type": "log"},
                      "title": "latency (µs, log scale)"},
                "y2": {"field": "hi_us"},
                "color": {"field": "count", "type": "quantitative",
                          "scale": {"type": "log", "scheme": "viridis"}, "title": unit},
                "tooltip": [{"field": "t_s", "title": "s"}, {"field": "lo_us", "title": "from µs"},
                            {"field": "hi_us", "title": "to µs"}, {"field": "count", "title": unit}]
            }
        }),
    );
    Chart {
        stem: format!("heatmap-{}", hoptrace_format::spec::slug(&h.name)),
        title,
        spec: with_events(spec, summary),
    }
}

/// A chart over the run's time axis with the run's events ([`crate::events`]) as dashed
/// vertical lines over it: its mark becomes the first layer of two.
fn with_events(mut spec: Value, summary: &Summary) -> Value {
    if summary.events.is_empty() {
        return spec;
    }
    let events: Vec<Value> = summary
        .events
        .iter()
        .map(|e| {
            json!({"t_s": (e.at_unix_ns - summary.throughput.start_unix_ns) as f64 / 1e9,
                   "event": e.kind.label(), "of": e.subject, "detail": e.detail})
        })
        .collect();
    let Some(o) = spec.as_object_mut() else {
        return spec;
    };
    let mut first = serde_json::Map::new();
    for k in ["data", "mark", "encoding"] {
        if let Some(v) = o.remove(k) {
            first.insert(k.into(), v);
        }
    }
    o.insert(
        "layer".into(),
        json!([first, {
            "data": {"values": events},
            "mark": {"type": "rule", "color": "#d62728", "strokeDash": [4, 3], "strokeWidth": 1.5},
            "encoding": {
                "x": {"field": "t_s", "type": "quantitative"},
                "tooltip": [{"field": "event"}, {"field": "of"}, {"field": "detail"},
                            {"field": "t_s", "title": "s", "format": ".1f"}]
            }
        }]),
    );
    spec
}

/// Metrics per second over time.
#[must_use]
pub fn throughput(summary: &Summary) -> Chart {
    let step = summary.throughput.bucket_s;
    let values: Vec<Value> = summary
        .throughput
        .buckets
        .iter()
        .map(|b| {
            json!({"t_s": b.t_s, "t2_s": b.t_s + step, "metrics_per_s": b.metrics_per_s,
                   "messages": b.messages})
        })
        .collect();
    // Each bucket a bar over its own interval: a run of one bucket shows, and so does the
    // last bucket of any run (a step line ends where the last bucket begins).
    let spec = merge(
        base("Throughput over time"),
        json!({
            "data": {"values": values},
            "mark": {"type": "rect", "color": "#4c78a8"},
            "encoding": {
                "x": {"field": "t_s", "type": "quantitative", "title": "time (s from start)"},
                "x2": {"field": "t2_s"},
                "y": {"field": "metrics_per_s", "type": "quantitative", "title": "metrics/s"},
                "y2": {"datum": 0},
                "tooltip": [{"field": "t_s", "title": "s"}, {"field": "metrics_per_s", "format": ",.0f"},
                            {"field": "messages"}]
            }
        }),
    );
    Chart {
        stem: "throughput".into(),
        title: "Throughput over time".into(),
        spec: with_events(spec, summary),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_bins_keep_every_count() {
        let mut h = hoptrace_format::hist::new_histogram();
        for v in [1u64, 10, 999, 1_000, 1_500, 250_000, 3_000_000, 3_000_001] {
            h.record(v).unwrap();
        }
        let bins = log_bins(&h);
        assert_eq!(bins.iter().map(|b| b.2).sum::<u64>(), h.len());
        assert!(bins.windows(2).all(|w| w[0].1 <= w[1].0 + 1e-6));
        for (lo, hi, _) in bins {
            assert!((hi / lo - 10f64.powf(0.1)).abs() < 1e-9);
        }
    }
}
