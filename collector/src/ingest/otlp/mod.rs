//! The OTLP receiver (`hoptrace collect --otlp HOST:PORT`): OpenTelemetry trace exports
//! over OTLP/HTTP (`POST /v1/traces`, protobuf or JSON, plain or gzip), whose spans stamp
//! the hops the pipeline spec defines by a span match ([`spans`]).
//!
//! Each sender of spans (a resource's host and `service.name`) joins the run as one probe
//! connection would: it is announced with the span hops, and its stamps go through the
//! same channel, log and join as a probe's records. A request is answered once its stamps
//! are in the run's log (when the collector keeps one), so an exporter that retries what
//! was not acknowledged loses nothing to a killed collector; a stamp sent twice (a retry)
//! is counted as a duplicate and the first kept.
//!
//! Answers follow the OTLP specification: 200 with an `ExportTraceServiceResponse`
//! (partial success with the number of spans rejected and why), 400 for a body that does
//! not decode, 401 for a missing or wrong bearer token, 404/405 for another path or
//! method, 413 for a body above the limit, 415 for another content type or encoding, and
//! 503 with `Retry-After` when the join cannot take more. Each outcome is counted
//! ([`OtlpCounters`], `run.json` → `otlp`).

pub mod spans;
pub mod wire;

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hoptrace_protocol::{Frame, Hello, MAX_RECORDS_PER_FRAME, Record};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message as _;

use crate::error::CollectorError;
use crate::server::{DurableSeqs, Event};
use spans::{Source, SpanCounts, SpanHops};

/// Most bytes of a request's body (after gzip, too) by default: 16 MiB.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 16 << 20;
/// Most bytes of a request's line and headers.
const MAX_HEAD_BYTES: usize = 16 << 10;
/// How long a request may take from its first byte to its last.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection may sit idle between requests.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a request waits for room in the join's channel before it is answered 503.
const CHANNEL_WAIT: Duration = Duration::from_secs(1);
/// How long a request waits for its stamps to be in the log before it is answered 503.
const DURABLE_WAIT: Duration = Duration::from_secs(5);
/// Most OTLP connections open at once.
const MAX_CONNECTIONS: usize = 64;
/// How long a read waits before it looks whether the receiver is stopping.
const READ_TICK: Duration = Duration::from_millis(50);

/// The OTLP receiver's settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OtlpConfig {
    /// Address to listen on, e.g. `127.0.0.1:4318` (`:0` picks a port).
    pub listen: String,
    /// Most bytes of a request's body, before and after gzip.
    pub max_request_bytes: usize,
    /// Answer a request once its stamps are in the run's log (when the collector keeps
    /// one), rather than once the join took them: a collector killed then loses nothing
    /// an exporter was told was taken, at the price of waiting for the log's next sync
    /// (`--log-sync`) on every request.
    pub ack_durable: bool,
}

impl OtlpConfig {
    /// Listens on `listen` with the default limits.
    #[must_use]
    pub fn new(listen: impl Into<String>) -> Self {
        Self {
            listen: listen.into(),
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            ack_durable: true,
        }
    }
}

/// What the OTLP receiver did, request by request and span by span.
#[derive(Debug, Default)]
pub struct OtlpCounters {
    /// Requests read in full (whatever their answer).
    pub requests: AtomicU64,
    /// Requests answered 200.
    pub accepted: AtomicU64,
    /// Requests whose body did not decode (400).
    pub malformed: AtomicU64,
    /// Requests above the size limit (413).
    pub too_large: AtomicU64,
    /// Requests of another path, method, content type or encoding (404, 405, 415), or
    /// not HTTP at all.
    pub unsupported: AtomicU64,
    /// Requests without the right bearer token (401).
    pub unauthorized: AtomicU64,
    /// Requests answered 503 because the join could not take them in time (the
    /// exporter retries them).
    pub throttled: AtomicU64,
    /// Spans received in requests that decoded.
    pub spans: AtomicU64,
    /// Spans that stamped a hop.
    pub stamped: AtomicU64,
    /// Hop stamps made of them.
    pub stamps: AtomicU64,
    /// Spans that match no hop.
    pub unmatched: AtomicU64,
    /// Spans that end before they start.
    pub end_before_start: AtomicU64,
    /// Spans with an invalid trace id or time.
    pub bad_trace_id: AtomicU64,
    /// Spans whose trace id names no message.
    pub no_message: AtomicU64,
}

