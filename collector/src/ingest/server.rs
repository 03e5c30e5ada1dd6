//! The collector's network side: accepts probe connections, checks Hello (protocol
//! version, token, hops against the pipeline spec), and forwards decoded frames to the
//! join thread through a bounded channel. When the join thread falls behind the channel
//! fills, readers stop reading, and TCP flow control pushes back on the probes, whose
//! queues then count what they cannot hold: memory stays bounded and nothing is lost
//! without being counted.

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hoptrace_protocol::{
    self as protocol, Frame, Hello, MAX_FRAME_LEN, MAX_HELLO_LEN, MAX_STRING_LEN, PROTOCOL_VERSION,
    ProtocolError, reject_code,
};

use crate::error::CollectorError;
use hoptrace_format::spec::ResolvedSpec;

/// What a connection hands to the join thread.
#[derive(Debug)]
pub enum Event {
    /// A probe connected (its Hello, whose version is the one the connection runs at)
    /// from an address.
    Connected(u64, SocketAddr, Hello),
    /// A non-Hello frame from the connection with this id.
    Frame(u64, Frame),
    /// A non-Hello frame with its bytes as received (type byte and body), from a
    /// collector that keeps a log: the join thread logs the bytes as they are instead of
    /// encoding the decoded frame again.
    FrameWithBytes(u64, Frame, Vec<u8>),
    /// The connection ended; `clean` when Goodbye came first.
    Closed(u64, bool),
}

/// Why connections were closed, counted per reason.
#[derive(Debug, Default)]
pub struct ConnectionCounters {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Refused: too many open connections.
    pub refused_limit: AtomicU64,
    /// Closed: no Hello within the timeout (slow or silent peer).
    pub hello_timeout: AtomicU64,
    /// Closed: bad magic or protocol version.
    pub bad_version: AtomicU64,
    /// Closed: wrong or missing token.
    pub bad_token: AtomicU64,
    /// Closed: a hop the spec does not declare (or with another id).
    pub unknown_hop: AtomicU64,
    /// Closed: a malformed frame after Hello.
    pub malformed: AtomicU64,
    /// Closed: oversized frame.
    pub too_large: AtomicU64,
    /// Closed: the TLS handshake failed (a plain-text peer, an untrusted certificate).
    pub tls_failed: AtomicU64,
    /// Records of a hop their connection did not announce in Hello: dropped, counted
    /// (the connection stays open).
    pub unannounced_hop_records: AtomicU64,
}

/// Network settings of the collector.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Token probes must present; required on non-loopback listeners.
    pub token: Option<String>,
    /// The run id sent in Welcome.
    pub run_id: String,
    /// Most connections open at once.
    pub max_connections: usize,
    /// Time a new connection has to complete the TLS handshake (when TLS) and send Hello.
    pub hello_timeout: Duration,
    /// TLS: every connection must complete a handshake with this setting first.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Offer protocol version 2 and acknowledge what the join thread made durable (the
    /// run's log); `None` speaks version 1 only.
    pub durable: Option<Arc<DurableSeqs>>,
    /// The last connection id given: the next connection takes one more (a restarted
    /// collector continues after the ones in its log). Shared with the OTLP receiver,
    /// whose senders join as connections too.
    pub conn_ids: Arc<AtomicU64>,
}

/// Per exporter instance, the highest records frame number the collector holds durably;
/// the join thread raises it after each sync of the run's log, connection readers tell
/// their probe (Welcome, Ack). A reader that waits for its frames to be durable (the OTLP
/// receiver, which answers a request only then) asks for a sync sooner than the log's
/// interval ([`Self::want_sync`]).
#[derive(Debug, Default)]
pub struct DurableSeqs {
    state: std::sync::Mutex<Durable>,
    /// Notified when a mark rises, a close becomes durable or a reader ends.
    changed: std::sync::Condvar,
    sync_wanted: AtomicBool,
}

