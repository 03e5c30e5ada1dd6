//! Sink: what the run writes. The traces' Parquet part files ([`writer`]) and the
//! smaller tables beside them ([`tables`]).

pub mod tables;
pub mod writer;
