//! `hoptrace bench publisher`: the highest rate the publisher sustains against a broker.
//!
//! Each step publishes a fixed schedule at a target rate and passes when the achieved
//! rate (metrics handed to the client over the time that took; an open-loop publisher that
//! falls behind still sends every message, later) is at least 99 % of the target and the
//! client confirmed every message (MQTT: written or acknowledged; Kafka: delivered) with
//! no error. The rate doubles until a step fails, then bisects
//! between the last pass and the first failure until they are within `--precision`.
//! The publisher's CPU use is this process's (client threads included) over each step.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hoptrace_collector::procfs::{Pid, USER_HZ, process_ticks};
use hoptrace_publisher::payload::PayloadFormat;
use hoptrace_publisher::publish::{PublishConfig, PublishSummary, Publisher};
use hoptrace_publisher::schedule::LoadShape;
use hoptrace_publisher::url::Endpoint;
use serde::Serialize;

use hoptrace_format::units;

/// Options of `hoptrace bench publisher`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Broker: `mqtt://host:port?qos=0` or `kafka://host:port/topic?acks=all`.
    #[arg(long)]
    pub to: String,
    /// Metrics per message (more than 1: JSON batches).
    #[arg(long, default_value_t = 1)]
    pub metrics_per_message: u32,
    /// Payload format (default: json, or json-batch for several metrics per message).
    #[arg(long, value_parser = PayloadFormat::parse)]
    pub payload: Option<PayloadFormat>,
    /// Streams the load is spread over.
    #[arg(long, default_value_t = 100)]
    pub streams: u32,
    /// First target rate, metrics per second.
    #[arg(long, default_value = "20k", value_parser = units::parse_count)]
    pub start: u64,
    /// Length of each step.
    #[arg(long, default_value = "5s", value_parser = units::parse_duration)]
    pub step: Duration,
    /// Stop bisecting when the failing rate is within this fraction of the passing one.
    #[arg(long, default_value_t = 0.05)]
    pub precision: f64,
    /// Most steps.
    #[arg(long, default_value_t = 20)]
    pub max_steps: usize,
}

/// One step of the search.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// Target, metrics per second.
    pub target_metrics_per_s: f64,
    /// Achieved over the time the step took, metrics per second.
    pub achieved_metrics_per_s: f64,
    /// Achieved / target.
    pub ratio: f64,
    /// Messages per second achieved.
    pub messages_per_s: f64,
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

/// Runs the search and prints each step and the result (and JSON).
///
/// # Errors
/// Invalid options, an unusable broker.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let endpoint = Endpoint::parse(&args.to).context("--to")?;
    eprintln!(
        "searching the highest rate to {} with {} metric(s) per message, {} s per step",
        endpoint.display(),
        args.metrics_per_message,
        args.step.as_secs_f64()
    );
    let stop = AtomicBool::new(false);
    let mut steps: Vec<Step> = Vec::new();
    let (mut pass, mut fail): (Option<f64>, Option<f64>) = (None, None);
    let mut rate = args.start as f64;
    let started = Instant::now();
    while steps.len() < args.max_steps {
        let step = one_step(args, &endpoint, rate, &stop)?;
        println!(
            "{:>4}  target {:>8} metrics/s  achieved {:>8} ({:.4})  {:>8} msg/s  cpu {:.2} cores  waits {}  lag p99 {}  unconfirmed {}  {}",
            steps.len() + 1,
            units::rate(step.target_metrics_per_s),
            units::rate(step.achieved_metrics_per_s),
            step.ratio,
            units::rate(step.messages_per_s),
            step.cpu_cores,
            step.backpressure_waits,
            units::duration_f64(step.lag_p99_ns as f64),
            step.unconfirmed,
            if step.pass { "pass" } else { "FAIL" }
        );
        if step.pass {
            pass = Some(pass.map_or(rate, |p: f64| p.max(rate)));
        } else {
            fail = Some(fail.map_or(rate, |f: f64| f.min(rate)));
        }
        steps.push(step);
        rate = match (pass, fail) {
            (Some(p), None) => p * 2.0,
            (None, Some(f)) => f / 2.0,
            (Some(p), Some(f)) if (f - p) / p > args.precision => f64::midpoint(p, f),
            _ => break,
        };
    }
    let best = pass.and_then(|p| steps.iter().find(|s| s.pass && s.target_metrics_per_s == p));
    match best {
        Some(b) => println!(
            "highest passing rate: {} metrics/s ({} msg/s) using {:.2} cores; first failure at {}; {} steps in {:.0} s",
            units::rate(b.target_metrics_per_s),
            units::rate(b.messages_per_s),
            b.cpu_cores,
            fail.map_or_else(|| "none".into(), units::rate),
            steps.len(),
            started.elapsed().as_secs_f64()
        ),
        None => println!("no step passed; lower --start"),
    }
    let report = serde_json::json!({
        "to": endpoint.display(),
        "metrics_per_message": args.metrics_per_message,
        "streams": args.streams,
        "step_s": args.step.as_secs_f64(),
        "highest_passing_metrics_per_s": pass,
        "lowest_failing_metrics_per_s": fail,
        "steps": steps,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

fn one_step(
    args: &Args,
    endpoint: &Endpoint,
    rate: f64,
    stop: &AtomicBool,
) -> anyhow::Result<Step> {
    let mut shape = LoadShape::uniform(rate, args.streams);
    shape.metrics_per_message = args.metrics_per_message;
    shape.duration = Some(args.step);
    let mut config = PublishConfig::new(endpoint.clone(), shape);
    config.payload = args.payload;
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
    let ratio = s.keep_up_ratio().min(achieved / rate);
    let unconfirmed = s.broker.unconfirmed + s.broker.failed + s.errors;
    Ok(Step {
        target_metrics_per_s: rate,
        achieved_metrics_per_s: achieved,
        ratio,
        messages_per_s: s.messages as f64 / took,
        cpu_cores: cpu / wall,
        backpressure_waits: s.backpressure_waits,
        lag_p99_ns: s.lag.at(0.99).map_or(0, |q| q.value_ns),
        unconfirmed,
        pass: ratio >= 0.99 && unconfirmed == 0,
    })
}
