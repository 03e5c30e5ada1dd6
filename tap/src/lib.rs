//! # hoptrace-tap
//!
//! Store taps: the `queryable` end of a pipeline nobody here wrote. A store tap queries a
//! live store over and over (InfluxDB 1.x, PostgreSQL, ClickHouse, VictoriaMetrics), finds
//! the rows of traced messages by the trace context the publisher put into the payload
//! (the JSON field `"hoptrace"`, `docs/trace-format.md`), and reports for each message, to
//! the collector, through the real probe exporter:
//!
//! - `queryable`: the moment the response of the first poll that returned the row arrived;
//! - `query_start`: the moment that poll was sent (so the stage `query_start → queryable`
//!   is the store's query time as the tap saw it);
//! - `store_in` (optional): the row's own time where the store assigned it (InfluxDB's
//!   point time, a PostgreSQL column default), reported by a second exporter that announces
//!   the store's host, so the report's clock uncertainty for stages ending there is honest.
//!
//! - the earliest instant the data can have become queryable (`bounds`: the latest send of
//!   an answered poll that covered the row and did not return it, or the row's own store
//!   time when sharper), as the hop the pipeline spec names as `queryable`'s `earliest`:
//!   the analysis then bounds every stage at the polled hop.
//!
//! The data became visible between that instant and this poll's response (the *poll
//! bracket*): the `queryable` stamp is late by at most that much. The tap measures the
//! bracket per key, its own polls and query times, and sends them as counters
//! (`docs/collector-protocol.md`) that the analysis states beside each stage.
//!
//! - [`store`]: store addresses, the [`store::Store`] trait and one module per store.
//! - [`poll`]: the poll loop, its counters and summary; `pollers` runs its connections,
//!   `bounds` finds each row's earliest instant; `listen` (PostgreSQL notifications) and
//!   `subscribe` (InfluxDB subscriptions) take what a store says it took.
//!
//! This crate depends on the probe (the wire format and the exporter) and on the stores'
//! client libraries only. It must never depend on the collector or on the analysis: a tap
//! runs beside the store, possibly far from both, and speaks to the collector only over
//! the documented protocol.

#![deny(missing_docs, unreachable_pub)]

mod bounds;
mod listen;
pub mod poll;
mod pollers;
pub mod store;
mod subscribe;

pub use poll::{
    ROWS_PER_KEY_HINT, StoreTap, StoreTapConfig, StoreTapError, StoreTapLive, StoreTapSummary,
};
pub use store::{StoreError, StoreKind, StoreUrl};