impl OtlpCounters {
    fn add_spans(&self, c: &SpanCounts) {
        self.spans.fetch_add(c.spans, Relaxed);
        self.stamped.fetch_add(c.stamped, Relaxed);
        self.stamps.fetch_add(c.stamps, Relaxed);
        self.unmatched.fetch_add(c.unmatched, Relaxed);
        self.end_before_start.fetch_add(c.end_before_start, Relaxed);
        self.bad_trace_id.fetch_add(c.bad_trace_id, Relaxed);
        self.no_message.fetch_add(c.no_message, Relaxed);
    }

    /// The counters by name, as `run.json` holds them.
    #[must_use]
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        [
            ("requests", &self.requests),
            ("accepted", &self.accepted),
            ("malformed", &self.malformed),
            ("too_large", &self.too_large),
            ("unsupported", &self.unsupported),
            ("unauthorized", &self.unauthorized),
            ("throttled", &self.throttled),
            ("spans", &self.spans),
            ("spans_stamped", &self.stamped),
            ("stamps", &self.stamps),
            ("spans_unmatched", &self.unmatched),
            ("spans_end_before_start", &self.end_before_start),
            ("spans_bad_trace_id", &self.bad_trace_id),
            ("spans_no_message", &self.no_message),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.load(Relaxed)))
        .collect()
    }
}

/// A bound OTLP listener, before it runs.
#[derive(Debug)]
pub(crate) struct OtlpListener {
    listener: TcpListener,
    addr: SocketAddr,
    cfg: OtlpConfig,
}

impl OtlpListener {
    /// Binds `cfg.listen`.
    ///
    /// # Errors
    /// A bind error, or a non-loopback address without a token.
    pub(crate) fn bind(cfg: &OtlpConfig, token: Option<&str>) -> Result<Self, CollectorError> {
        let listen_err = |source| CollectorError::Listen {
            addr: cfg.listen.clone(),
            source,
        };
        let listener = TcpListener::bind(&cfg.listen).map_err(listen_err)?;
        let addr = listener.local_addr().map_err(listen_err)?;
        if !addr.ip().is_loopback() && token.is_none_or(str::is_empty) {
            return Err(CollectorError::TokenRequired(addr));
        }
        Ok(Self {
            listener,
            addr,
            cfg: cfg.clone(),
        })
    }

    /// The bound address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its settings.
    pub(crate) fn config(&self) -> &OtlpConfig {
        &self.cfg
    }
}

/// What the receiver's threads share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) hops: SpanHops,
    pub(crate) counters: Arc<OtlpCounters>,
    pub(crate) token: Option<String>,
    pub(crate) run_id: String,
    pub(crate) conn_ids: Arc<AtomicU64>,
    pub(crate) durable: Option<Arc<DurableSeqs>>,
    /// HTTPS with the probes' certificate, when the collector has one.
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
    max_request_bytes: usize,
    ack_durable: bool,
    /// Every sender seen, each behind a lock of its own: a request holds its sender's lock
    /// while it hands that sender's frames to the join (so its frame numbers reach the join
    /// in order), never the map's, so a sender whose frames wait for room in the join holds
    /// up no other sender.
    sources: Mutex<HashMap<Source, Arc<Mutex<SourceConn>>>>,
}

/// One sender of spans, as the join sees it: a connection.
#[derive(Debug, Clone, Copy)]
struct SourceConn {
    id: u64,
    instance: u64,
    /// The last records frame number given.
    seq: u64,
    /// Whether the join took the connection's Hello (a request that could not hand it over
    /// leaves the next one to try again).
    connected: bool,
}

