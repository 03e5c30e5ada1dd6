//! The HTTP endpoints of a running collector (`hoptrace collect --metrics`):
//!
//! - `GET /metrics`: Prometheus text, for monitoring ([`render`]).
//! - `GET /progress.json`: the collector's [`Progress`] as JSON, for programs that watch a
//!   collector in another process (`hoptrace soak` waits on it to drain); read it with
//!   [`fetch_progress`], which returns the same type.
//!
//! With the live view (`hoptrace collect --ui`, [`MetricsServer::start_with`] given a
//! [`Live`] source), also:
//!
//! - `GET /`: the live view's page ([`crate::live::PAGE`]), self-contained;
//! - `GET /live.json`: the collector's [`Live`] figures, which the page polls.
//!
//! Minimal on purpose: one short-lived thread per request, at most
//! [`MAX_CONCURRENT_REQUESTS`] at once (more are answered 503 without a thread), a 2 s
//! read and write timeout, requests larger than 8 KiB refused, and nothing but these
//! paths answered.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::live::Live;
use crate::run::Progress;

/// Requests answered at once; a scraper needs one.
pub const MAX_CONCURRENT_REQUESTS: usize = 8;

/// The path of the Prometheus text.
pub const METRICS_PATH: &str = "/metrics";
/// The path of the JSON progress.
pub const PROGRESS_PATH: &str = "/progress.json";
/// The path of the live view's page.
pub const UI_PATH: &str = "/";
/// The path of the live view's figures.
pub const LIVE_PATH: &str = "/live.json";

/// A source of figures, read for each request.
pub type Source<T> = Arc<dyn Fn() -> T + Send + Sync>;

/// What a [`MetricsServer`] serves: [`METRICS_PATH`] and [`PROGRESS_PATH`] from
/// `progress`, and with `live` the live view, [`UI_PATH`] and [`LIVE_PATH`].
#[derive(Clone)]
pub struct Endpoints {
    /// The figures of `/metrics` and `/progress.json`.
    pub progress: Source<Progress>,
    /// The figures of `/live.json`; `None`: no live view (`/` and `/live.json` are 404).
    pub live: Option<Source<Live>>,
}

impl std::fmt::Debug for Endpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoints")
            .field("live", &self.live.is_some())
            .finish_non_exhaustive()
    }
}

