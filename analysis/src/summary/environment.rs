//! Hosts, their clocks and the topology of a summary, and the clock uncertainty of a stage.

use std::collections::{BTreeMap, BTreeSet};

use crate::session::RunSet;

use super::model::{Environment, HostSummary};

pub(super) fn environment(runs: &RunSet) -> Environment {
    let mut hosts: BTreeMap<String, HostSummary> = BTreeMap::new();
    let entry = |hosts: &mut BTreeMap<String, HostSummary>, h: &str| {
        hosts
            .entry(h.to_owned())
            .or_insert_with(|| HostSummary {
                host: h.to_owned(),
                addresses: Vec::new(),
                hops: Vec::new(),
                processes: Vec::new(),
                clock_sources: Vec::new(),
                clock_samples: 0,
                synced: true,
                max_error_bound_ns: None,
                max_abs_offset_ns: None,
                leap_pending: None,
            })
            .clone()
    };
    let mut idle_probes = Vec::new();
    for run in &runs.runs {
        // The hops the probe stamped; runs of older collectors only say which it
        // announced.
        let stamped_by = |p: &hoptrace_format::run::ProbeInfo| -> Vec<String> {
            match &p.stamps_by_hop {
                Some(by_hop) => by_hop
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(h, _)| h.clone())
                    .collect(),
                None => p.hops.clone(),
            }
        };
        for p in &run.summary.probes {
            let stamped = stamped_by(p);
            // A probe is one exporter, which may have connected more than once (a
            // reconnection): a connection that stamped nothing is idle only when no other
            // connection of its exporter stamped anything.
            let its_exporter_stamped = run
                .summary
                .probes
                .iter()
                .any(|q| q.instance_id == p.instance_id && !stamped_by(q).is_empty());
            if stamped.is_empty() && its_exporter_stamped {
                continue;
            }
            if stamped.is_empty() {
                idle_probes.push(format!(
                    "{}/{} (announced {})",
                    p.host,
                    p.process,
                    p.hops.join(", ")
                ));
                continue;
            }
            let mut h = entry(&mut hosts, &p.host);
            for hop in stamped {
                if !h.hops.contains(&hop) {
                    h.hops.push(hop);
                }
            }
            if !h.processes.contains(&p.process) {
                h.processes.push(p.process.clone());
            }
            let ip = p
                .peer
                .parse::<std::net::SocketAddr>()
                .map_or_else(|_| p.peer.clone(), |a| a.ip().to_string());
            if !h.addresses.contains(&ip) {
                h.addresses.push(ip);
            }
            hosts.insert(p.host.clone(), h);
        }
        for c in &run.summary.clock {
            // Clocks of hosts whose probes stamped nothing do not matter to any stage.
            if !hosts.contains_key(&c.host) {
                continue;
            }
            let mut h = entry(&mut hosts, &c.host);
            h.clock_samples += 1;
            h.synced &= c.synced;
            if !h.clock_sources.contains(&c.source) {
                h.clock_sources.push(c.source.clone());
            }
            // A status of an unknown source carries no bound: it leaves the bound unknown.
            if c.source != "unknown" {
                h.max_error_bound_ns =
                    Some(h.max_error_bound_ns.unwrap_or(0).max(c.error_bound_ns));
            }
            h.max_abs_offset_ns = Some(h.max_abs_offset_ns.unwrap_or(0).max(c.offset_ns.abs()));
            if matches!(c.leap.as_str(), "insert" | "delete") {
                h.leap_pending = Some(c.leap.clone());
            }
            hosts.insert(c.host.clone(), h);
        }
    }
    let hosts: Vec<HostSummary> = hosts.into_values().collect();
    let topology = if hosts.is_empty() {
        "no probe reported".to_owned()
    } else {
        format!(
            "{} host(s): {}",
            hosts.len(),
            hosts
                .iter()
                .map(|h| format!("{} ({})", h.host, h.hops.join(", ")))
                .collect::<Vec<_>>()
                .join("; ")
        )
    };
    let clocking = hosts
        .iter()
        .map(|h| {
            let bound = h.max_error_bound_ns.map_or_else(
                || "no clock status".into(),
                |b| format!("error bound ≤ {}", hoptrace_format::units::duration_ns(b)),
            );
            format!(
                "{}: {} ({}, {})",
                h.host,
                if h.clock_sources.is_empty() {
                    "unknown".into()
                } else {
                    h.clock_sources.join("+")
                },
                if h.synced && h.clock_samples > 0 {
                    "synchronised"
                } else {
                    "NOT synchronised"
                },
                bound
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    Environment {
        collector: runs.runs[0].summary.collector_host.clone(),
        hosts,
        idle_probes,
        topology,
        clocking,
    }
}

/// The clock uncertainty of a stage from `from` to `to`: 0 when every probe of both hops
/// ran on one host (one clock), else the largest sum of two different hosts' error bounds.
#[must_use]
pub fn clock_uncertainty(hosts: &[HostSummary], from: &str, to: &str) -> (Option<u64>, String) {
    let on = |hop: &str| -> BTreeSet<&str> {
        hosts
            .iter()
            .filter(|h| h.hops.iter().any(|x| x == hop))
            .map(|h| h.host.as_str())
            .collect()
    };
    let (a, b) = (on(from), on(to));
    if a.is_empty() || b.is_empty() {
        return (
            None,
            format!(
                "no probe reported hop {}",
                if a.is_empty() { from } else { to }
            ),
        );
    }
    if a.len() == 1 && a == b {
        let host = a.first().copied().unwrap_or_default();
        return (Some(0), format!("one clock (both hops on {host})"));
    }
    let bound = |name: &str| {
        hosts
            .iter()
            .find(|h| h.host == name)
            .and_then(|h| h.max_error_bound_ns)
    };
    let mut worst: Option<u64> = Some(0);
    let mut pair = String::new();
    for x in &a {
        for y in &b {
            if x == y {
                continue;
            }
            match (bound(x), bound(y)) {
                (Some(bx), Some(by)) => {
                    if worst.is_some_and(|w| bx + by >= w) {
                        worst = Some(bx + by);
                        pair = format!("{x} + {y}");
                    }
                }
                _ => {
                    let missing = if bound(x).is_none() { x } else { y };
                    return (None, format!("no clock status from {missing}"));
                }
            }
        }
    }
    (worst, format!("error bounds of {pair} summed"))
}
