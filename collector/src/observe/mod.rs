//! Observe: the run while it goes on. The Prometheus endpoint ([`metrics`]) and the live
//! view ([`live`]).

pub mod live;
pub mod metrics;