impl Shared {
    /// The receiver's state: the span hops, its counters, the probes' token and TLS
    /// setting, the run, the connection ids it shares with the probes' listener, the
    /// durable marks (with a log) and its settings.
    pub(crate) fn new(
        (hops, counters): (SpanHops, Arc<OtlpCounters>),
        (token, tls): (Option<String>, Option<Arc<rustls::ServerConfig>>),
        run_id: String,
        conn_ids: Arc<AtomicU64>,
        durable: Option<Arc<DurableSeqs>>,
        cfg: &OtlpConfig,
    ) -> Self {
        Self {
            hops,
            counters,
            token,
            run_id,
            conn_ids,
            durable,
            tls,
            max_request_bytes: cfg.max_request_bytes,
            ack_durable: cfg.ack_durable,
            sources: Mutex::new(HashMap::new()),
        }
    }
}

/// Runs the receiver until `stop` is set: accepts connections (one thread each), then,
/// once they have ended, closes every sender's connection in the join.
pub(crate) fn serve(
    listener: OtlpListener,
    shared: Shared,
    tx: &SyncSender<Event>,
    stop: &AtomicBool,
) {
    let listener = listener.listener;
    let shared = Arc::new(shared);
    let open = Arc::new(AtomicUsize::new(0));
    let stopping = Arc::new(AtomicBool::new(false));
    listener
        .set_nonblocking(true)
        .expect("listener can be non-blocking");
    let mut threads = Vec::new();
    while let Some((stream, peer)) = crate::server::accept_until(&listener, stop, "OTLP") {
        if open.load(Relaxed) >= MAX_CONNECTIONS {
            let mut s = stream;
            let _ = respond(
                &mut s,
                &Answer::error(503, "too many OTLP connections", Format::Json),
                true,
            );
            shared.counters.throttled.fetch_add(1, Relaxed);
            continue;
        }
        open.fetch_add(1, Relaxed);
        let (shared, tx, open, stopping) = (
            Arc::clone(&shared),
            tx.clone(),
            Arc::clone(&open),
            Arc::clone(&stopping),
        );
        let spawned = std::thread::Builder::new()
            .name("collector-otlp-conn".into())
            .spawn(move || {
                connection(stream, peer, &shared, &tx, &stopping);
                open.fetch_sub(1, Relaxed);
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => tracing::error!("cannot spawn an OTLP connection thread: {e}"),
        }
        threads.retain(|t| !t.is_finished());
    }
    stopping.store(true, Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let sources = std::mem::take(&mut *lock(&shared.sources));
    // A join that is full takes nothing until traces complete or expire: waiting for it
    // here would hold the collector's stop for up to a join window.
    let deadline = Instant::now() + CHANNEL_WAIT * 2;
    for conn in sources.values().map(|c| *lock(c)).filter(|c| c.connected) {
        if send_within(tx, Event::Closed(conn.id, true), deadline).is_err() {
            tracing::warn!(
                conn = conn.id,
                "OTLP: the join did not take a sender's close in time (it is full): the sender is left open in run.json"
            );
        }
    }
}

/// The body format of a request and its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Protobuf,
    Json,
}

impl Format {
    fn content_type(self) -> &'static str {
        match self {
            Self::Protobuf => "application/x-protobuf",
            Self::Json => "application/json",
        }
    }
}

/// `google.rpc.Status`, the body of an OTLP error answer.
#[derive(Clone, PartialEq, prost::Message, serde::Serialize)]
struct Status {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

/// An HTTP answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: &'static str,
    body: Vec<u8>,
    retry_after: Option<u32>,
}

impl Answer {
    fn error(status: u16, message: &str, format: Format) -> Self {
        // gRPC codes of the HTTP statuses OTLP names.
        let code = match status {
            400 | 413 | 415 | 404 | 405 => 3,
            401 => 16,
            _ => 14,
        };
        let s = Status {
            code,
            message: message.to_owned(),
        };
        Self {
            status,
            content_type: format.content_type(),
            body: match format {
                Format::Protobuf => s.encode_to_vec(),
                Format::Json => serde_json::to_vec(&s).expect("a status serialises"),
            },
            retry_after: (status == 503).then_some(1),
        }
    }

