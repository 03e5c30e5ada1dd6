//! A Prometheus text endpoint (`GET /metrics`) for a running collector.
//!
//! Minimal on purpose: one short-lived thread per request, a 2 s read timeout, requests
//! larger than 8 KiB refused, and nothing but `GET /metrics` answered.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::run::Progress;

/// Serves `/metrics` until dropped.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr`; `render` produces the page for each request.
    ///
    /// # Errors
    /// The address cannot be bound.
    pub fn start(
        addr: &str,
        render: Arc<dyn Fn() -> String + Send + Sync>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("collector-metrics".into())
            .spawn(move || {
                while !s.load(Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let render = Arc::clone(&render);
                            std::thread::spawn(move || {
                                let _ = answer(stream, &*render);
                            });
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

fn answer(mut stream: TcpStream, render: &dyn Fn() -> String) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
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
    let (status, body) = if head.starts_with("GET /metrics ") || head.starts_with("GET /metrics?") {
        ("200 OK", render())
    } else {
        ("404 Not Found", "only /metrics is served\n".to_owned())
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
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