#[derive(Debug, Default)]
struct Durable {
    marks: std::collections::HashMap<u64, u64>,
    /// Per instance, the highest frame number its connections' readers forwarded to the
    /// join thread (durable once its mark reaches it).
    forwarded: std::collections::HashMap<u64, u64>,
    /// Per instance, its connections whose readers still read.
    reading: std::collections::HashMap<u64, usize>,
    /// Connections whose clean close (logged after every frame they sent) is durable, for
    /// the readers that wait on it after Goodbye.
    closed: std::collections::HashSet<u64>,
}

/// Most durable closes kept for readers that no longer wait on them (they waited past
/// [`GOODBYE_DURABLE_WAIT`]): beyond it the set is emptied.
const MAX_CLOSED_MARKS: usize = 1 << 16;

/// Longest a waiter sleeps before it asks for a sync again (the join thread may have
/// synced before it took the frames waited for).
const SYNC_ASK_TICK: Duration = Duration::from_millis(10);

impl DurableSeqs {
    fn lock(&self) -> std::sync::MutexGuard<'_, Durable> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The durable mark of `instance` (0: nothing).
    #[must_use]
    pub fn get(&self, instance: u64) -> u64 {
        self.lock().marks.get(&instance).copied().unwrap_or(0)
    }

    /// Raises the marks of these instances.
    pub fn raise(&self, marks: impl IntoIterator<Item = (u64, u64)>) {
        let mut s = self.lock();
        for (instance, seq) in marks {
            let e = s.marks.entry(instance).or_insert(0);
            *e = (*e).max(seq);
        }
        drop(s);
        self.changed.notify_all();
    }

    /// Asks the join thread to sync the log soon, not at its next interval: someone waits.
    pub fn want_sync(&self) {
        self.sync_wanted.store(true, Relaxed);
    }

    /// Whether a sync was asked for since the last call (and clears the request).
    #[must_use]
    pub fn take_sync_wanted(&self) -> bool {
        self.sync_wanted.swap(false, Relaxed)
    }

    /// The log holds, synced, the clean close of these connections (so every frame each
    /// sent before its Goodbye).
    pub fn mark_closed(&self, ids: impl IntoIterator<Item = u64>) {
        let mut s = self.lock();
        if s.closed.len() >= MAX_CLOSED_MARKS {
            s.closed.clear();
        }
        s.closed.extend(ids);
        drop(s);
        self.changed.notify_all();
    }

    /// Whether connection `id`'s clean close is durable (forgotten once told).
    #[must_use]
    pub fn take_closed(&self, id: u64) -> bool {
        self.lock().closed.remove(&id)
    }