    fn ok(counts: &SpanCounts, format: Format) -> Self {
        let rejected = counts.rejected();
        let resp = ExportTraceServiceResponse {
            partial_success: (rejected > 0).then(|| ExportTracePartialSuccess {
                rejected_spans: i64::try_from(rejected).unwrap_or(i64::MAX),
                error_message: counts.rejection_message(),
            }),
        };
        Self {
            status: 200,
            content_type: format.content_type(),
            body: match format {
                Format::Protobuf => resp.encode_to_vec(),
                Format::Json => serde_json::to_vec(&resp).expect("a response serialises"),
            },
            retry_after: None,
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    }
}

fn respond(s: &mut impl Write, a: &Answer, close: bool) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n",
        a.status,
        reason(a.status),
        a.content_type,
        a.body.len()
    );
    if let Some(secs) = a.retry_after {
        head.push_str(&format!("Retry-After: {secs}\r\n"));
    }
    if close {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    s.write_all(&a.body)?;
    s.flush()
}

/// An OTLP connection: plain HTTP, or HTTPS when the collector has a certificate.
type Stream = crate::tls::MaybeTls<TcpStream>;

/// Bytes read from a connection and not yet used.
struct Input {
    stream: Stream,
    buf: Vec<u8>,
}

/// Why reading stopped.
#[derive(Debug)]
enum ReadEnd {
    /// The peer closed (or reset) the connection.
    Closed,
    /// The deadline passed.
    TimedOut,
    /// The receiver is stopping.
    Stopping,
}

impl Input {
    /// Reads more bytes into `buf`, waiting until `deadline`.
    fn fill(&mut self, deadline: Instant, stopping: &AtomicBool) -> Result<(), ReadEnd> {
        let mut chunk = [0u8; 64 << 10];
        loop {
            if stopping.load(Relaxed) && self.buf.is_empty() {
                return Err(ReadEnd::Stopping);
            }
            if Instant::now() >= deadline {
                return Err(ReadEnd::TimedOut);
            }
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ReadEnd::Closed),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(());
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(_) => return Err(ReadEnd::Closed),
            }
        }
    }

    /// Takes `n` bytes, reading until they are there.
    fn take(
        &mut self,
        n: usize,
        deadline: Instant,
        stopping: &AtomicBool,
    ) -> Result<Vec<u8>, ReadEnd> {
        while self.buf.len() < n {
            self.fill(deadline, stopping)?;
        }
        let rest = self.buf.split_off(n);
        Ok(std::mem::replace(&mut self.buf, rest))
    }

    /// Takes a line ending in CRLF (without it), of at most `max` bytes.
    fn line(
        &mut self,
        max: usize,
        deadline: Instant,
        stopping: &AtomicBool,
    ) -> Result<Option<Vec<u8>>, ReadEnd> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let mut l = self.take(i + 2, deadline, stopping)?;
                l.truncate(i);
                return Ok(Some(l));
            }
            if self.buf.len() > max {
                return Ok(None);
            }
            self.fill(deadline, stopping)?;
        }
    }
}

/// A request's head, as far as the receiver needs it.
#[derive(Debug, Default)]
struct Head {
    method: String,
    path: String,
    content_type: String,
    content_encoding: String,
    content_length: Option<usize>,
    chunked: bool,
    authorization: Option<String>,
    expect_continue: bool,
    close: bool,
}

fn parse_head(bytes: &[u8]) -> Result<Head, String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(bytes) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err("incomplete request head".into()),
        Err(e) => return Err(format!("not an HTTP request: {e}")),
    }
    let mut h = Head {
        method: req.method.unwrap_or_default().to_owned(),
        path: req
            .path
            .unwrap_or_default()
            .split('?')
            .next()
            .unwrap_or_default()
            .to_owned(),
        close: req.version == Some(0),
        ..Head::default()
    };
    for header in req.headers.iter() {
        let value = String::from_utf8_lossy(header.value).trim().to_owned();
        match header.name.to_ascii_lowercase().as_str() {
            "content-type" => {
                h.content_type = value
                    .split(';')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_ascii_lowercase()
            }
            "content-encoding" => h.content_encoding = value.to_ascii_lowercase(),
            "content-length" => {
                h.content_length = Some(
                    value
                        .parse()
                        .map_err(|_| format!("Content-Length {value:?} is not a number"))?,
                );
            }
            "transfer-encoding" => {
                h.chunked = value
                    .to_ascii_lowercase()
                    .split(',')
                    .any(|t| t.trim() == "chunked")
            }
            "authorization" => h.authorization = Some(value),
            "expect" => h.expect_continue = value.eq_ignore_ascii_case("100-continue"),
            "connection" => {
                let v = value.to_ascii_lowercase();
                if v.contains("close") {
                    h.close = true;
                } else if v.contains("keep-alive") {
                    h.close = false;
                }
            }
            _ => {}
        }
    }
    Ok(h)
}

