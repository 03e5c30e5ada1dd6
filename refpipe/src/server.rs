//! The store as a TCP server, with probes where a real store would have them:
//!
//! - `store_in` when a write has been read off the socket;
//! - `query_start` and `queryable` around the query that first finds the written rows:
//!   after every insert the server runs a visibility query (the batch's series over the
//!   batch's time range) through the same query path clients use, and the data counts as
//!   queryable when that query returns every row of the write.
//!
//! Client queries (Query frames) are timed as well: their execution times are kept in an
//! HDR histogram in [`ServerStats`].

use std::io::{BufReader, BufWriter, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use hoptrace_probe::{ExportSummary, Exporter, Probe, TraceContext};

use crate::store::{Store, StoreConfig};
use crate::wire::{self, Frame, WireError};
use crate::{HostClock, Probes, RefpipeError};

/// Most client connections served at once; more are refused (closed with an Error frame).
pub const MAX_CONNECTIONS: usize = 64;

/// How the store server runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreServerConfig {
    /// Address to listen on.
    pub listen: String,
    /// What the store keeps.
    pub store: StoreConfig,
    /// The collector, and the ids of hops `store_in`, `query_start` and `queryable`.
    pub probes: Option<Probes>,
}

impl StoreServerConfig {
    /// A server on `listen` with the default store and no probes.
    #[must_use]
    pub fn new(listen: impl Into<String>) -> Self {
        Self {
            listen: listen.into(),
            store: StoreConfig::default(),
            probes: None,
        }
    }
}

/// Counts of a running server.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// Writes stored.
    pub writes: AtomicU64,
    /// Rows stored.
    pub rows: AtomicU64,
    /// Trace contexts that came with writes.
    pub contexts: AtomicU64,
    /// Writes whose visibility query did not find every row (their messages get no
    /// `queryable` stamp and end up incomplete).
    pub invisible_writes: AtomicU64,
    /// Client queries answered.
    pub queries: AtomicU64,
    /// Frames that did not decode; each closed its connection.
    pub bad_frames: AtomicU64,
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections refused over [`MAX_CONNECTIONS`].
    pub refused_connections: AtomicU64,
    /// Execution times of client queries, ns.
    pub query_ns: Mutex<Option<hdrhistogram::Histogram<u64>>>,
}

/// What a server did, at its end.
#[derive(Debug, Clone)]
pub struct StoreServerSummary {
    /// Writes stored.
    pub writes: u64,
    /// Rows stored.
    pub rows: u64,
    /// Trace contexts received with writes.
    pub contexts: u64,
    /// Writes not found by their visibility query.
    pub invisible_writes: u64,
    /// Client queries answered.
    pub queries: u64,
    /// Frames that did not decode.
    pub bad_frames: u64,
    /// The store's own counts.
    pub store: crate::store::StoreStats,
    /// The exporter's end, when probes were on.
    pub exporter: Option<ExportSummary>,
}

struct StoreProbes {
    store_in: Probe<HostClock>,
    query_start: Probe<HostClock>,
    queryable: Probe<HostClock>,
}

/// Open client connections: a handle to close each on stop, and its thread.
type Connections = Arc<Mutex<Vec<(TcpStream, JoinHandle<()>)>>>;

/// A running store server.
#[derive(Debug)]
pub struct StoreServer {
    addr: SocketAddr,
    store: Arc<Store>,
    stats: Arc<ServerStats>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    conns: Connections,
    exporter: Option<Exporter>,
}