    /// Asks for syncs and waits, until `done` holds or `until` passes; whether it holds.
    fn wait(&self, until: Instant, mut done: impl FnMut(&mut Durable) -> bool) -> bool {
        let mut s = self.lock();
        loop {
            if done(&mut s) {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.want_sync();
            s = self
                .changed
                .wait_timeout(s, left.min(SYNC_ASK_TICK))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// The frame number a new connection of `instance` resumes after (its Welcome's
    /// `resume_seq`). When the instance's earlier connection is still being read (the
    /// probe found it broken and connected again while frames it had sent were still on
    /// their way), waits up to `until` for that reader to end and for what it forwarded to
    /// be durable: the probe counts what it evicted above `resume_seq` as lost, and those
    /// frames are not.
    pub(crate) fn resume_seq(&self, instance: u64, until: Instant) -> u64 {
        self.wait(until, |s| {
            let mark = s.marks.get(&instance).copied().unwrap_or(0);
            s.reading.get(&instance).copied().unwrap_or(0) == 0
                && mark >= s.forwarded.get(&instance).copied().unwrap_or(0)
        });
        self.get(instance)
    }

    /// A reader of `instance` starts; it ends when the guard drops.
    pub(crate) fn reading(self: &Arc<Self>, instance: u64) -> Reading {
        *self.lock().reading.entry(instance).or_insert(0) += 1;
        Reading {
            seqs: Arc::clone(self),
            instance,
        }
    }

    /// A reader of `instance` forwarded frame `seq` to the join thread.
    pub(crate) fn forwarded(&self, instance: u64, seq: u64) {
        let mut s = self.lock();
        let e = s.forwarded.entry(instance).or_insert(0);
        *e = (*e).max(seq);
    }

    /// Waits up to `until` (asking for syncs) for each `(instance, seq)` of `marks` to be
    /// durable; whether they all are.
    pub(crate) fn wait_marks(&self, marks: &[(u64, u64)], until: Instant) -> bool {
        self.wait(until, |s| {
            marks
                .iter()
                .all(|(i, seq)| s.marks.get(i).copied().unwrap_or(0) >= *seq)
        })
    }

    /// After connection `id`'s Goodbye: waits up to `until` for its close to be durable
    /// and `instance`'s mark to reach `received`; whether the close became durable.
    pub(crate) fn wait_goodbye(
        &self,
        id: u64,
        instance: u64,
        received: u64,
        until: Instant,
    ) -> bool {
        let mut durable_close = false;
        self.wait(until, |s| {
            durable_close = durable_close || s.closed.remove(&id);
            durable_close && s.marks.get(&instance).copied().unwrap_or(0) >= received
        });
        durable_close
    }
}

/// A connection reader of an exporter instance at work ([`DurableSeqs::reading`]).
#[derive(Debug)]
pub(crate) struct Reading {
    seqs: Arc<DurableSeqs>,
    instance: u64,
}

impl Drop for Reading {
    fn drop(&mut self) {
        let mut s = self.seqs.lock();
        if let Some(n) = s.reading.get_mut(&self.instance) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.reading.remove(&self.instance);
            }
        }
        drop(s);
        self.seqs.changed.notify_all();
    }
}

/// Longest a new connection's Welcome waits for its instance's earlier connection to be
/// read to its end and made durable ([`DurableSeqs::resume_seq`]); past it, the Welcome
/// says what is durable then. Well below the 2 s every probe gives a connection attempt
/// (connect, Hello and Welcome): an earlier connection the collector still holds open
/// (its peer gone without a close) must not keep the probe from connecting again.
const RESUME_WAIT: Duration = Duration::from_millis(500);

/// How long a reader waits for bytes before it looks whether there is something to
/// acknowledge.
const READ_TICK: Duration = Duration::from_millis(50);
/// How long a reader waits, after Goodbye, for the join thread to make the connection's
/// last frames durable before it acknowledges and closes.
const GOODBYE_DURABLE_WAIT: Duration = Duration::from_secs(3);

/// Reads frames from a connection through a buffer; a read that times out returns no
/// frame instead of losing the bytes of a partial one.
struct FrameReader {
    buf: Vec<u8>,
    start: usize,
}

enum Read1 {
    /// A frame, and where its type byte and body lie in [`FrameReader::buf`] (valid
    /// until the next read).
    Frame(Frame, std::ops::Range<usize>),
    Timeout,
    Closed,
}

impl FrameReader {
    fn next(&mut self, conn: &mut Conn) -> Result<Read1, ProtocolError> {
        loop {
            if let Some((ty, body, len)) =
                protocol::split_frame(&self.buf[self.start..], MAX_FRAME_LEN)?
            {
                let at = self.start;
                let frame = Frame::decode(ty, &self.buf[at + body.start..at + body.end])?;
                self.start += len;
                return Ok(Read1::Frame(frame, at + body.start - 1..at + body.end));
            }
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            let have = self.buf.len();
            let want = (have + READ_BUFFER).max(self.buf.capacity());
            self.buf.resize(want, 0);
            match conn.read(&mut self.buf[have..]) {
                Ok(0) => {
                    self.buf.truncate(have);
                    return Ok(Read1::Closed);
                }
                Ok(n) => self.buf.truncate(have + n),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    self.buf.truncate(have);
                    return Ok(Read1::Timeout);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => self.buf.truncate(have),
                Err(e) => {
                    self.buf.truncate(have);
                    return Err(ProtocolError::Io(e.kind()));
                }
            }
        }
    }
}

/// Binds the probes' listener. TLS needs both a certificate and its key (PEM); a
/// non-loopback address needs a token. Returns the listener, its address and the TLS
/// settings.
///
/// # Errors
/// Only one of certificate and key, unusable TLS files, a bind error, or a non-loopback
/// address without a token.
pub(crate) fn bind(
    listen: &str,
    token: Option<&str>,
    tls_cert: Option<&Path>,
    tls_key: Option<&Path>,
) -> Result<(TcpListener, SocketAddr, Option<Arc<rustls::ServerConfig>>), CollectorError> {
    let tls = match (tls_cert, tls_key) {
        (Some(cert), Some(key)) => {
            Some(crate::tls::server_config(cert, key).map_err(CollectorError::Tls)?)
        }
        (None, None) => None,
        (Some(_), None) => {
            return Err(CollectorError::Tls(
                "a certificate without its key: give both --tls-cert and --tls-key".into(),
            ));
        }
        (None, Some(_)) => {
            return Err(CollectorError::Tls(
                "a key without its certificate: give both --tls-cert and --tls-key".into(),
            ));
        }
    };
    let listen_err = |source| CollectorError::Listen {
        addr: listen.to_owned(),
        source,
    };
    let listener = TcpListener::bind(listen).map_err(listen_err)?;
    let addr = listener.local_addr().map_err(listen_err)?;
    if !addr.ip().is_loopback() && token.is_none_or(str::is_empty) {
        return Err(CollectorError::TokenRequired(addr));
    }
    Ok((listener, addr, tls))
}

/// A probe listener's two threads: `<name>-accept` accepts connections and forwards their
/// events into a bounded channel, and a worker (`<name>-<worker>`) consumes them. Stopping
/// closes the listener first, then tells the worker to drain and waits for its result.
#[derive(Debug)]
pub(crate) struct Service<T> {
    stop_accepting: Arc<AtomicBool>,
    draining: Arc<AtomicBool>,
    accept: JoinHandle<()>,
    /// Other sources of events (the OTLP receiver), stopped with the accept thread.
    more: Vec<JoinHandle<()>>,
    worker: JoinHandle<T>,
}

/// Another source of a [`Service`]'s events, run on a thread of its own until the flag
/// it gets is set; it must have closed every connection it opened when it returns.
pub(crate) type Source = Box<dyn FnOnce(&SyncSender<Event>, &AtomicBool) + Send>;

impl<T: Send + 'static> Service<T> {
    /// Starts both threads, and one per other source of events; `work` gets the
    /// channel's receiving end (`channel` events deep) and the flag [`Self::stop`] sets
    /// when the worker should drain and return.
    ///
    /// # Errors
    /// When a thread cannot be spawned (the threads started are stopped again).
    pub(crate) fn spawn(
        (name, worker): (&str, &str),
        (listener, cfg): (TcpListener, ServerConfig),
        spec: &Arc<ResolvedSpec>,
        counters: &Arc<ConnectionCounters>,
        channel: usize,
        sources: Vec<(&str, Source)>,
        work: impl FnOnce(&Receiver<Event>, &AtomicBool) -> T + Send + 'static,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel(channel);
        let stop_accepting = Arc::new(AtomicBool::new(false));
        let draining = Arc::new(AtomicBool::new(false));
        let mut more = Vec::new();
        for (label, source) in sources {
            let (tx, stop) = (tx.clone(), Arc::clone(&stop_accepting));
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-{label}"))
                .spawn(move || source(&tx, &stop));
            match spawned {
                Ok(t) => more.push(t),
                Err(e) => {
                    stop_accepting.store(true, Relaxed);
                    for t in more {
                        let _ = t.join();
                    }
                    return Err(e);
                }
            }
        }
        let accept = {
            let cfg = Arc::new(cfg);
            let (spec, stop, counters) = (
                Arc::clone(spec),
                Arc::clone(&stop_accepting),
                Arc::clone(counters),
            );
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-accept"))
                .spawn(move || accept_loop(&listener, &cfg, &spec, &tx, &stop, &counters));
            match spawned {
                Ok(t) => t,
                Err(e) => {
                    stop_accepting.store(true, Relaxed);
                    for t in more {
                        let _ = t.join();
                    }
                    return Err(e);
                }
            }
        };
        let spawned = {
            let draining = Arc::clone(&draining);
            std::thread::Builder::new()
                .name(format!("{name}-{worker}"))
                .spawn(move || work(&rx, &draining))
        };
        match spawned {
            Ok(worker) => Ok(Self {
                stop_accepting,
                draining,
                accept,
                more,
                worker,
            }),
            Err(e) => {
                stop_accepting.store(true, Relaxed);
                let _ = accept.join();
                for t in more {
                    let _ = t.join();
                }
                Err(e)
            }
        }
    }