/// Serves one connection's requests until it closes, idles out or the receiver stops.
fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    shared: &Shared,
    tx: &SyncSender<Event>,
    stopping: &AtomicBool,
) {
    let _ = stream.set_read_timeout(Some(READ_TICK));
    let _ = stream.set_nodelay(true);
    let stream = match &shared.tls {
        None => Stream::Plain(stream),
        Some(cfg) => match rustls::ServerConnection::new(Arc::clone(cfg)) {
            Ok(conn) => Stream::Tls(Box::new(rustls::StreamOwned::new(conn, stream))),
            Err(e) => {
                tracing::warn!(%peer, "OTLP: cannot start TLS: {e}");
                return;
            }
        },
    };
    let mut input = Input {
        stream,
        buf: Vec::new(),
    };
    loop {
        // Between requests: wait for the next one's first byte.
        if input.buf.is_empty() {
            match input.fill(Instant::now() + IDLE_TIMEOUT, stopping) {
                Ok(()) => {}
                Err(_) => return,
            }
        }
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let head = loop {
            if let Some(i) = input.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break input.take(i + 4, deadline, stopping).ok();
            }
            if input.buf.len() > MAX_HEAD_BYTES {
                shared.counters.unsupported.fetch_add(1, Relaxed);
                let _ = respond(
                    &mut input.stream,
                    &Answer::error(431, "request head above 16 KiB", Format::Json),
                    true,
                );
                return;
            }
            if input.fill(deadline, stopping).is_err() {
                break None;
            }
        };
        let Some(head) = head else {
            return;
        };
        let (answer, close) = request(&head, &mut input, peer, shared, tx, deadline, stopping);
        let Some(answer) = answer else {
            return;
        };
        if respond(&mut input.stream, &answer, close).is_err() || close {
            return;
        }
    }
}

