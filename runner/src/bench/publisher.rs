//! `hoptrace bench publisher`: the highest rate the publisher sustains against a broker.
//!
//! Each step publishes a fixed schedule at a target rate and passes when the achieved
//! rate (metrics handed to the client over the time that took; an open-loop publisher that
//! falls behind still sends every message, later) is at least 99 % of the target and the
//! client confirmed every message (MQTT: written or acknowledged; Kafka: delivered) with
//! no error. The delivered rate (over the time until the last confirmation) is shown
//! beside it. The rate doubles until a step fails, then bisects
//! between the last pass and the first failure until they are within `--precision`.
//! The publisher's CPU use is this process's (client threads included) over each step.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use crate::procfs::{Pid, USER_HZ, process_ticks};
use anyhow::Context as _;
use hoptrace_broker::url::Endpoint;
use hoptrace_publisher::payload::PayloadFormat;
use hoptrace_publisher::publish::{PublishConfig, PublishSummary, Publisher};
use hoptrace_publisher::schedule::LoadShape;
use serde::Serialize;

/// What to search.
#[derive(Debug, Clone)]
pub struct PublisherBenchOptions {
    /// The broker.
    pub to: Endpoint,
    /// Metrics per message (more than 1: JSON batches).
    pub metrics_per_message: u32,
    /// Payload format (default: json, or json-batch for several metrics per message).
    pub payload: Option<PayloadFormat>,
    /// Streams the load is spread over.
    pub streams: u32,
    /// First target rate, metrics per second.
    pub start: u64,
    /// Length of each step.
    pub step: Duration,
    /// Stop bisecting when the failing rate is within this fraction of the passing one.
    pub precision: f64,
    /// Most steps.
    pub max_steps: usize,
    /// Publish bare, without tracing: the baseline ([`PublishConfig::bare`]).
    pub bare: bool,
}

/// One step of the search.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// Target, metrics per second.
    pub target_metrics_per_s: f64,
    /// Achieved over the time the step took, metrics per second.
    pub achieved_metrics_per_s: f64,
    /// Delivered over the time until the client had confirmed every message, metrics per
    /// second: what the client's buffer absorbed at the end counts only once delivered,
    /// but the last messages' delivery latency and the client's flush are in it too (on
    /// Kafka with `acks=all`, tens of ms: a few % of a 2 s step). Shown beside the
    /// achieved rate; a large gap between them means the client buffered.
    pub delivered_metrics_per_s: f64,
    /// The lower of achieved / target and the schedule's keep-up.
    pub ratio: f64,
    /// Messages per second achieved.
    pub messages_per_s: f64,
    /// Mean payload bytes per message (without what the carrier adds).
    pub payload_bytes_per_message: f64,
    /// Publisher CPU, cores (1.0 = one core busy).
    pub cpu_cores: f64,
    /// Messages that waited for the client (back-pressure).
    pub backpressure_waits: u64,
    /// Schedule lag p99, ns.
    pub lag_p99_ns: u64,
    /// Messages not confirmed, failed or errored.
    pub unconfirmed: u64,
    /// Whether the step passed.
    pub pass: bool,
}

/// The result of a search, as `hoptrace bench publisher` prints it in JSON (the fields
/// in the order of the JSON's keys).
#[derive(Debug, Clone, Serialize)]
pub struct PublisherBench {
    /// The highest target rate that passed, metrics per second.
    pub highest_passing_metrics_per_s: Option<f64>,
    /// The lowest target rate that failed, metrics per second.
    pub lowest_failing_metrics_per_s: Option<f64>,
    /// Metrics per message.
    pub metrics_per_message: u32,
    /// Seconds per step.
    pub step_s: f64,
    /// Every step, in order.
    pub steps: Vec<Step>,
    /// Streams.
    pub streams: u32,
    /// The broker.
    pub to: String,
    /// Whether the messages were sent bare, without tracing (the baseline).
    pub bare: bool,
}

impl PublisherBench {
    /// The passing step of the highest rate.
    #[must_use]
    pub fn best(&self) -> Option<&Step> {
        let p = self.highest_passing_metrics_per_s?;
        self.steps
            .iter()
            .find(|s| s.pass && s.target_metrics_per_s == p)
    }
}