/// Serves [`METRICS_PATH`] and [`PROGRESS_PATH`] until dropped.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr`; `progress` is read for each request.
    ///
    /// # Errors
    /// The address cannot be bound.
    pub fn start(addr: &str, progress: Source<Progress>) -> std::io::Result<Self> {
        Self::start_with(
            addr,
            Endpoints {
                progress,
                live: None,
            },
        )
    }

    /// Listens on `addr` and serves `endpoints`, read for each request.
    ///
    /// # Errors
    /// The address cannot be bound.
    pub fn start_with(addr: &str, endpoints: Endpoints) -> std::io::Result<Self> {
        let endpoints = Arc::new(endpoints);
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("collector-metrics".into())
            .spawn(move || {
                let busy = Arc::new(AtomicUsize::new(0));
                while !s.load(Relaxed) {
                    match listener.accept() {
                        Ok((mut stream, _)) => {
                            if busy.load(Relaxed) >= MAX_CONCURRENT_REQUESTS {
                                let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
                                let _ = stream.write_all(b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n");
                                continue;
                            }
                            busy.fetch_add(1, Relaxed);
                            let (endpoints, done) = (Arc::clone(&endpoints), Arc::clone(&busy));
                            let spawned = std::thread::Builder::new()
                                .name("collector-metrics-request".into())
                                .spawn(move || {
                                    let _ = answer(stream, &endpoints);
                                    done.fetch_sub(1, Relaxed);
                                });
                            if spawned.is_err() {
                                busy.fetch_sub(1, Relaxed);
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })?;
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Serves the live view of the collector `watch` watches on `addr`, with `/metrics`
    /// and `/progress.json`; `target_metrics_per_s` is shown as the throughput's target.
    ///
    /// # Errors
    /// The address cannot be bound.
    pub fn start_live(
        addr: &str,
        watch: &crate::run::Watch,
        target_metrics_per_s: Option<f64>,
    ) -> std::io::Result<Self> {
        let (w, l) = (watch.clone(), watch.clone());
        Self::start_with(
            addr,
            Endpoints {
                progress: Arc::new(move || w.progress()),
                live: Some(Arc::new(move || {
                    let mut live = l.live();
                    live.throughput.target_metrics_per_s = target_metrics_per_s;
                    live
                })),
            },
        )
    }

    /// The bound address.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn answer(mut stream: TcpStream, endpoints: &Endpoints) -> std::io::Result<()> {
    let progress = &*endpoints.progress;
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut buf = [0u8; 8192];
    let mut n = 0;
    while !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
        if n == buf.len() {
            return stream.write_all(b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n\r\n");
        }
        let got = stream.read(&mut buf[n..])?;
        if got == 0 {
            return Ok(());
        }
        n += got;
    }
    let head = String::from_utf8_lossy(&buf[..n]);
    let asks = |path: &str| {
        head.strip_prefix("GET ")
            .and_then(|rest| rest.strip_prefix(path))
            .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('?'))
    };
    let (status, kind, body) = if asks(METRICS_PATH) {
        ("200 OK", "text/plain; version=0.0.4", render(&progress()))
    } else if asks(PROGRESS_PATH) {
        let body = serde_json::to_string(&progress()).map_err(std::io::Error::other)?;
        ("200 OK", "application/json", body)
    } else if let Some(live) = endpoints.live.as_deref()
        && asks(LIVE_PATH)
    {
        let body = serde_json::to_string(&live()).map_err(std::io::Error::other)?;
        ("200 OK", "application/json", body)
    } else if endpoints.live.is_some() && asks(UI_PATH) {
        (
            "200 OK",
            "text/html; charset=utf-8",
            crate::live::PAGE.into(),
        )
    } else if endpoints.live.is_some() {
        (
            "404 Not Found",
            "text/plain",
            format!("only {UI_PATH}, {LIVE_PATH}, {METRICS_PATH} and {PROGRESS_PATH} are served\n"),
        )
    } else {
        (
            "404 Not Found",
            "text/plain",
            format!("only {METRICS_PATH} and {PROGRESS_PATH} are served\n"),
        )
    };
    // The page is served as it is: nothing it loads comes from elsewhere, and the
    // browser is told to fetch nothing from anywhere else either.
    let policy = if kind.starts_with("text/html") {
        "content-security-policy: default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; connect-src 'self'\r\ncache-control: no-store\r\n"
    } else {
        "cache-control: no-store\r\n"
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\ncontent-type: {kind}\r\n{policy}connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Reads the [`Progress`] of a collector serving [`PROGRESS_PATH`] at `addr`, waiting
/// at most `timeout` to connect and as long again for the answer.
///
/// # Errors
/// Nothing answers, the answer is not `200 OK`, or its body is not a `Progress`.
pub fn fetch_progress(addr: SocketAddr, timeout: Duration) -> std::io::Result<Progress> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(s, "GET {PROGRESS_PATH} HTTP/1.0\r\nHost: hoptrace\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no HTTP answer"))?;
    if !head.starts_with("HTTP/1.1 200") {
        let status = head.lines().next().unwrap_or_default();
        return Err(std::io::Error::other(format!("{PROGRESS_PATH}: {status}")));
    }
    serde_json::from_str(body).map_err(std::io::Error::other)
}

/// The Prometheus text exposition of a collector's progress.
#[must_use]
pub fn render(p: &Progress) -> String {
    let mut s = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in samples {
            let _ = writeln!(s, "{name}{labels} {v}");
        }
    };
    metric(
        "hoptrace_records_total",
        "counter",
        "Hop records received from probes.",
        &[(String::new(), p.records as f64)],
    );
    metric(
        "hoptrace_traces_total",
        "counter",
        "Traces written, by status.",
        &[
            ("{status=\"complete\"}".into(), p.complete as f64),
            ("{status=\"incomplete\"}".into(), p.incomplete as f64),
        ],
    );
    metric(
        "hoptrace_pending_traces",
        "gauge",
        "Traces waiting in the join for more hops.",
        &[(String::new(), p.pending as f64)],
    );
    metric(
        "hoptrace_probe_connections",
        "gauge",
        "Probe connections open.",
        &[(String::new(), p.connections as f64)],
    );
    let latency: Vec<(String, f64)> = p
        .stages
        .iter()
        .flat_map(|(stage, p50, p99)| {
            let stage = stage.replace('\\', "\\\\").replace('"', "\\\"");
            [
                (
                    format!("{{stage=\"{stage}\",quantile=\"0.5\"}}"),
                    *p50 as f64 / 1e9,
                ),
                (
                    format!("{{stage=\"{stage}\",quantile=\"0.99\"}}"),
                    *p99 as f64 / 1e9,
                ),
            ]
        })
        .collect();
    metric(
        "hoptrace_stage_latency_seconds",
        "gauge",
        "Stage latency percentiles over the last 1 s interval (HdrHistogram, 3 significant digits).",
        &latency,
    );
    let closed: Vec<(String, f64)> = p
        .closed_connections
        .iter()
        .map(|(reason, n)| (format!("{{reason=\"{reason}\"}}"), *n as f64))
        .collect();
    metric(
        "hoptrace_connections_closed_total",
        "counter",
        "Probe connections refused or closed, by reason.",
        &closed,
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get_path(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    fn get(addr: SocketAddr) -> String {
        get_path(addr, "/metrics")
    }

    fn progress() -> Progress {
        Progress {
            records: 12,
            complete: 3,
            incomplete: 1,
            pending: 2,
            connections: 4,
            stages: vec![("Broker \"Time\"".into(), 1_000, -5)],
            closed_connections: [("bad token".to_owned(), 2)].into(),
            backpressure_episodes: 1,
            log_bytes: 4096,
            checkpoints: 2,
        }
    }

    #[test]
    fn progress_reads_back_as_the_type_it_was() {
        let server = MetricsServer::start("127.0.0.1:0", Arc::new(progress)).unwrap();
        let addr = server.local_addr();
        let got = fetch_progress(addr, Duration::from_secs(5)).unwrap();
        assert_eq!(got, progress());
        // The Prometheus page stays as it was, from the same figures.
        let page = get(addr);
        assert!(page.contains("text/plain; version=0.0.4"), "{page}");
        assert!(
            page.contains("hoptrace_traces_total{status=\"complete\"} 3"),
            "{page}"
        );
        assert!(page.contains("hoptrace_pending_traces 2"), "{page}");
        let json = get_path(addr, "/progress.json?x=1");
        assert!(json.contains("application/json"), "{json}");
        let other = get_path(addr, "/metricsx");
        assert!(other.starts_with("HTTP/1.1 404"), "{other}");
        assert!(other.contains("/progress.json"), "{other}");
    }

    #[test]
    fn fetching_from_nothing_fails() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        assert!(fetch_progress(port, Duration::from_millis(500)).is_err());
    }

    #[test]
    fn idle_connections_cannot_take_more_than_the_request_limit() {
        let server = MetricsServer::start("127.0.0.1:0", Arc::new(Progress::default)).unwrap();
        let addr = server.local_addr();
        assert!(get(addr).starts_with("HTTP/1.1 200"));
        // Connections that never send a request hold a request thread each, up to the
        // limit; beyond it the server answers at once without a thread.
        let idle: Vec<TcpStream> = (0..MAX_CONCURRENT_REQUESTS)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        assert!(get(addr).starts_with("HTTP/1.1 503"));
        // The idle ones time out (2 s) and the endpoint answers again.
        std::thread::sleep(Duration::from_millis(2_500));
        assert!(get(addr).starts_with("HTTP/1.1 200"));
        drop(idle);
    }
}
