//! Why a collector could not start or finish: the one error of [`crate::Collector`], kept
//! apart from the run's lifecycle so that the listener and the run both use it without
//! depending on each other.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::writer::WriteError;

/// Why a collector could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum CollectorError {
    /// The pipeline spec is invalid.
    #[error(transparent)]
    Spec(#[from] hoptrace_format::spec::SpecError),
    /// `listen` is not loopback and no token was given: pass `--token` (or set
    /// `HOPTRACE_TOKEN`), or listen on 127.0.0.1.
    #[error("listening on {0} (not loopback) requires a token")]
    TokenRequired(SocketAddr),
    /// `--otlp` with a pipeline none of whose hops a span stamps: give a hop a `span`
    /// match.
    #[error("{0}")]
    NoSpanHop(String),
    /// The TLS certificate or key cannot be used, or only one of them was given.
    #[error("TLS: {0}")]
    Tls(String),
    /// The listen address cannot be resolved or bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// The error.
        source: std::io::Error,
    },
    /// The run directory cannot be written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Writing Parquet failed.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// The join thread panicked (a bug).
    #[error("the join thread panicked")]
    Panicked,
    /// The run's write-ahead log cannot be written or read.
    #[error(transparent)]
    Wal(#[from] crate::wal::WalError),
    /// The run directory holds the log of a run of other hops: choose another run id.
    #[error(
        "{dir} holds the log of an unfinished run of other hops ({theirs}), not of this pipeline's ({ours}): start the collector with that run's pipeline spec to finish it, or choose another run id"
    )]
    OtherPipeline {
        /// The run directory.
        dir: PathBuf,
        /// The log's hops.
        theirs: String,
        /// This collector's hops.
        ours: String,
    },
}
