//! A store that says what it took, InfluxDB 1.x: a subscription (`subscribe=HOST:PORT` in
//! an `influxdb://` address) makes InfluxDB send the tap every write it accepts, and each
//! one *triggers* a query for exactly the points it carried.
//!
//! InfluxDB hands a write's points to its subscriptions while the shard writes are still
//! running, so a subscription's arrival proves the write *accepted*, not queryable. What
//! proves a point queryable is still a query's answer: the tap asks at once for the points
//! the write carried (their series, by every tag, and their time range: a query that costs
//! the store about as little as a query can), and asks again after 1, 2, 4 … 32 ms for
//! those it did not find yet (a key is found with any of its points: a message written as
//! several points needs one of them). A key found that way gets `query_start` = the send of the
//! query that found it and `queryable` = its answer; its earliest instant is, as for a
//! polled key, the later of the point's store time and the send of the last poll that
//! covered it and missed it. Keys no query found within that time are left to the polls
//! (counted: `unconfirmed`). The polls go on beside it (they find what a lost subscription
//! missed), and whichever finds a key first reports it.
//!
//! The tap creates the subscription when it starts (`CREATE SUBSCRIPTION … DESTINATIONS ALL
//! 'http://HOST:PORT'` on the address's `rp=` or the database's default) and drops it when
//! it ends; one left by a tap that was killed is dropped by the next one that takes the
//! same name or address. InfluxDB sends `POST /write?db=…&rp=…` with line protocol; the
//! tap answers 204 at once, and points of other measurements, or without the key field,
//! are skipped. A request that is not HTTP, or a line that does not parse, is counted.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use hoptrace_probe::clock::realtime_ns;

use crate::listen::ListenCounts;
use crate::pollers::{Answer, NOTIFIER};
use crate::store::influxdb::InfluxDb;
use crate::store::{Batch, Row};

/// The waits between a query that missed some of a write's points and the next one that
/// asks for them: about 63 ms in all before they are left to the polls.
const RETRIES: [Duration; 6] = [
    Duration::from_millis(1),
    Duration::from_millis(2),
    Duration::from_millis(4),
    Duration::from_millis(8),
    Duration::from_millis(16),
    Duration::from_millis(32),
];

/// The largest write body taken (InfluxDB's subscriber sends one write request per POST).
const MAX_BODY: usize = 64 << 20;

/// Connections served at once. InfluxDB's subscriber writes from up to 40 goroutines by
/// default and keeps few of its connections idle, so under load it opens new ones all the
/// time; a connection beyond this is answered 503 and closed (InfluxDB counts the write as
/// failed, the polls find its points).
const MAX_CONNECTIONS: usize = 256;

/// The stack of a connection's thread (it reads into a buffer on the heap).
const CONNECTION_STACK: usize = 256 << 10;

/// A point a subscription delivered, as far as the tap needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Point {
    /// The measurement.
    pub(crate) measurement: String,
    /// Its tags, in the line's order (InfluxDB sends them sorted).
    pub(crate) tags: Vec<(String, String)>,
    /// The value of the key field, when the point has it and it is a string.
    pub(crate) key: Option<String>,
    /// Its time, ns (InfluxDB sends the time it stored, ns, on every line).
    pub(crate) time_ns: Option<i64>,
}

/// Reads one element of a line up to an unescaped byte of `stops` (outside double quotes
/// when `quoted` allows them), unescaping `\` before any of `escapable`; returns it and
/// the position of the stop (or the end).
fn element(line: &[u8], mut i: usize, stops: &[u8], escapable: &[u8]) -> (String, usize) {
    let mut out = Vec::new();
    while i < line.len() {
        let b = line[i];
        if b == b'\\' && i + 1 < line.len() && escapable.contains(&line[i + 1]) {
            out.push(line[i + 1]);
            i += 2;
            continue;
        }
        if stops.contains(&b) {
            break;
        }
        out.push(b);
        i += 1;
    }
    (String::from_utf8_lossy(&out).into_owned(), i)
}

