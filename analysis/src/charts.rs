//! Vega-Lite chart specs (v6) with their data inlined, built from the HDR histograms of a
//! [`crate::summary::compute`]:
//!
//! - `latency-histograms`: share of each stage's messages per logarithmic latency bin;
//! - `latency-cdf`: HDR percentile spectra, latency against `1/(1-p)` on a log axis, so
//!   P50, P90 ... P99.999 are evenly spaced;
//! - `heatmap-<stage>`: time × latency, messages per cell, one per stage;
//! - `throughput`: metrics per second over time.

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

/// Latency histograms of every stage, as step lines (share of the stage's messages).
#[must_use]
pub fn histograms(hists: &[StageHistograms]) -> Chart {
    let mut values = Vec::new();
    for h in hists {
        let total = h.whole.len().max(1) as f64;
        for (lo, hi, n) in log_bins(&h.whole) {
            values.push(json!({
                "stage": h.name, "lo_us": us(lo), "hi_us": us(hi),
                "share": n as f64 / total, "messages": n,
            }));
        }
    }
    let spec = merge(
        base("Latency histograms"),
        json!({
            "data": {"values": values},
            "mark": {"type": "bar", "opacity": 0.55},
            "encoding": {
                "x": {"field": "lo_us", "type": "quantitative", "scale": {"type": "log"},
                      "title": "latency (µs, log scale)"},
                "x2": {"field": "hi_us"},
                "y": {"field": "share", "type": "quantitative", "stack": null,
                      "title": "share of messages", "axis": {"format": ".0%"}},
                "color": {"field": "stage", "type": "nominal", "title": "stage"},
                "tooltip": [
                    {"field": "stage"}, {"field": "lo_us", "title": "from µs"},
                    {"field": "hi_us", "title": "to µs"}, {"field": "messages"},
                    {"field": "share", "format": ".3%"}
                ]
            }
        }),
    );
    Chart {
        stem: "latency-histograms".into(),
        title: "Latency histograms".into(),
        spec,
    }
}

/// HDR percentile spectra of every stage.
#[must_use]
pub fn cdf(hists: &[StageHistograms]) -> Chart {
    let mut values = Vec::new();
    for h in hists {
        if h.whole.is_empty() {
            continue;
        }
        for v in h.whole.iter_quantiles(5) {
            let p = v.quantile_iterated_to();
            if p >= 1.0 {
                break;
            }
            values.push(json!({
                "stage": h.name,
                "inv": 1.0 / (1.0 - p),
                "percentile": p * 100.0,
                "latency_us": us(h.whole.median_equivalent(v.value_iterated_to()) as f64),
            }));
        }
    }
    let spec = merge(
        base("Latency percentile spectrum (CDF)"),
        json!({
            "data": {"values": values},
            "mark": {"type": "line", "interpolate": "step-after"},
            "encoding": {
                "x": {"field": "inv", "type": "quantitative",
                      "scale": {"type": "log", "domainMin": 1},
                      "title": "percentile",
                      "axis": {"values": [1, 2, 10, 100, 1000, 10000, 100000, 1000000],
                               "labelExpr": "format(100 - 100 / datum.value, '.4~f') + '%'"}},
                "y": {"field": "latency_us", "type": "quantitative", "title": "latency (µs)"},
                "color": {"field": "stage", "type": "nominal", "title": "stage"},
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
    let mut values = Vec::new();
    for (b, hist) in h.by_time.iter().enumerate() {
        let t = b as f64 * step;
        for (lo, hi, n) in log_bins(hist) {
            values.push(json!({
                "t_s": t, "t2_s": t + step, "lo_us": us(lo), "hi_us": us(hi), "messages": n,
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
                "color": {"field": "messages", "type": "quantitative",
                          "scale": {"type": "log", "scheme": "viridis"}, "title": "messages"},
                "tooltip": [{"field": "t_s", "title": "s"}, {"field": "lo_us", "title": "from µs"},
                            {"field": "hi_us", "title": "to µs"}, {"field": "messages"}]
            }
        }),
    );
    Chart {
        stem: format!("heatmap-{}", hoptrace_format::spec::slug(&h.name)),
        title,
        spec,
    }
}

/// Metrics per second over time.
#[must_use]
pub fn throughput(summary: &Summary) -> Chart {
    let values: Vec<Value> = summary
        .throughput
        .buckets
        .iter()
        .map(|b| json!({"t_s": b.t_s, "metrics_per_s": b.metrics_per_s, "messages": b.messages}))
        .collect();
    let spec = merge(
        base("Throughput over time"),
        json!({
            "data": {"values": values},
            "mark": {"type": "line", "interpolate": "step-after", "point": false},
            "encoding": {
                "x": {"field": "t_s", "type": "quantitative", "title": "time (s from start)"},
                "y": {"field": "metrics_per_s", "type": "quantitative", "title": "metrics/s"},
                "tooltip": [{"field": "t_s", "title": "s"}, {"field": "metrics_per_s", "format": ",.0f"},
                            {"field": "messages"}]
            }
        }),
    );
    Chart {
        stem: "throughput".into(),
        title: "Throughput over time".into(),
        spec,
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
