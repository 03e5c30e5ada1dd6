//! Ingest: the probes' connections. The listener and each connection's frames
//! ([`server`]), TLS on them (`tls`), and the control frames a connection carries
//! besides records (`control`) and the files its table rows are kept in (`rows`); the OTLP receiver, whose senders of spans join as
//! connections ([`otlp`]).

pub(crate) mod control;
pub mod otlp;
pub(crate) mod rows;
pub mod server;
pub(crate) mod tls;
