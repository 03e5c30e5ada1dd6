//! A Prometheus text endpoint (`GET /metrics`) for a running collector.
//!
//! Minimal on purpose: one short-lived thread per request, at most
//! [`MAX_CONCURRENT_REQUESTS`] at once (more are answered 503 without a thread), a 2 s
//! read and write timeout, requests larger than 8 KiB refused, and nothing but
//! `GET /metrics` answered.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::run::Progress;

/// Requests answered at once; a scraper needs one.
pub const MAX_CONCURRENT_REQUESTS: usize = 8;

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
                            let (render, done) = (Arc::clone(&render), Arc::clone(&busy));
                            let spawned = std::thread::Builder::new()
                                .name("collector-metrics-request".into())
                                .spawn(move || {
                                    let _ = answer(stream, &*render);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn get(addr: SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn idle_connections_cannot_take_more_than_the_request_limit() {
        let server = MetricsServer::start("127.0.0.1:0", Arc::new(|| "up 1\n".to_owned())).unwrap();
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
