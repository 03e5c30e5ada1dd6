//! Durability: what lets a run survive the collector's end. The write-ahead log
//! ([`wal`]) and the checkpoints that let it be cut and a run be continued
//! (`checkpoint`).

pub(crate) mod checkpoint;
pub mod wal;