/// Parses one line of InfluxDB line protocol: `None` for a blank line or a comment.
///
/// # Errors
/// What is wrong with the line.
pub(crate) fn parse_line(line: &str, key_field: &str) -> Result<Option<Point>, String> {
    let line = line.trim_end_matches(['\r', '\n']);
    if line.trim().is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let b = line.as_bytes();
    let (measurement, mut i) = element(b, 0, b", ", b", \\");
    if measurement.is_empty() {
        return Err("no measurement".into());
    }
    let mut tags = Vec::new();
    while i < b.len() && b[i] == b',' {
        let (k, j) = element(b, i + 1, b"=, ", b",= \\");
        if j >= b.len() || b[j] != b'=' || k.is_empty() {
            return Err(format!("tag {k:?} has no value"));
        }
        let (v, j) = element(b, j + 1, b", ", b",= \\");
        tags.push((k, v));
        i = j;
    }
    if i >= b.len() || b[i] != b' ' {
        return Err("no fields".into());
    }
    i += 1;
    let mut key = None;
    let mut fields = 0;
    loop {
        let (k, j) = element(b, i, b"=, ", b",= \\");
        if j >= b.len() || b[j] != b'=' || k.is_empty() {
            return Err(format!("field {k:?} has no value"));
        }
        let mut j = j + 1;
        if b.get(j) == Some(&b'"') {
            // A string: up to the unescaped closing quote.
            let (v, end) = element(b, j + 1, b"\"", b"\"\\");
            if end >= b.len() {
                return Err(format!("field {k:?}: the string is not closed"));
            }
            if k == key_field {
                key = Some(v);
            }
            j = end + 1;
        } else {
            let (v, end) = element(b, j, b", ", b"");
            if v.is_empty() {
                return Err(format!("field {k:?} has no value"));
            }
            j = end;
        }
        fields += 1;
        i = j;
        if i < b.len() && b[i] == b',' {
            i += 1;
            continue;
        }
        break;
    }
    if fields == 0 {
        return Err("no fields".into());
    }
    let rest = line.get(i..).unwrap_or_default().trim();
    let time_ns = if rest.is_empty() {
        None
    } else {
        Some(
            rest.parse::<i64>()
                .map_err(|_| format!("the time {rest:?} is not an integer"))?,
        )
    };
    Ok(Some(Point {
        measurement,
        tags,
        key,
        time_ns,
    }))
}

/// What the subscription took so far, beyond [`ListenCounts`].
#[derive(Debug, Default)]
pub(crate) struct SubscribeCounts {
    /// Write requests received.
    pub(crate) writes: AtomicU64,
    /// Queries the writes triggered.
    pub(crate) queries: AtomicU64,
    /// Keys no triggered query found within the retries (left to the polls).
    pub(crate) unconfirmed: AtomicU64,
    /// Writes to the subscription that InfluxDB could not deliver, as it counts them
    /// (`SHOW STATS FOR 'subscriber'`, `writeFailures`, read once a second).
    pub(crate) delivery_failures: AtomicU64,
}

/// How often the query thread reads what InfluxDB says of the subscription.
const STATS_EVERY: Duration = Duration::from_secs(1);

/// Which points of a write the tap asks for, and by what.
#[derive(Debug, Clone)]
struct Select {
    measurement: String,
    key: String,
    /// The address's `series=` tag.
    series_tag: Option<String>,
}

impl Select {
    /// What a point is asked for by: its `series=` tag where the address has one and the
    /// point carries it, else every tag (its series exactly).
    fn series_of(&self, tags: Vec<(String, String)>) -> Vec<(String, String)> {
        match &self.series_tag {
            Some(t) => match tags.iter().position(|(k, _)| k == t) {
                Some(i) => vec![tags.into_iter().nth(i).unwrap_or_default()],
                None => tags,
            },
            None => tags,
        }
    }
}

/// A point waiting to be asked for.
struct Pending {
    key: String,
    time_ns: i64,
    tags: Vec<(String, String)>,
    /// How many queries asked for it already.
    tries: usize,
    /// When to ask next.
    due: Instant,
}