/// Reads one request's body and answers it; `None`: the connection ended mid-request.
#[allow(clippy::too_many_arguments)]
fn request(
    head_bytes: &[u8],
    input: &mut Input,
    peer: SocketAddr,
    shared: &Shared,
    tx: &SyncSender<Event>,
    deadline: Instant,
    stopping: &AtomicBool,
) -> (Option<Answer>, bool) {
    let c = &shared.counters;
    let head = match parse_head(head_bytes) {
        Ok(h) => h,
        Err(why) => {
            c.unsupported.fetch_add(1, Relaxed);
            return (Some(Answer::error(400, &why, Format::Json)), true);
        }
    };
    let format = match head.content_type.as_str() {
        "application/json" => Format::Json,
        _ => Format::Protobuf,
    };
    // What must be refused before the body is read (the connection then closes, so its
    // body is never read).
    let refuse = |status, why: String, counter: &AtomicU64| {
        counter.fetch_add(1, Relaxed);
        c.requests.fetch_add(1, Relaxed);
        (Some(Answer::error(status, &why, format)), true)
    };
    if head.path != "/v1/traces" {
        return refuse(
            404,
            format!(
                "{} is not served: OTLP traces go to POST /v1/traces",
                head.path
            ),
            &c.unsupported,
        );
    }
    if head.method != "POST" {
        return refuse(
            405,
            format!("{} /v1/traces: only POST is served", head.method),
            &c.unsupported,
        );
    }
    if let Some(token) = shared.token.as_deref().filter(|t| !t.is_empty()) {
        let given = head
            .authorization
            .as_deref()
            .and_then(|a| a.strip_prefix("Bearer "));
        if given != Some(token) {
            return refuse(
                401,
                "missing or wrong bearer token (Authorization: Bearer <the collector's --token>)"
                    .into(),
                &c.unauthorized,
            );
        }
    }
    if !matches!(
        head.content_type.as_str(),
        "application/x-protobuf" | "application/json"
    ) {
        return refuse(
            415,
            format!(
                "Content-Type {:?}: OTLP/HTTP takes application/x-protobuf or application/json",
                head.content_type
            ),
            &c.unsupported,
        );
    }
    let gzip = match head.content_encoding.as_str() {
        "" | "identity" => false,
        "gzip" => true,
        other => {
            return refuse(
                415,
                format!("Content-Encoding {other:?}: only gzip or none"),
                &c.unsupported,
            );
        }
    };
    let max = shared.max_request_bytes;
    if head.content_length.is_some_and(|n| n > max) {
        return refuse(
            413,
            format!(
                "a body of {} bytes is above the limit of {max} bytes (--otlp-max-request)",
                head.content_length.unwrap_or(0)
            ),
            &c.too_large,
        );
    }
    if head.expect_continue {
        let _ = input.stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
    }
    let body = match read_body(&head, input, max, deadline, stopping) {
        Ok(Ok(b)) => b,
        Ok(Err(too_large)) => return refuse(413, too_large, &c.too_large),
        Err(_) => return (None, true),
    };
    c.requests.fetch_add(1, Relaxed);
    let body = if gzip {
        let mut plain = Vec::new();
        let mut d = flate2::read::GzDecoder::new(&body[..]).take(max as u64 + 1);
        if let Err(e) = d.read_to_end(&mut plain) {
            c.malformed.fetch_add(1, Relaxed);
            return (
                Some(Answer::error(
                    400,
                    &format!("the gzip body does not inflate: {e}"),
                    format,
                )),
                head.close,
            );
        }
        if plain.len() > max {
            c.too_large.fetch_add(1, Relaxed);
            return (
                Some(Answer::error(
                    413,
                    &format!("the body inflates to more than the limit of {max} bytes"),
                    format,
                )),
                true,
            );
        }
        plain
    } else {
        body
    };
    let decoded = match format {
        Format::Protobuf => wire::TracesRequest::decode(bytes::Bytes::from(body))
            .map_err(|e| format!("not an OTLP ExportTraceServiceRequest in protobuf: {e}")),
        Format::Json => serde_json::from_slice::<ExportTraceServiceRequest>(&body)
            .map(wire::TracesRequest::from)
            .map_err(|e| format!("not an OTLP ExportTraceServiceRequest in JSON: {e}")),
    };
    let req = match decoded {
        Ok(r) => r,
        Err(why) => {
            c.malformed.fetch_add(1, Relaxed);
            return (Some(Answer::error(400, &why, format)), head.close);
        }
    };
    let mut by_source = BTreeMap::new();
    let counts = spans::records(&req, &shared.hops, &mut by_source);
    match deliver(shared, by_source, peer, tx, stopping) {
        Ok(()) => {
            c.add_spans(&counts);
            c.accepted.fetch_add(1, Relaxed);
            (Some(Answer::ok(&counts, format)), head.close)
        }
        Err(why) => {
            c.throttled.fetch_add(1, Relaxed);
            (Some(Answer::error(503, &why, format)), head.close)
        }
    }
}

/// The body: `Ok(Err(why))` when it is above `max`; `Err` when the connection ended.
fn read_body(
    head: &Head,
    input: &mut Input,
    max: usize,
    deadline: Instant,
    stopping: &AtomicBool,
) -> Result<Result<Vec<u8>, String>, ReadEnd> {
    if !head.chunked {
        return input
            .take(head.content_length.unwrap_or(0), deadline, stopping)
            .map(Ok);
    }
    let mut body = Vec::new();
    loop {
        let Some(line) = input.line(1024, deadline, stopping)? else {
            return Err(ReadEnd::Closed);
        };
        let text = String::from_utf8_lossy(&line);
        let size = text.split(';').next().unwrap_or_default().trim();
        let Ok(n) = usize::from_str_radix(size, 16) else {
            return Err(ReadEnd::Closed);
        };
        if n == 0 {
            // Trailers, up to the empty line.
            while let Some(l) = input.line(MAX_HEAD_BYTES, deadline, stopping)? {
                if l.is_empty() {
                    return Ok(Ok(body));
                }
            }
            return Err(ReadEnd::Closed);
        }
        if body.len() + n > max {
            return Ok(Err(format!(
                "a chunked body above the limit of {max} bytes (--otlp-max-request)"
            )));
        }
        let chunk = input.take(n + 2, deadline, stopping)?;
        body.extend_from_slice(&chunk[..n]);
    }
}