/// Runs the search: the rate doubles from `start` until a step fails, then bisects.
/// `on_step` sees each step as it ends.
///
/// # Errors
/// An unusable broker.
pub fn run(
    opts: &PublisherBenchOptions,
    mut on_step: impl FnMut(&Step),
) -> anyhow::Result<PublisherBench> {
    eprintln!(
        "searching the highest rate to {}{} with {} metric(s) per message, {} s per step",
        opts.to.display(),
        if opts.bare { ", bare (no tracing)" } else { "" },
        opts.metrics_per_message,
        opts.step.as_secs_f64()
    );
    let stop = AtomicBool::new(false);
    let mut steps: Vec<Step> = Vec::new();
    let (mut pass, mut fail): (Option<f64>, Option<f64>) = (None, None);
    let mut rate = opts.start as f64;
    while steps.len() < opts.max_steps {
        let step = one_step(opts, rate, &stop)?;
        on_step(&step);
        if step.pass {
            pass = Some(pass.map_or(rate, |p: f64| p.max(rate)));
        } else {
            fail = Some(fail.map_or(rate, |f: f64| f.min(rate)));
        }
        steps.push(step);
        rate = match next_rate(pass, fail, opts.precision) {
            Some(r) => r,
            None => break,
        };
    }
    Ok(PublisherBench {
        highest_passing_metrics_per_s: pass,
        lowest_failing_metrics_per_s: fail,
        metrics_per_message: opts.metrics_per_message,
        step_s: opts.step.as_secs_f64(),
        steps,
        streams: opts.streams,
        to: opts.to.display(),
        bare: opts.bare,
    })
}

/// The next rate to try after the highest pass and the lowest failure so far, or `None`
/// when they are within `precision` of each other.
fn next_rate(pass: Option<f64>, fail: Option<f64>, precision: f64) -> Option<f64> {
    match (pass, fail) {
        (Some(p), None) => Some(p * 2.0),
        (None, Some(f)) => Some(f / 2.0),
        (Some(p), Some(f)) if (f - p) / p > precision => Some(f64::midpoint(p, f)),
        _ => None,
    }
}

fn one_step(opts: &PublisherBenchOptions, rate: f64, stop: &AtomicBool) -> anyhow::Result<Step> {
    let mut shape = LoadShape::uniform(rate, opts.streams);
    shape.metrics_per_message = opts.metrics_per_message;
    shape.duration = Some(opts.step);
    let mut config = PublishConfig::new(opts.to.clone(), shape);
    config.payload = opts.payload;
    config.bare = opts.bare;
    let cpu0 = process_ticks(Pid::This).unwrap_or(0);
    let t0 = Instant::now();
    let s: PublishSummary = Publisher::new(config)
        .context("starting the publisher")?
        .run(stop)
        .context("publishing")?;
    let wall = t0.elapsed().as_secs_f64();
    let cpu = process_ticks(Pid::This).unwrap_or(0).saturating_sub(cpu0) as f64 / USER_HZ;
    // The schedule is open loop: a publisher that falls behind still sends every planned
    // message, later, so the achieved rate is over the time it actually took.
    let took = (s.elapsed_ns as f64 / 1e9).max(1e-9);
    let achieved = s.metrics_per_s();
    let delivered = s.delivered_metrics_per_s();
    let ratio = s.keep_up_ratio().min(achieved / rate);
    let unconfirmed = s.broker.unconfirmed + s.broker.failed + s.errors;
    Ok(Step {
        target_metrics_per_s: rate,
        achieved_metrics_per_s: achieved,
        delivered_metrics_per_s: delivered,
        ratio,
        messages_per_s: s.messages as f64 / took,
        payload_bytes_per_message: s.payload_bytes as f64 / (s.messages.max(1) as f64),
        cpu_cores: cpu / wall,
        backpressure_waits: s.backpressure_waits,
        lag_p99_ns: s.lag.at(0.99).map_or(0, |q| q.value_ns.unsigned_abs()),
        unconfirmed,
        pass: ratio >= 0.99 && unconfirmed == 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_doubles_halves_then_bisects() {
        assert_eq!(next_rate(Some(10.0), None, 0.05), Some(20.0));
        assert_eq!(next_rate(None, Some(10.0), 0.05), Some(5.0));
        assert_eq!(next_rate(Some(10.0), Some(20.0), 0.05), Some(15.0));
        assert_eq!(next_rate(Some(10.0), Some(10.4), 0.05), None);
    }
}