    /// Stops accepting, lets the worker drain and returns what it returned (`Err` when it
    /// panicked).
    pub(crate) fn stop(self) -> std::thread::Result<T> {
        self.stop_accepting.store(true, Relaxed);
        let _ = self.accept.join();
        for t in self.more {
            let _ = t.join();
        }
        self.draining.store(true, Relaxed);
        self.worker.join()
    }
}

/// The next connection of a non-blocking `listener`, or `None` once `stop` is set (checked
/// every 5 ms); accept errors are logged, naming the `what` listener, and waited out.
pub(crate) fn accept_until(
    listener: &TcpListener,
    stop: &AtomicBool,
    what: &str,
) -> Option<(TcpStream, SocketAddr)> {
    while !stop.load(Relaxed) {
        match listener.accept() {
            Ok(s) => return Some(s),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                tracing::warn!("{what} accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    None
}

/// Accepts connections until `stop` is set; one reader thread per connection.
pub(crate) fn accept_loop(
    listener: &TcpListener,
    cfg: &Arc<ServerConfig>,
    spec: &Arc<ResolvedSpec>,
    tx: &SyncSender<Event>,
    stop: &Arc<AtomicBool>,
    counters: &Arc<ConnectionCounters>,
) {
    let open = Arc::new(AtomicUsize::new(0));
    listener
        .set_nonblocking(true)
        .expect("listener can be non-blocking");
    while let Some((stream, peer)) = accept_until(listener, stop, "probe") {
        counters.accepted.fetch_add(1, Relaxed);
        if open.load(Relaxed) >= cfg.max_connections {
            counters.refused_limit.fetch_add(1, Relaxed);
            tracing::warn!(%peer, limit = cfg.max_connections, "refused a connection: too many open");
            // Under TLS a plain-text reject would not be understood: the peer sees the
            // connection close and retries with backoff.
            if cfg.tls.is_none() {
                let _ = reject(
                    &mut &stream,
                    reject_code::OVERLOADED,
                    "too many connections",
                );
            }
            continue;
        }
        let id = cfg.conn_ids.fetch_add(1, Relaxed) + 1;
        let (cfg, spec, tx, counters, open) = (
            Arc::clone(cfg),
            Arc::clone(spec),
            tx.clone(),
            Arc::clone(counters),
            Arc::clone(&open),
        );
        open.fetch_add(1, Relaxed);
        let spawned = std::thread::Builder::new()
            .name(format!("collector-conn-{id}"))
            .spawn(move || {
                serve(stream, peer, id, &cfg, &spec, &tx, &counters);
                open.fetch_sub(1, Relaxed);
            });
        if let Err(e) = spawned {
            tracing::error!("cannot spawn a connection thread: {e}");
        }
    }
}

/// A connection's socket; reads fail with `TimedOut` once `until` has passed (each read
/// waits at most for the time left), so a peer cannot stretch the deadline by trickling.
#[derive(Debug)]
struct Sock {
    tcp: TcpStream,
    until: Option<Instant>,
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(until) = self.until {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            self.tcp.set_read_timeout(Some(left))?;
        }
        self.tcp.read(buf)
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tcp.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.tcp.flush()
    }
}

/// A probe connection: plain TCP, or TLS over it.
type Conn = crate::tls::MaybeTls<Sock>;

/// Completes the TLS handshake within the socket's deadline; on failure, the error and
/// whether it was the deadline.
fn accept_tls(
    config: &Arc<rustls::ServerConfig>,
    mut sock: Sock,
) -> Result<Conn, (std::io::Error, bool)> {
    let mut conn = rustls::ServerConnection::new(Arc::clone(config))
        .map_err(|e| (std::io::Error::other(e), false))?;
    while conn.is_handshaking() {
        conn.complete_io(&mut sock).map_err(|e| {
            let timeout = matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            );
            (e, timeout)
        })?;
    }
    Ok(Conn::Tls(Box::new(rustls::StreamOwned::new(conn, sock))))
}

fn reject(stream: &mut impl Write, code: u16, reason: &str) -> std::io::Result<()> {
    let mut end = reason.len().min(MAX_STRING_LEN);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let frame = Frame::Reject {
        code,
        reason: reason[..end].to_owned(),
    };
    stream.write_all(&frame.to_bytes().map_err(std::io::Error::other)?)?;
    stream.flush()
}

/// Bytes a connection's reader buffers. Frames larger than this are read straight into
/// their own buffer, so it bounds only the read-ahead.
const READ_BUFFER: usize = 64 << 10;

fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    cfg: &ServerConfig,
    spec: &ResolvedSpec,
    tx: &SyncSender<Event>,
    counters: &ConnectionCounters,
) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_nodelay(true);
    // The TLS handshake and the whole hello must arrive within the timeout: a peer that
    // trickles a byte at a time (slow loris) is closed at the deadline, not kept alive by
    // each byte.
    let sock = Sock {
        tcp: stream,
        until: Some(Instant::now() + cfg.hello_timeout),
    };
    let conn = match &cfg.tls {
        None => Conn::Plain(sock),
        Some(tls) => match accept_tls(tls, sock) {
            Ok(c) => c,
            Err((_, true)) => {
                counters.hello_timeout.fetch_add(1, Relaxed);
                tracing::warn!(%peer, timeout = ?cfg.hello_timeout, "closed: no TLS handshake in time");
                return;
            }
            Err((e, false)) => {
                counters.tls_failed.fetch_add(1, Relaxed);
                tracing::warn!(%peer, "closed: TLS handshake failed: {e}");
                return;
            }
        },
    };
    let mut reader = BufReader::with_capacity(READ_BUFFER, conn);
    // Before the token is checked a peer may send no more than the largest hello.
    let mut hello = match protocol::read_frame(&mut reader, MAX_HELLO_LEN) {
        Ok(Frame::Hello(h)) => h,
        Ok(other) => {
            counters.malformed.fetch_add(1, Relaxed);
            tracing::warn!(%peer, "closed: first frame is not hello: {other:?}");
            let _ = reject(
                reader.get_mut(),
                reject_code::MALFORMED,
                "the first frame must be hello",
            );
            return;
        }
        Err(ProtocolError::Io(k)) => {
            if matches!(
                k,
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                counters.hello_timeout.fetch_add(1, Relaxed);
                tracing::warn!(%peer, timeout = ?cfg.hello_timeout, "closed: no hello in time");
            }
            return;
        }
        Err(e @ (ProtocolError::BadMagic | ProtocolError::UnsupportedVersion(_))) => {
            counters.bad_version.fetch_add(1, Relaxed);
            tracing::warn!(%peer, "closed: {e}");
            let _ = reject(
                reader.get_mut(),
                reject_code::VERSION,
                &format!("{e}; this collector speaks protocol {PROTOCOL_VERSION}"),
            );
            return;
        }
        Err(e) => {
            count_protocol_error(counters, &e);
            tracing::warn!(%peer, "closed: bad hello: {e}");
            let _ = reject(reader.get_mut(), reject_code::MALFORMED, &e.to_string());
            return;
        }
    };
    if let Some(token) = &cfg.token
        && !constant_time_eq(token.as_bytes(), hello.token.as_bytes())
    {
        counters.bad_token.fetch_add(1, Relaxed);
        tracing::warn!(%peer, host = %hello.host, "closed: wrong or missing token");
        let _ = reject(
            reader.get_mut(),
            reject_code::TOKEN,
            "wrong or missing token",
        );
        return;
    }
    for (hop, name) in &hello.hops {
        let ok = spec
            .hop_index(*hop)
            .is_some_and(|i| spec.hop_names()[i] == *name);
        if !ok {
            counters.unknown_hop.fetch_add(1, Relaxed);
            let reason = format!(
                "hop {name:?} (id {}) is not declared by pipeline {:?} (hops: {})",
                hop.0,
                spec.name(),
                spec.hop_names().join(", ")
            );
            tracing::warn!(%peer, "closed: {reason}");
            let _ = reject(reader.get_mut(), reject_code::UNKNOWN_HOP, &reason);
            return;
        }
    }
    let version = if cfg.durable.is_some() {
        hello.version.min(PROTOCOL_VERSION)
    } else {
        1
    };
    let durable = cfg.durable.as_ref().filter(|_| version >= 2);
    let instance = hello.instance_id;
    let welcome = Frame::Welcome {
        version,
        run_id: cfg.run_id.clone(),
        resume_seq: durable.map_or(0, |d| d.resume_seq(instance, Instant::now() + RESUME_WAIT)),
    };
    // Registered before the Welcome: a newer connection of the instance waits for this one.
    let _reading = durable.map(|d| d.reading(instance));
    let Ok(welcome) = welcome.to_bytes() else {
        tracing::error!("the run id does not fit a welcome frame");
        return;
    };
    let conn = reader.get_mut();
    if conn
        .write_all(&welcome)
        .and_then(|()| conn.flush())
        .is_err()
    {
        return;
    }
    let mut announced = [false; 256];
    for (hop, _) in &hello.hops {
        announced[usize::from(hop.0)] = true;
    }
    let (host, process) = (hello.host.clone(), hello.process.clone());
    tracing::info!(%peer, host = %hello.host, process = %hello.process, version, "probe connected");
    // The join thread learns the version the connection runs at, not the probe's highest.
    hello.version = version;
    if tx.send(Event::Connected(id, peer, hello)).is_err() {
        return;
    }
    // After hello, a probe may be idle for long stretches: reads wake up regularly only
    // to acknowledge what became durable.
    let leftover = reader.buffer().to_vec();
    let mut conn = reader.into_inner();
    let sock = conn.sock();
    sock.until = None;
    let _ = sock.tcp.set_read_timeout(Some(READ_TICK));
    let mut frames = FrameReader {
        buf: leftover,
        start: 0,
    };
    let mut clean = false;
    // Goodbye sends the close itself, before it waits for the log.
    let mut closed_sent = false;
    // Highest number received on this connection, and acknowledged.
    let (mut received, mut acked) = (0u64, 0u64);
    // Highest number told to the durable marks as forwarded.
    let mut told = 0u64;
    loop {
        let (frame, raw) = match frames.next(&mut conn) {
            Ok(Read1::Frame(f, raw)) => (f, raw),
            Ok(Read1::Timeout) => {
                if let Some(d) = durable
                    && !ack(&mut conn, d.get(instance), &mut acked)
                {
                    break;
                }
                continue;
            }
            Ok(Read1::Closed) | Err(ProtocolError::Io(_)) => break,
            Err(e) => {
                count_protocol_error(counters, &e);
                tracing::warn!(%peer, "closed: {e}");
                let _ = reject(&mut conn, reject_code::MALFORMED, &e.to_string());
                break;
            }
        };
        let forward = match frame {
            Frame::Goodbye => {
                clean = true;
                if let Some(d) = durable {
                    // The probe waits for the end of the connection to know that what it
                    // sent is durable: its records frames, and its last Sent, Counters and
                    // Clock frames, which no Ack covers. So the close goes into the log
                    // now, after them, and the connection ends once that is synced.
                    if tx.send(Event::Closed(id, true)).is_err() {
                        return;
                    }
                    closed_sent = true;
                    let until = Instant::now() + GOODBYE_DURABLE_WAIT;
                    if !d.wait_goodbye(id, instance, received, until) {
                        tracing::warn!(%peer, %host, %process, "the log was not synced within {GOODBYE_DURABLE_WAIT:?} of this probe's Goodbye: closing it anyway");
                    }
                    ack(&mut conn, d.get(instance), &mut acked);
                }
                break;
            }
            Frame::Records(mut recs) => {
                let whole =
                    drop_unannounced(&mut recs, &announced, counters, peer, &host, &process);
                (!recs.is_empty()).then_some((Frame::Records(recs), whole))
            }
            Frame::SeqRecords { seq, mut records } if durable.is_some() => {
                let whole =
                    drop_unannounced(&mut records, &announced, counters, peer, &host, &process);
                received = received.max(seq);
                // Forwarded even when empty: its number is logged and acknowledged.
                Some((Frame::SeqRecords { seq, records }, whole))
            }
            f @ (Frame::Clock(_) | Frame::Counters(_) | Frame::Sent(_)) => Some((f, true)),
            other => {
                counters.malformed.fetch_add(1, Relaxed);
                tracing::warn!(%peer, "closed: unexpected frame from a probe: {other:?}");
                break;
            }
        };
        // A collector with a log gets the bytes as received, when they still say what the
        // frame says (no record of an unannounced hop was dropped from it).
        let event = forward.map(|(f, whole)| {
            if cfg.durable.is_some() && whole {
                Event::FrameWithBytes(id, f, frames.buf[raw].to_vec())
            } else {
                Event::Frame(id, f)
            }
        });
        // Blocks when the join thread is behind: that is the back-pressure.
        if let Some(ev) = event
            && tx.send(ev).is_err()
        {
            break;
        }
        if let Some(d) = durable
            && received > told
        {
            d.forwarded(instance, received);
            told = received;
        }
        if let Some(d) = durable
            && !ack(&mut conn, d.get(instance), &mut acked)
        {
            break;
        }
    }
    if !closed_sent {
        let _ = tx.send(Event::Closed(id, clean));
    }
}

