//! Store addresses and the one trait every store implements.
//!
//! A store tap's address names the store, where the rows are and which column holds the
//! trace context:
//!
//! | store | address |
//! | --- | --- |
//! | InfluxDB 1.x | `influxdb://HOST:PORT/DATABASE?measurement=M[&key=hoptrace][&rp=RP]` |
//! | PostgreSQL | `postgres://USER:PASSWORD@HOST:PORT/DATABASE?table=[SCHEMA.]T&time=COLUMN[&key=hoptrace]` |
//! | ClickHouse | `clickhouse://HOST:PORT/DATABASE?table=T[&time=inserted][&key=hoptrace][&user=U&password=P]` |
//! | VictoriaMetrics | `victoriametrics://HOST:PORT/?metric=M[&label=hoptrace][&lookback=30s]` |
//!
//! Every address also takes `overlap=` (how far before the newest row time seen each poll
//! looks again, for rows that become visible after newer ones; default per store) and
//! `timeout=` (one request, default 10s), and `where=` (a condition of the store's own
//! language that every poll adds, to poll only the run's series on a store that holds
//! others: InfluxQL, SQL, or label matchers on VictoriaMetrics). InfluxDB also takes
//! `series=TAG=~/REGEX/`: the tag values matching it are resolved every 0.1–1 s and each
//! poll asks for those series by value (an index lookup whose cost does not grow with
//! the measurement's other series, where a regular expression scans them all). Names are quoted in every
//! query (InfluxQL reserves `key`, for one).

pub mod clickhouse;
pub mod influxdb;
pub mod postgres;
pub mod victoriametrics;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// The stores a tap can poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// InfluxDB 1.x over HTTP (`/query`, InfluxQL).
    InfluxDb,
    /// PostgreSQL (and Postgres-wire stores such as TimescaleDB) over its wire protocol.
    Postgres,
    /// ClickHouse over HTTP.
    ClickHouse,
    /// VictoriaMetrics over HTTP (`/api/v1/export`).
    VictoriaMetrics,
}

impl StoreKind {
    /// Every kind, in the order the documentation lists them.
    pub const ALL: [Self; 4] = [
        Self::InfluxDb,
        Self::Postgres,
        Self::ClickHouse,
        Self::VictoriaMetrics,
    ];

    /// The URL scheme.
    #[must_use]
    pub fn scheme(self) -> &'static str {
        match self {
            Self::InfluxDb => "influxdb",
            Self::Postgres => "postgres",
            Self::ClickHouse => "clickhouse",
            Self::VictoriaMetrics => "victoriametrics",
        }
    }

    /// The kind of a URL scheme (`postgresql` too), or `None`.
    #[must_use]
    pub fn from_scheme(s: &str) -> Option<Self> {
        Some(match s {
            "influxdb" | "influx" => Self::InfluxDb,
            "postgres" | "postgresql" => Self::Postgres,
            "clickhouse" => Self::ClickHouse,
            "victoriametrics" | "vm" => Self::VictoriaMetrics,
            _ => return None,
        })
    }

    /// Whether the store's row time is reported as `store_in` unless told otherwise: yes
    /// where the store normally assigns it at a useful resolution (InfluxDB's point time
    /// when the writer sets none, a PostgreSQL column default); no for ClickHouse 18's
    /// one-second `DateTime` and VictoriaMetrics, whose samples usually carry the writer's
    /// time.
    #[must_use]
    pub fn store_in_by_default(self) -> bool {
        matches!(self, Self::InfluxDb | Self::Postgres)
    }
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.scheme())
    }
}

/// Whether `s` looks like a store address (one of the store schemes).
#[must_use]
pub fn is_store_url(s: &str) -> bool {
    s.split_once("://")
        .is_some_and(|(scheme, _)| StoreKind::from_scheme(scheme).is_some())
}

/// A parsed store address.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreUrl {
    /// Which store.
    pub kind: StoreKind,
    /// User name, if any.
    pub user: Option<String>,
    /// Password, if any (never printed).
    pub password: Option<String>,
    /// Host name or address.
    pub host: String,
    /// Port.
    pub port: u16,
    /// The path without its leading `/` (the database), possibly empty.
    pub path: String,
    /// Query parameters, percent-decoded.
    pub params: BTreeMap<String, String>,
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display())
    }
}