/// The subscription's running parts: stop them with [`Subscription::stop`].
pub(crate) struct Subscription {
    stop: Arc<AtomicBool>,
    /// The listener's address, to wake its accept at stop.
    wake: SocketAddr,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Subscription {
    /// Takes writes on `listener` (bound by the caller, where the subscription sends);
    /// their points of the measurement `store` polls go to a query thread that asks
    /// `store` for them, and what it finds goes to `out` as answers.
    ///
    /// # Errors
    /// A thread cannot be started.
    pub(crate) fn start(
        listener: TcpListener,
        store: InfluxDb,
        name: String,
        out: Sender<Answer>,
        counts: Arc<ListenCounts>,
        sub: Arc<SubscribeCounts>,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<Vec<Pending>>();
        let (measurement, key) = store.measurement_and_key();
        // With `series=TAG` a point is asked for by that tag alone, as the polls ask: the
        // points of one message (one per metric) then make one condition, not one each.
        let select = Select {
            measurement: measurement.to_owned(),
            key: key.to_owned(),
            series_tag: store.series_tag().map(str::to_owned),
        };
        let wake = listener.local_addr()?;
        let accept = {
            let (stop, counts, sub) = (Arc::clone(&stop), Arc::clone(&counts), Arc::clone(&sub));
            std::thread::Builder::new()
                .name("store-subscription".into())
                .spawn(move || accept_loop(&listener, &stop, &tx, &counts, &sub, &select))?
        };
        let query = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("store-subscription-query".into())
                .spawn(move || query_loop(&store, &name, &rx, &out, &stop, &counts, &sub))?
        };
        Ok(Self {
            stop,
            wake,
            threads: vec![accept, query],
        })
    }