/// Sends an Ack when `durable` is above what was acknowledged; false when the
/// connection failed.
fn ack(conn: &mut Conn, durable: u64, acked: &mut u64) -> bool {
    if durable <= *acked {
        return true;
    }
    *acked = durable;
    let frame = Frame::Ack { seq: durable }
        .to_bytes()
        .expect("an ack encodes");
    conn.write_all(&frame).and_then(|()| conn.flush()).is_ok()
}

/// Drops the records of hops the connection did not announce, counting them; true when
/// none was dropped.
fn drop_unannounced(
    recs: &mut Vec<protocol::Record>,
    announced: &[bool; 256],
    counters: &ConnectionCounters,
    peer: SocketAddr,
    host: &str,
    process: &str,
) -> bool {
    let before = recs.len();
    recs.retain(|r| announced[usize::from(r.hop.0)]);
    let dropped = before - recs.len();
    if dropped > 0 {
        let total = counters
            .unannounced_hop_records
            .fetch_add(dropped as u64, Relaxed);
        if total == 0 {
            tracing::warn!(%peer, %host, %process, "dropped {dropped} record(s) of hops this connection did not announce in its hello (counted as unannounced_hop_records)");
        }
    }
    dropped == 0
}

fn count_protocol_error(counters: &ConnectionCounters, e: &ProtocolError) {
    match e {
        ProtocolError::FrameTooLarge(..) => counters.too_large.fetch_add(1, Relaxed),
        _ => counters.malformed.fetch_add(1, Relaxed),
    };
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