/// Why a store address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("store address {url:?}: {reason}")]
pub struct UrlError {
    /// The address (without password).
    pub url: String,
    /// What is wrong and how to fix it.
    pub reason: String,
}

fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = s
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("bad percent escape in {s:?}"))?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8 once decoded"))
}

impl StoreUrl {
    /// Parses `scheme://[user[:password]@]host[:port]/path?k=v&...`.
    ///
    /// # Errors
    /// [`UrlError`] naming what is wrong.
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        let err = |reason: String| UrlError {
            url: redact(url),
            reason,
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| err("expected scheme://host:port/...".into()))?;
        let kind = StoreKind::from_scheme(scheme).ok_or_else(|| {
            err(format!(
                "unknown store {scheme:?}: influxdb, postgres, clickhouse or victoriametrics"
            ))
        })?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(u) => match u.split_once(':') {
                Some((a, b)) => (
                    Some(percent_decode(a).map_err(err)?),
                    Some(percent_decode(b).map_err(err)?),
                ),
                None => (Some(percent_decode(u).map_err(err)?), None),
            },
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(':') => (
                h,
                Some(
                    p.parse::<u16>()
                        .map_err(|_| err(format!("port {p:?} is not a number")))?,
                ),
            ),
            _ => (hostport, None),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(err("no host".into()));
        }
        let port = port.unwrap_or(match kind {
            StoreKind::InfluxDb => 8086,
            StoreKind::Postgres => 5432,
            StoreKind::ClickHouse => 8123,
            StoreKind::VictoriaMetrics => 8428,
        });
        let mut params = BTreeMap::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            params.insert(
                percent_decode(k).map_err(err)?,
                percent_decode(v).map_err(err)?,
            );
        }
        Ok(Self {
            kind,
            user,
            password,
            host: host.to_owned(),
            port,
            path: percent_decode(path.trim_end_matches('/')).map_err(err)?,
            params,
        })
    }

    /// The address without its password.
    #[must_use]
    pub fn display(&self) -> String {
        let user = match (&self.user, &self.password) {
            (Some(u), Some(_)) => format!("{u}:***@"),
            (Some(u), None) => format!("{u}@"),
            _ => String::new(),
        };
        let q: Vec<String> = self
            .params
            .iter()
            .map(|(k, v)| {
                if k == "password" {
                    format!("{k}=***")
                } else {
                    format!("{k}={v}")
                }
            })
            .collect();
        format!(
            "{}://{user}{}:{}/{}{}{}",
            self.kind,
            self.host,
            self.port,
            self.path,
            if q.is_empty() { "" } else { "?" },
            q.join("&")
        )
    }

    /// A parameter, if given.
    #[must_use]
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }

    /// A required parameter.
    ///
    /// # Errors
    /// [`UrlError`] saying which parameter to add.
    pub fn required(&self, name: &str, what: &str) -> Result<&str, UrlError> {
        self.param(name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| self.error(format!("add {name}=<{what}>")))
    }

    /// A duration parameter (`250ms`, `1s`, `2m`), or `default`.
    ///
    /// # Errors
    /// [`UrlError`] when the value does not parse.
    pub fn duration(&self, name: &str, default: Duration) -> Result<Duration, UrlError> {
        match self.param(name) {
            None => Ok(default),
            Some(v) => parse_duration(v).ok_or_else(|| {
                self.error(format!(
                    "{name}={v:?} is not a duration (e.g. 250ms, 1s, 2m)"
                ))
            }),
        }
    }

    /// An error about this address.
    #[must_use]
    pub fn error(&self, reason: String) -> UrlError {
        UrlError {
            url: self.display(),
            reason,
        }
    }

    /// Whether the host is this machine (a loopback address or `localhost`).
    #[must_use]
    pub fn is_loopback(&self) -> bool {
        self.host == "localhost"
            || self
                .host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|a| a.is_loopback())
    }

    /// Rejects parameters not in `known` (a typo would otherwise be ignored silently).
    ///
    /// # Errors
    /// [`UrlError`] naming the unknown parameter and the known ones.
    pub fn check_params(&self, known: &[&str]) -> Result<(), UrlError> {
        for k in self.params.keys() {
            if !known.contains(&k.as_str()) && !COMMON_PARAMS.contains(&k.as_str()) {
                return Err(self.error(format!(
                    "unknown parameter {k:?}; this store takes {}",
                    known
                        .iter()
                        .chain(COMMON_PARAMS)
                        .copied()
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        Ok(())
    }
}

/// Parameters every store address takes.
const COMMON_PARAMS: &[&str] = &["overlap", "timeout"];

impl StoreUrl {
    /// The address's `where=`: a condition in the store's own query language that every
    /// poll adds (`AND (...)`), to poll only the run's series on a store that holds
    /// others, so that a poll's cost does not grow with what the store held before the
    /// run. One condition, no `;`.
    ///
    /// # Errors
    /// [`UrlError`] for an empty condition or one with `;`.
    pub fn condition(&self) -> Result<Option<String>, UrlError> {
        match self.param("where") {
            None => Ok(None),
            Some(w) if w.trim().is_empty() || w.contains(';') => Err(self.error(format!(
                "where={w:?}: one condition of the store's query language, without `;` (e.g. where=\"topic\" =~ /^plant\\//)"
            ))),
            Some(w) => Ok(Some(w.trim().to_owned())),
        }
    }
}

fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            match userinfo.split_once(':') {
                Some((u, _)) => format!("{}{u}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// Parses `250ms`, `1.5s`, `2m`, `100us`, `0`.
#[must_use]
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (n, unit) = s.split_at(split);
    let n: f64 = n.parse().ok()?;
    let secs = match unit {
        "ns" => n / 1e9,
        "us" | "µs" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

/// One row a poll returned: the trace context's text form and the row's time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The value of the key column or label, as stored (expected: `ht1.…`).
    pub key: String,
    /// The row's time, ns since the Unix epoch, in the store's resolution.
    pub time_ns: i64,
    /// Which of the resolved series ([`Store::set_series`]) the row is in, by index;
    /// `None` where the store polls no resolved series.
    pub series: Option<u32>,
}

/// What one poll returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// The rows with a key, in the store's order.
    pub rows: Vec<Row>,
    /// Rows whose key column was empty or null (data of untraced messages).
    pub untraced: u64,
    /// The query's duration as the store reported it (ClickHouse), ns.
    pub server_elapsed_ns: Option<u64>,
}

/// What a store said when the tap opened it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Opened {
    /// The newest row time present, ns (`None`: no rows yet).
    pub newest_ns: Option<i64>,
    /// Something the user should know (e.g. the measurement does not exist yet).
    pub notice: Option<String>,
}

/// Why a store request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The address cannot be used: fix it.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// The store cannot be reached (down, restarting, wrong port); retried with backoff.
    #[error("store unreachable: {0}")]
    Unreachable(String),
    /// The table, measurement, database or column does not exist.
    #[error("{0}")]
    Missing(String),
    /// The store answered with an error (a failed query, an overloaded server).
    #[error("query failed: {0}")]
    Query(String),
    /// The answer did not parse.
    #[error("unexpected answer: {0}")]
    Answer(String),
}

/// A store a tap polls.
pub trait Store: Send {
    /// Which store.
    fn kind(&self) -> StoreKind;

    /// The address without credentials, plus what is polled.
    fn describe(&self) -> String;

    /// The query a poll sends (for the summary and the logs), with `<since>` in place of
    /// the time bound.
    fn query_shape(&self) -> String;

    /// Checks that what is to be polled exists and returns the newest row time present.
    ///
    /// # Errors
    /// [`StoreError::Missing`] for a missing database, table or column (the tap does not
    /// start), [`StoreError::Unreachable`], [`StoreError::Query`].
    fn open(&mut self) -> Result<Opened, StoreError>;

    /// Rows whose time is at or after `since_ns` (all rows when `None`).
    ///
    /// # Errors
    /// Any [`StoreError`]; the poll loop counts it and retries.
    fn poll(&mut self, since_ns: Option<i64>) -> Result<Batch, StoreError>;

    /// The series the address's `series=` selects as they are now (InfluxDB: the values
    /// of a tag that match a pattern), to restrict later polls to them; `None`: the store
    /// polls no resolved series. Called at start, then every 100 ms while new ones appear, backing off
    /// to once a second.
    ///
    /// # Errors
    /// Any [`StoreError`]; the poll loop counts it and goes on with the series it had.
    fn resolve_series(&mut self) -> Result<Option<Vec<String>>, StoreError> {
        Ok(None)
    }

    /// Restricts every later poll to `series` (a list that only grows: a row's
    /// [`Row::series`] indexes it).
    fn set_series(&mut self, series: std::sync::Arc<[String]>) {
        let _ = series;
    }

    /// The store's own duration of the last poll's query, where the store reports it only
    /// when asked separately (PostgreSQL's `EXPLAIN ANALYZE`, on sampled polls); called
    /// after each answered poll has been stamped, so asking delays no stamp. `None`: not
    /// sampled this time (stores that report it in the answer set
    /// [`Batch::server_elapsed_ns`] instead).
    ///
    /// # Errors
    /// Any [`StoreError`]; the poll loop logs it and goes on.
    fn sample_own_duration(&mut self) -> Result<Option<u64>, StoreError> {
        Ok(None)
    }

    /// The resolution of the row times, ns (1 for InfluxDB, 1000 for PostgreSQL, 10^6
    /// for VictoriaMetrics, 10^9 for ClickHouse's `DateTime`).
    fn time_resolution_ns(&self) -> u64;

    /// Where each poll starts, given the newest row time seen and now: `overlap` and
    /// `further_ns` more before the newest time by default; VictoriaMetrics looks back
    /// from now.
    fn since(&self, newest_ns: Option<i64>, now_ns: i64, further_ns: i64) -> Option<i64> {
        let _ = now_ns;
        newest_ns.map(|n| {
            n.saturating_sub(duration_ns(self.overlap()))
                .saturating_sub(further_ns)
        })
    }

    /// How far before the newest row time a poll looks again.
    fn overlap(&self) -> Duration;

    /// Connections to the store found lost and opened again so far (PostgreSQL; the HTTP
    /// stores' client opens a lost connection again within the request and says nothing,
    /// so 0 for them).
    fn reconnections(&self) -> u64 {
        0
    }
}

/// Opens the store at `url` (no request is made yet).
///
/// # Errors
/// [`UrlError`] for a bad or incomplete address.
pub fn connect(url: &StoreUrl) -> Result<Box<dyn Store>, UrlError> {
    Ok(match url.kind {
        StoreKind::InfluxDb => Box::new(influxdb::InfluxDb::new(url)?),
        StoreKind::Postgres => Box::new(postgres::Postgres::new(url)?),
        StoreKind::ClickHouse => Box::new(clickhouse::ClickHouse::new(url)?),
        StoreKind::VictoriaMetrics => Box::new(victoriametrics::VictoriaMetrics::new(url)?),
    })
}

pub(crate) fn duration_ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// A blocking HTTP client on one keep-alive connection, for the HTTP stores.
#[derive(Debug)]
pub(crate) struct Http {
    agent: ureq::Agent,
    base: String,
    /// The longest a request may take (`timeout=`), connecting included.
    timeout: Duration,
}

/// An HTTP answer: status, the headers a store needs, body.
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Answers larger than this are refused (a poll that returns this much is misconfigured).
const MAX_BODY: u64 = 256 << 20;

impl Http {
    pub(crate) fn new(url: &StoreUrl) -> Result<Self, UrlError> {
        let timeout = url.duration("timeout", Duration::from_secs(10))?;
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(timeout.min(Duration::from_secs(2)))
            .timeout(timeout)
            .no_delay(true)
            .max_idle_connections_per_host(1)
            .redirects(0)
            .build();
        let host = if url.host.contains(':') {
            format!("[{}]", url.host)
        } else {
            url.host.clone()
        };
        Ok(Self {
            agent,
            base: format!("http://{host}:{}", url.port),
            timeout,
        })
    }

    /// A transport failure in one line, each cause once: where (the address and path,
    /// never the query, which can hold a password), what, and for a store that did not
    /// answer in time, the `timeout=` that ran out.
    fn transport(&self, t: &ureq::Transport) -> StoreError {
        let at = t.url().map_or_else(
            || self.base.clone(),
            |u| format!("{}{}", self.base, u.path()),
        );
        let mut cause: Option<String> = t.message().map(str::to_owned);
        let mut timed_out = false;
        let mut next: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(t);
        while let Some(e) = next {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                timed_out |= matches!(
                    io.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                );
            }
            cause = Some(e.to_string());
            next = e.source();
        }
        let kind = t.kind().to_string();
        let what = match cause {
            _ if timed_out => format!(
                "no answer within {:?} (the address's timeout=): the store is silent, overloaded or not what the address names",
                self.timeout
            ),
            Some(c) if c.contains(&kind) => c,
            Some(c) => format!("{kind}: {c}"),
            None => kind,
        };
        StoreError::Unreachable(format!("{at}: {what}"))
    }

    fn finish(
        &self,
        r: Result<ureq::Response, ureq::Error>,
        keep: &[&str],
    ) -> Result<Answer, StoreError> {
        let resp = match r {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(ureq::Error::Transport(t)) => return Err(self.transport(&t)),
        };
        let status = resp.status();
        let headers = keep
            .iter()
            .filter_map(|k| resp.header(k).map(|v| ((*k).to_owned(), v.to_owned())))
            .collect();
        let mut body = String::new();
        std::io::Read::read_to_string(
            &mut std::io::Read::take(resp.into_reader(), MAX_BODY),
            &mut body,
        )
        .map_err(|e| {
            StoreError::Unreachable(
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                ) {
                    format!(
                        "{}: the answer stopped coming within {:?} (the address's timeout=)",
                        self.base, self.timeout
                    )
                } else {
                    format!("{}: reading the answer: {e}", self.base)
                },
            )
        })?;
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// `GET base+path?query`.
    pub(crate) fn get(
        &self,
        path: &str,
        query: &[(&str, &str)],
        keep: &[&str],
    ) -> Result<Answer, StoreError> {
        let mut req = self.agent.get(&format!("{}{path}", self.base));
        for (k, v) in query {
            req = req.query(k, v);
        }
        self.finish(req.call(), keep)
    }

    /// `POST base+path?query` with `body`.
    pub(crate) fn post(
        &self,
        path: &str,
        query: &[(&str, &str)],
        body: &str,
        keep: &[&str],
    ) -> Result<Answer, StoreError> {
        let mut req = self.agent.post(&format!("{}{path}", self.base));
        for (k, v) in query {
            req = req.query(k, v);
        }
        self.finish(req.send_string(body), keep)
    }
}

/// The first `n` characters of `s` (for error messages).
pub(crate) fn clip(s: &str, n: usize) -> String {
    let s = s.trim();
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses() {
        let u = StoreUrl::parse(
            "postgres://hoptrace:hoptrace%2Dtest@127.0.0.1:15432/hoptrace?table=public.t&time=at",
        )
        .unwrap();
        assert_eq!(u.kind, StoreKind::Postgres);
        assert_eq!(u.user.as_deref(), Some("hoptrace"));
        assert_eq!(u.password.as_deref(), Some("hoptrace-test"));
        assert_eq!((u.host.as_str(), u.port), ("127.0.0.1", 15432));
        assert_eq!(u.path, "hoptrace");
        assert_eq!(u.param("table"), Some("public.t"));
        assert!(!u.display().contains("hoptrace-test"), "{}", u.display());
        assert!(u.is_loopback());

        let u = StoreUrl::parse("influxdb://db.example:8086/hoptrace?measurement=nodered").unwrap();
        assert_eq!(u.kind, StoreKind::InfluxDb);
        assert!(!u.is_loopback());
        assert_eq!(
            StoreUrl::parse("victoriametrics://[::1]/?metric=m")
                .unwrap()
                .port,
            8428
        );
        assert!(StoreUrl::parse("redis://x/").is_err());
        assert!(StoreUrl::parse("influxdb://:1/").is_err());
        assert!(StoreUrl::parse("influxdb://h:x/").is_err());
        let e = StoreUrl::parse("postgres://u:secret@h:x/").unwrap_err();
        assert!(!e.to_string().contains("secret"), "{e}");
        assert!(is_store_url(
            "clickhouse://127.0.0.1:18123/hoptrace?table=t"
        ));
        assert!(!is_store_url("mqtt://127.0.0.1:11883"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("5"), None);
        assert_eq!(parse_duration("x"), None);
    }

    #[test]
    fn unknown_parameters_are_refused() {
        let u = StoreUrl::parse("influxdb://h/db?measurment=m").unwrap();
        let e = u.check_params(&["measurement", "key"]).unwrap_err();
        assert!(e.reason.contains("measurment"), "{e}");
        assert!(connect(&u).is_err());
    }
}