    /// Stops taking writes and asking; waits for both threads.
    pub(crate) fn stop(self) {
        self.stop.store(true, Relaxed);
        // The accept waits for a connection: one of its own ends it.
        let _ = TcpStream::connect_timeout(&self.wake, Duration::from_secs(1));
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn accept_loop(
    listener: &TcpListener,
    stop: &Arc<AtomicBool>,
    tx: &Sender<Vec<Pending>>,
    counts: &Arc<ListenCounts>,
    sub: &Arc<SubscribeCounts>,
    select: &Select,
) {
    let open = Arc::new(AtomicUsize::new(0));
    let mut full_logged = false;
    let error_logged = Arc::new(AtomicBool::new(false));
    loop {
        let accepted = listener.accept();
        if stop.load(Relaxed) {
            return;
        }
        match accepted {
            Ok((mut stream, peer)) => {
                if open.load(Relaxed) >= MAX_CONNECTIONS {
                    counts.errors.fetch_add(1, Relaxed);
                    if !full_logged {
                        full_logged = true;
                        tracing::warn!(
                            "the subscription's writes come over more than {MAX_CONNECTIONS} connections at once: answering further ones 503 (InfluxDB counts those writes as failed; the polls find their points; counted)"
                        );
                    }
                    let _ = stream.write_all(
                        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    continue;
                }
                open.fetch_add(1, Relaxed);
                let conn = (
                    Arc::clone(stop),
                    tx.clone(),
                    Arc::clone(counts),
                    Arc::clone(sub),
                    Arc::clone(&open),
                    select.clone(),
                    Arc::clone(&error_logged),
                );
                let spawned = std::thread::Builder::new()
                    .name("store-subscription-conn".into())
                    .stack_size(CONNECTION_STACK)
                    .spawn(move || {
                        let (stop, tx, counts, sub, open, select, logged) = conn;
                        if let Err(e) = serve(stream, &stop, &tx, &counts, &sub, &select) {
                            counts.errors.fetch_add(1, Relaxed);
                            if !logged.swap(true, Relaxed) {
                                tracing::warn!(
                                    %peer,
                                    "a connection of the subscription: {e} (further ones are counted)"
                                );
                            }
                        }
                        open.fetch_sub(1, Relaxed);
                    });
                if spawned.is_err() {
                    counts.errors.fetch_add(1, Relaxed);
                    open.fetch_sub(1, Relaxed);
                }
            }
            Err(_) => {
                counts.errors.fetch_add(1, Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// What a read brought.
enum Got {
    /// Bytes, appended to the buffer.
    More,
    /// The peer closed the connection.
    Closed,
    /// Nothing came within the read timeout and the tap stops.
    Stopping,
}

/// Reads what comes next into `buf`, waiting through read timeouts until something comes,
/// the peer closes or the tap stops.
fn read_more(
    stream: &mut TcpStream,
    chunk: &mut [u8],
    buf: &mut Vec<u8>,
    stop: &AtomicBool,
) -> Result<Got, String> {
    loop {
        match stream.read(chunk) {
            Ok(0) => return Ok(Got::Closed),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return Ok(Got::More);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                if stop.load(Relaxed) {
                    return Ok(Got::Stopping);
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Serves one connection's write requests until it closes or the tap stops.
fn serve(
    mut stream: TcpStream,
    stop: &AtomicBool,
    tx: &Sender<Vec<Pending>>,
    counts: &ListenCounts,
    sub: &SubscribeCounts,
    select: &Select,
) -> Result<(), String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .map_err(|e| e.to_string())?;
    // A peer that stops reading our answers does not hold the thread for ever.
    stream
        .set_write_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    let mut bad_logged = false;
    loop {
        // The head.
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if buf.len() > 64 << 10 {
                return Err("a request head longer than 64 KiB".into());
            }
            match read_more(&mut stream, &mut chunk, &mut buf, stop)? {
                Got::More => {}
                Got::Closed | Got::Stopping => return Ok(()),
            }
        };
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf[..head_end]) {
            Ok(httparse::Status::Complete(_)) => {}
            _ => {
                let _ = stream.write_all(
                    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
                return Err("not an HTTP request".into());
            }
        }
        let path = req
            .path
            .unwrap_or_default()
            .split('?')
            .next()
            .unwrap_or_default()
            .to_owned();
        let mut length = None;
        let mut close = req.version == Some(0);
        let mut chunked = false;
        for h in req.headers.iter() {
            let v = String::from_utf8_lossy(h.value).trim().to_ascii_lowercase();
            match h.name.to_ascii_lowercase().as_str() {
                "content-length" => length = v.parse::<usize>().ok(),
                "transfer-encoding" => chunked = v.contains("chunked"),
                "connection" => close = v.contains("close"),
                _ => {}
            }
        }
        let method = req.method.unwrap_or_default().to_owned();
        buf.drain(..head_end);
        // A write carries its length (InfluxDB's subscriber sends one); a request without a
        // body (a GET /ping) has none.
        if chunked || (method == "POST" && length.is_none()) || length.is_some_and(|n| n > MAX_BODY)
        {
            let _ = stream.write_all(
                b"HTTP/1.1 411 Length Required\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
            return Err("a request without a Content-Length of at most 64 MiB".into());
        }
        let n = length.unwrap_or(0);
        while buf.len() < n {
            match read_more(&mut stream, &mut chunk, &mut buf, stop)? {
                Got::More => {}
                Got::Closed => return Err("the connection closed within a request body".into()),
                Got::Stopping => return Ok(()),
            }
        }
        let body: Vec<u8> = buf.drain(..n).collect();
        let write = method == "POST" && path == "/write";
        let status: &[u8] = if write || path == "/ping" {
            b"HTTP/1.1 204 No Content\r\n"
        } else {
            b"HTTP/1.1 404 Not Found\r\n"
        };
        let mut resp = status.to_vec();
        resp.extend_from_slice(if close {
            b"Content-Length: 0\r\nConnection: close\r\n\r\n"
        } else {
            b"Content-Length: 0\r\n\r\n"
        });
        stream.write_all(&resp).map_err(|e| e.to_string())?;
        if write {
            sub.writes.fetch_add(1, Relaxed);
            let now = Instant::now();
            let mut points = Vec::new();
            for line in String::from_utf8_lossy(&body).lines() {
                match parse_line(line, &select.key) {
                    Ok(None) => {}
                    Ok(Some(p)) => {
                        if p.measurement != select.measurement {
                            continue;
                        }
                        let (Some(k), Some(t)) = (p.key, p.time_ns) else {
                            continue;
                        };
                        counts.notifications.fetch_add(1, Relaxed);
                        points.push(Pending {
                            key: k,
                            time_ns: t,
                            tags: select.series_of(p.tags),
                            tries: 0,
                            due: now,
                        });
                    }
                    Err(e) => {
                        counts.bad.fetch_add(1, Relaxed);
                        if !bad_logged {
                            bad_logged = true;
                            tracing::warn!(
                                "a line the subscription sent does not parse: {e}: {:?} (further ones are counted)",
                                crate::store::clip(line, 80)
                            );
                        }
                    }
                }
            }
            if !points.is_empty() && tx.send(points).is_err() {
                return Ok(());
            }
        }
        if close {
            return Ok(());
        }
    }
}

/// Asks the store for the points the writes brought, as soon as they come and again for
/// those not found yet; what it finds goes to `out`.
fn query_loop(
    store: &InfluxDb,
    name: &str,
    rx: &Receiver<Vec<Pending>>,
    out: &Sender<Answer>,
    stop: &AtomicBool,
    counts: &ListenCounts,
    sub: &SubscribeCounts,
) {
    let mut pending: Vec<Pending> = Vec::new();
    let mut error_logged = false;
    let mut next_stats = Instant::now() + STATS_EVERY;
    while !stop.load(Relaxed) {
        if Instant::now() >= next_stats {
            next_stats = Instant::now() + STATS_EVERY;
            check_delivery(store, name, sub);
        }
        // Wait for a write, or for the next retry to be due.
        let wait = pending
            .iter()
            .map(|p| p.due.saturating_duration_since(Instant::now()))
            .min()
            .unwrap_or(Duration::from_millis(50))
            .min(Duration::from_millis(50));
        match rx.recv_timeout(wait) {
            Ok(mut points) => pending.append(&mut points),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        // Everything that came meanwhile, at once: one query for all of it.
        while let Ok(mut points) = rx.try_recv() {
            pending.append(&mut points);
        }
        let now = Instant::now();
        let (due, later): (Vec<Pending>, Vec<Pending>) =
            pending.drain(..).partition(|p| p.due <= now);
        pending = later;
        if due.is_empty() {
            continue;
        }
        let from = due.iter().map(|p| p.time_ns).min().unwrap_or(0);
        let to = due.iter().map(|p| p.time_ns).max().unwrap_or(0);
        let mut series: Vec<&[(String, String)]> = due.iter().map(|p| p.tags.as_slice()).collect();
        series.sort_unstable();
        series.dedup();
        let send_ns = realtime_ns();
        let result = store.points(from, to, &series);
        let resp_ns = realtime_ns();
        sub.queries.fetch_add(1, Relaxed);
        let batch = match result {
            Ok(b) => b,
            Err(e) => {
                counts.errors.fetch_add(1, Relaxed);
                if !error_logged {
                    error_logged = true;
                    tracing::warn!(
                        "a query a subscription's write triggered failed: {e} (asking again; the polls go on; failures are counted)"
                    );
                }
                Batch::default()
            }
        };
        // A key is found with any of its points (a message written as several points, of
        // which `where=` may keep one): its earliest row, once.
        let mut found: rustc_hash::FxHashMap<&str, i64> = rustc_hash::FxHashMap::default();
        for r in &batch.rows {
            let t = found.entry(r.key.as_str()).or_insert(r.time_ns);
            *t = (*t).min(r.time_ns);
        }
        let mut rows = Vec::new();
        let mut given_up = rustc_hash::FxHashSet::default();
        for mut p in due {
            if let Some(t) = found.remove(p.key.as_str()) {
                rows.push(Row {
                    key: std::mem::take(&mut p.key),
                    time_ns: t,
                    series: None,
                });
            } else if rows.iter().any(|r: &Row| r.key == p.key) {
                // Another point of a key already found.
            } else if let Some(wait) = RETRIES.get(p.tries) {
                p.tries += 1;
                p.due = Instant::now() + *wait;
                pending.push(p);
            } else {
                given_up.insert(p.key);
            }
        }
        sub.unconfirmed.fetch_add(given_up.len() as u64, Relaxed);
        // Points still waiting whose key was found meanwhile are done.
        if !rows.is_empty() {
            let done: rustc_hash::FxHashSet<&str> = rows.iter().map(|r| r.key.as_str()).collect();
            pending.retain(|p| !done.contains(p.key.as_str()));
        }
        if rows.is_empty() {
            continue;
        }
        let a = Answer {
            poller: NOTIFIER,
            send_ns,
            resp_ns,
            since_ns: None,
            regular_since_ns: None,
            catch_up: false,
            newest_ns: None,
            result: Ok(Batch {
                rows,
                ..Batch::default()
            }),
            own_duration: None,
            epoch: 0,
            resolved: None,
            reconnections: 0,
        };
        if out.send(a).is_err() {
            return;
        }
    }
}

/// Reads what InfluxDB says of the subscription's deliveries and says when they fail.
fn check_delivery(store: &InfluxDb, name: &str, sub: &SubscribeCounts) {
    // Statistics the user may not read (no admin) leave the check out.
    let Ok((_, failures)) = store.subscriber_stats(name) else {
        return;
    };
    let before = sub.delivery_failures.swap(failures, Relaxed);
    if failures > before && before == 0 {
        tracing::warn!(
            "InfluxDB cannot deliver the writes of subscription {name} to the tap ({failures} failed so far, its statistics say): is the tap's subscribe= address reachable from the store? (the polls go on finding rows; failures are counted)"
        );
    }
}

/// Where the subscription sends: the listener's address as InfluxDB is to reach it.
#[must_use]
pub(crate) fn destination(at: SocketAddr) -> String {
    format!("http://{at}")
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::sync::Arc;
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::{Duration, Instant};

    use super::{ListenCounts, Point, SubscribeCounts, Subscription, parse_line};
    use crate::store::StoreUrl;
    use crate::store::influxdb::InfluxDb;

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let until = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < until, "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// What a subscription sends that is not what the tap wants is counted and answered,
    /// and loses nothing else: a request that is not HTTP, a line that does not parse, a
    /// store that cannot be asked (each query counted as failed, the point left to the
    /// polls after its retries).
    #[test]
    fn bad_writes_are_counted() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        // A port nothing listens on: every triggered query fails.
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!(
            "influxdb://127.0.0.1:{}/db?measurement=m&timeout=1s",
            dead.local_addr().unwrap().port()
        );
        drop(dead);
        let store = InfluxDb::new(&StoreUrl::parse(&url).unwrap()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let counts = Arc::new(ListenCounts::default());
        let sub = Arc::new(SubscribeCounts::default());
        let s = Subscription::start(
            listener,
            store,
            "hoptrace_test".into(),
            tx,
            Arc::clone(&counts),
            Arc::clone(&sub),
        )
        .unwrap();

        let mut garbage = std::net::TcpStream::connect(at).unwrap();
        garbage.write_all(b"\x16\x03\x01 not http\r\n\r\n").unwrap();
        let mut answer = String::new();
        let _ = garbage.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");

        let body = "m,topic=a hoptrace=\"ht1.x\",v=1 1700000000000000000\nm,topic=b v=\nother,t=1 hoptrace=\"ht1.y\" 5\nm,t=2 v=2 6\n";
        let mut w = std::net::TcpStream::connect(at).unwrap();
        write!(
            w,
            "POST /write?db=db&rp=autogen HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut head = [0u8; 12];
        w.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"HTTP/1.1 204");
        // A request without a body needs no length; a write without one is refused.
        let mut ping = std::net::TcpStream::connect(at).unwrap();
        ping.write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        ping.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"HTTP/1.1 204");
        let mut unsized_write = std::net::TcpStream::connect(at).unwrap();
        unsized_write
            .write_all(b"POST /write HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        unsized_write.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"HTTP/1.1 411");
        wait_for("the write counted", || sub.writes.load(Relaxed) == 1);
        // One point of the measurement with a key; the line without a field value is bad;
        // another measurement's point and a point without the key are skipped.
        assert_eq!(counts.notifications.load(Relaxed), 1);
        assert_eq!(counts.bad.load(Relaxed), 1);
        wait_for("the point left to the polls", || {
            sub.unconfirmed.load(Relaxed) == 1
        });
        // The garbage connection, the write without a length and seven failed queries (the
        // first and six retries).
        assert_eq!(sub.queries.load(Relaxed), 7);
        wait_for("every error counted", || {
            counts.errors.load(Relaxed) == 2 + 7
        });
        assert!(rx.try_recv().is_err(), "nothing found, nothing reported");
        s.stop();
    }

    #[test]
    fn lines() {
        assert_eq!(
            parse_line(
                r#"nodered,topic=a/b\ c,x=1\,2 hoptrace="ht1.A\"q",v=1.5,n=3i 1700000000000000001"#,
                "hoptrace"
            ),
            Ok(Some(Point {
                measurement: "nodered".into(),
                tags: vec![("topic".into(), "a/b c".into()), ("x".into(), "1,2".into())],
                key: Some("ht1.A\"q".into()),
                time_ns: Some(1_700_000_000_000_000_001),
            }))
        );
        let p = parse_line(r"m\,x v=1 5", "hoptrace").unwrap().unwrap();
        assert_eq!(
            (p.measurement.as_str(), p.key, p.time_ns),
            ("m,x", None, Some(5))
        );
        let p = parse_line(r#"m s="a,b c=d" 7"#, "s").unwrap().unwrap();
        assert_eq!(p.key.as_deref(), Some("a,b c=d"));
        assert_eq!(parse_line("", "k"), Ok(None));
        assert_eq!(parse_line("# c", "k"), Ok(None));
        assert!(parse_line("m", "k").is_err());
        assert!(parse_line("m,t v=1", "k").is_err());
        assert!(parse_line(r#"m k="open 5"#, "k").is_err());
        assert!(parse_line("m v=1 x", "k").is_err());
        assert!(parse_line("m v= 1", "k").is_err());
    }
}