/// Locks `m`, taking over a lock a panicking thread left.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Sends `ev` into the join's channel, waiting at most until `deadline` for room.
fn send_within(tx: &SyncSender<Event>, mut ev: Event, deadline: Instant) -> Result<(), String> {
    loop {
        match tx.try_send(ev) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Full(back)) => {
                if Instant::now() >= deadline {
                    return Err("the collector's join cannot take more now: retry".into());
                }
                ev = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(TrySendError::Disconnected(_)) => return Err("the collector is stopping".into()),
        }
    }
}

/// Hands each sender's records to the join as that sender's connection's frames, and
/// (with a log) waits until they are in it.
fn deliver(
    shared: &Shared,
    by_source: BTreeMap<Source, Vec<Record>>,
    peer: SocketAddr,
    tx: &SyncSender<Event>,
    stopping: &AtomicBool,
) -> Result<(), String> {
    let deadline = Instant::now() + CHANNEL_WAIT;
    let mut wait_for: Vec<(u64, u64)> = Vec::new();
    for (source, records) in by_source {
        let entry = Arc::clone(
            lock(&shared.sources)
                .entry(source.clone())
                .or_insert_with(|| {
                    let id = shared.conn_ids.fetch_add(1, Relaxed) + 1;
                    Arc::new(Mutex::new(SourceConn {
                        id,
                        instance: random_instance(id),
                        seq: 0,
                        connected: false,
                    }))
                }),
        );
        let mut conn = lock(&entry);
        if !conn.connected {
            let hello = Hello {
                version: if shared.durable.is_some() { 2 } else { 1 },
                instance_id: conn.instance,
                host: source.host.clone(),
                process: if source.service.is_empty() {
                    "otlp".into()
                } else {
                    source.service.clone()
                },
                software: format!("OTLP {}", source.sdk).trim_end().to_owned(),
                token: String::new(),
                hops: shared.hops.announced(),
            };
            send_within(tx, Event::Connected(conn.id, peer, hello), deadline)?;
            conn.connected = true;
            tracing::info!(host = %source.host, service = %source.service, run = %shared.run_id, "OTLP spans from a new sender");
        }
        let first = conn.seq;
        for chunk in records.chunks(MAX_RECORDS_PER_FRAME) {
            let frame = if shared.durable.is_some() {
                Frame::SeqRecords {
                    seq: conn.seq + 1,
                    records: chunk.to_vec(),
                }
            } else {
                Frame::Records(chunk.to_vec())
            };
            send_within(tx, Event::Frame(conn.id, frame), deadline)?;
            if shared.durable.is_some() {
                conn.seq += 1;
            }
        }
        if conn.seq > first {
            wait_for.push((conn.instance, conn.seq));
        }
    }
    let Some(durable) = shared.durable.as_ref().filter(|_| shared.ack_durable) else {
        return Ok(());
    };
    let until = Instant::now() + DURABLE_WAIT;
    // Woken as the marks rise; the stop is looked at every STOP_TICK.
    while !durable.wait_marks(&wait_for, until.min(Instant::now() + STOP_TICK)) {
        if Instant::now() >= until
            || stopping.load(Relaxed) && Instant::now() + DURABLE_WAIT / 2 >= until
        {
            return Err("the spans were taken but are not yet in the run's log: retry (what is sent twice is counted once)".into());
        }
    }
    Ok(())
}

/// How often a request waiting for its spans to be durable looks whether the collector
/// stops.
const STOP_TICK: Duration = Duration::from_millis(20);

/// An exporter-instance id for a sender: random per collector, distinct per connection.
fn random_instance(id: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::hash::RandomState::new().build_hasher();
    h.write_u64(id);
    h.finish() | 1
}

#[cfg(test)]
mod tests;