impl StoreServer {
    /// Binds, connects the probes' exporter, and starts serving.
    ///
    /// # Errors
    /// [`RefpipeError::Bind`] when the address cannot be bound, [`RefpipeError::Probe`]
    /// when the hops are not declared.
    pub fn start(config: StoreServerConfig) -> Result<Self, RefpipeError> {
        let listener = TcpListener::bind(&config.listen).map_err(|source| RefpipeError::Bind {
            addr: config.listen.clone(),
            source,
        })?;
        let addr = listener.local_addr().map_err(|source| RefpipeError::Bind {
            addr: config.listen.clone(),
            source,
        })?;
        let (exporter, probes) = match &config.probes {
            None => (None, None),
            Some(link) => {
                let (exporter, probes) =
                    link.connect("refpipe-store", &["store_in", "query_start", "queryable"])?;
                let [store_in, query_start, queryable]: [Probe<HostClock>; 3] =
                    probes.try_into().expect("three hops asked for");
                let probes = StoreProbes {
                    store_in,
                    query_start,
                    queryable,
                };
                (Some(exporter), Some(Arc::new(probes)))
            }
        };
        let store = Arc::new(Store::new(config.store));
        let stats = Arc::new(ServerStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Connections = Arc::default();
        let accept = {
            let (store, stats, stop, conns) =
                (store.clone(), stats.clone(), stop.clone(), conns.clone());
            std::thread::Builder::new()
                .name("store-accept".into())
                .spawn(move || {
                    accept_loop(&listener, &store, &stats, &stop, &conns, probes.as_ref())
                })
                .map_err(|source| RefpipeError::Bind {
                    addr: addr.to_string(),
                    source,
                })?
        };
        tracing::info!(%addr, "store listening");
        Ok(Self {
            addr,
            store,
            stats,
            stop,
            accept: Some(accept),
            conns,
            exporter,
        })
    }

    /// The address it listens on.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The store behind it, for queries in the same process.
    #[must_use]
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Live counts.
    #[must_use]
    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }

    /// Stops accepting, closes every connection, flushes the probes' exporter.
    #[must_use]
    pub fn stop(mut self) -> StoreServerSummary {
        self.stop.store(true, Relaxed);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
        let conns: Vec<_> = self
            .conns
            .lock()
            .expect("connections poisoned")
            .drain(..)
            .collect();
        for (s, _) in &conns {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        for (_, h) in conns {
            let _ = h.join();
        }
        let exporter = self.exporter.take().map(Exporter::shutdown);
        let s = &self.stats;
        StoreServerSummary {
            writes: s.writes.load(Relaxed),
            rows: s.rows.load(Relaxed),
            contexts: s.contexts.load(Relaxed),
            invisible_writes: s.invisible_writes.load(Relaxed),
            queries: s.queries.load(Relaxed),
            bad_frames: s.bad_frames.load(Relaxed),
            store: self.store.stats(),
            exporter,
        }
    }
}

fn accept_loop(
    listener: &TcpListener,
    store: &Arc<Store>,
    stats: &Arc<ServerStats>,
    stop: &Arc<AtomicBool>,
    conns: &Connections,
    probes: Option<&Arc<StoreProbes>>,
) {
    for incoming in listener.incoming() {
        if stop.load(Relaxed) {
            break;
        }
        let Ok(stream) = incoming else { continue };
        let _ = stream.set_nodelay(true);
        let mut list = conns.lock().expect("connections poisoned");
        list.retain(|(_, h)| !h.is_finished());
        if list.len() >= MAX_CONNECTIONS {
            stats.refused_connections.fetch_add(1, Relaxed);
            let mut buf = Vec::new();
            let msg = format!("the store serves at most {MAX_CONNECTIONS} connections");
            tracing::warn!("refused a connection: {msg}");
            let _ = wire::write_frame(
                &mut &stream,
                &Frame::Error {
                    id: 0,
                    message: msg,
                },
                &mut buf,
            );
            continue;
        }
        let Ok(handle) = stream.try_clone() else {
            continue;
        };
        stats.connections.fetch_add(1, Relaxed);
        let (store, stats, probes) = (store.clone(), stats.clone(), probes.cloned());
        let spawned = std::thread::Builder::new()
            .name("store-conn".into())
            .spawn(move || serve(stream, &store, &stats, probes.as_deref()));
        if let Ok(h) = spawned {
            list.push((handle, h));
        }
    }
}

/// Serves one connection until it closes or sends a bad frame.
fn serve(stream: TcpStream, store: &Store, stats: &ServerStats, probes: Option<&StoreProbes>) {
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".into(), |a| a.to_string());
    let Ok(out) = stream.try_clone() else { return };
    let mut reader = BufReader::with_capacity(1 << 20, stream);
    let mut writer = BufWriter::new(out);
    let (mut body, mut enc) = (Vec::new(), Vec::new());
    let mut contexts: Vec<TraceContext> = Vec::new();
    loop {
        let read = wire::read_body(&mut reader, &mut body);
        // The write has been read off the socket: that is the store's ingress.
        let arrived_ns = probes.map(|p| p.store_in.now_ns());
        let frame = read.and_then(|()| Frame::decode(&body));
        let reply = match frame {
            Ok(Frame::Write {
                id,
                contexts: ctxs,
                rows,
            }) => {
                contexts.clear();
                contexts.extend(ctxs);
                if let (Some(p), Some(t)) = (probes, arrived_ns) {
                    for c in &mut contexts {
                        p.store_in.record_at(c, t);
                    }
                }
                let inserted = store.insert(&rows);
                let series = distinct_series(&rows, &inserted.first_rows);
                let started_ns = probes.map(|p| p.query_start.now_ns());
                let found = store.query_series(&series, inserted.min_ts_ms, inserted.max_ts_ms);
                let done_ns = probes.map(|p| p.queryable.now_ns());
                let visible = found.rows >= inserted.rows as u64;
                if visible {
                    if let (Some(p), Some(t0), Some(t1)) = (probes, started_ns, done_ns) {
                        for c in &mut contexts {
                            p.query_start.record_at(c, t0);
                            p.queryable.record_at(c, t1);
                        }
                    }
                } else {
                    stats.invisible_writes.fetch_add(1, Relaxed);
                    tracing::error!(
                        write = id,
                        rows = inserted.rows,
                        found = found.rows,
                        "a write is not visible to its query"
                    );
                }
                stats.writes.fetch_add(1, Relaxed);
                stats.rows.fetch_add(inserted.rows as u64, Relaxed);
                stats.contexts.fetch_add(contexts.len() as u64, Relaxed);
                Frame::WriteAck {
                    id,
                    rows: inserted.rows as u32,
                    visible,
                }
            }
            Ok(Frame::Query { id, query }) => {
                let result = store.query(&query);
                stats.queries.fetch_add(1, Relaxed);
                record_query_time(stats, result.exec_ns);
                Frame::QueryResult { id, result }
            }
            Ok(other) => bad_frame(stats, &peer, &format!("a client does not send {other:?}")),
            Err(WireError::Io(e)) => {
                if e.kind() != std::io::ErrorKind::UnexpectedEof {
                    tracing::debug!(%peer, "store connection ended: {e}");
                }
                break;
            }
            Err(e) => bad_frame(stats, &peer, &e.to_string()),
        };
        let last = matches!(reply, Frame::Error { .. });
        if wire::write_frame(&mut writer, &reply, &mut enc).is_err()
            || writer.flush().is_err()
            || last
        {
            break;
        }
    }
    // The server keeps a handle to every connection (to close it on stop), so dropping
    // this one's would not close the socket: shut it down for the peer to see the end.
    let _ = writer.get_ref().shutdown(std::net::Shutdown::Both);
}

fn bad_frame(stats: &ServerStats, peer: &str, what: &str) -> Frame {
    stats.bad_frames.fetch_add(1, Relaxed);
    tracing::warn!(%peer, "closing a store connection: {what}");
    Frame::Error {
        id: 0,
        message: what.to_owned(),
    }
}

fn record_query_time(stats: &ServerStats, ns: u64) {
    let mut h = stats.query_ns.lock().expect("query histogram poisoned");
    let h = h.get_or_insert_with(|| {
        hdrhistogram::Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
    });
    let _ = h.record(ns.clamp(1, 60_000_000_000));
}

fn distinct_series<'a>(rows: &'a arrow::array::RecordBatch, first_rows: &[u32]) -> Vec<&'a str> {
    use arrow::array::AsArray as _;
    let names = rows.column(0).as_string::<i32>();
    first_rows
        .iter()
        .map(|&r| names.value(r as usize))
        .collect()
}
