//! PostgreSQL (and Postgres-wire stores: TimescaleDB, ...) over its wire protocol:
//! `SELECT key::text, <time as Unix µs> FROM t WHERE time >= <since>`, a prepared statement
//! on one connection.
//!
//! Errors are SQLSTATEs: a missing table (`42P01`), column (`42703`), schema (`3F000`) or
//! database (`3D000`) stops the tap at start; others are counted and retried, and a broken
//! connection is opened again at the next poll. The time column should be a `timestamptz`
//! (a `timestamp` is read as UTC); with a default of `clock_timestamp()` it is the store's
//! own time of the insert, µs: the `store_in` stamp (`now()` would be the transaction's
//! start). A row becomes visible at its transaction's commit, which can be later than its
//! time: `overlap` (default 1 s) covers transactions up to that long.
//!
//! PostgreSQL reports no query duration of its own on the wire; the tap's round trip is
//! the query time. With `explain_every=N` the tap also runs, after every N-th successful
//! poll has been stamped and counted, `EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON)` of the
//! same statement with the same bound and reports its execution time as the store's own
//! query duration (a sample: a second execution of the poll's query, right after it, not
//! the poll's own; it costs the store that execution again, and delays no stamp).
//!
//! A table dropped mid-run fails the poll (`42P01`); the connection is opened and the
//! statement prepared again at the next poll, so a table created again is polled again.
//!
//! Every wait on the server is bounded by the address's `timeout=` (default 10 s): the
//! whole connection (TCP, start-up, authentication, preparing the statement; at most 5 s)
//! and every query. A server that accepts and never answers fails the poll with "no
//! answer within ..."; the connection is dropped and opened again at the next poll.
//!
//! `notify=CHANNEL` makes the tap also listen for the rows a trigger notifies
//! ([`listen_target`]; the listener is the tap's, `crate::listen`).

use std::future::Future;
use std::time::Duration;

use tokio_postgres::{Client, NoTls, SimpleQueryMessage, Statement};

use super::{Batch, Opened, Row, Store, StoreError, StoreKind, StoreUrl, UrlError};

/// One connection: its client, the poll's prepared statement, and the task that drives
/// the connection (run by the tap's runtime while a query waits).
struct Conn {
    client: Client,
    stmt: Statement,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// A PostgreSQL table polled over one connection.
pub struct Postgres {
    url: StoreUrl,
    config: tokio_postgres::Config,
    /// The longest a query may wait for the server.
    timeout: Duration,
    /// The longest opening a connection may take.
    connect_timeout: Duration,
    /// The tap's own single-threaded runtime, made at the first connection.
    runtime: Option<tokio::runtime::Runtime>,
    table: String,
    key: String,
    time: String,
    overlap: Duration,
    /// Every how many successful polls the store's own duration is sampled (0: never).
    explain_every: u64,
    answered: u64,
    /// Connections opened (the first, then each after one was lost).
    connections: u64,
    /// The bound of the last answered poll whose own duration is still to be sampled.
    to_sample: Option<i64>,
    /// The address's `where=`.
    filter: Option<String>,
    client: Option<Conn>,
}

/// `"name"` with `"` doubled.
#[must_use]
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `"schema"."table"` or `"table"`.
#[must_use]
pub fn qualified(table: &str) -> String {
    match table.split_once('.') {
        Some((s, t)) => format!("{}.{}", quote_ident(s), quote_ident(t)),
        None => quote_ident(table),
    }
}

/// The row time as Unix microseconds, exactly.
fn micros(time: &str) -> String {
    format!(
        "(extract(epoch from {}) * 1000000)::int8",
        quote_ident(time)
    )
}

/// The poll's statement; `$1` is the bound in Unix microseconds. `filter`: the address's
/// `where=`, an SQL condition every poll adds (the run's rows only, on a table that holds
/// others).
#[must_use]
pub fn poll_query(table: &str, key: &str, time: &str, filter: Option<&str>) -> String {
    format!(
        "SELECT {k}::text, {m} FROM {t} WHERE {c} >= timestamptz 'epoch' + $1::int8 * interval '1 microsecond'{f}",
        k = quote_ident(key),
        m = micros(time),
        t = qualified(table),
        c = quote_ident(time),
        f = filter.map(|f| format!(" AND ({f})")).unwrap_or_default(),
    )
}

/// How the tap connects to the server at `url`, naming itself `application_name`.
fn connection_config(
    url: &StoreUrl,
    application_name: &str,
    connect_timeout: Duration,
) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    config
        .host(&url.host)
        .port(url.port)
        .dbname(&url.path)
        .application_name(application_name)
        .connect_timeout(connect_timeout);
    if let Some(u) = &url.user {
        config.user(u);
    }
    if let Some(p) = &url.password {
        config.password(p);
    }
    config
}

/// The address's `notify=CHANNEL`: how the tap's listener connects (`application_name`
/// `hoptrace-listen`) and the channel it listens on (`None`: the address names none).
///
/// # Errors
/// [`UrlError`] for an empty channel name or a bad `timeout=`.
pub fn listen_target(url: &StoreUrl) -> Result<Option<(tokio_postgres::Config, String)>, UrlError> {
    let Some(channel) = url.param("notify") else {
        return Ok(None);
    };
    if channel.is_empty() {
        return Err(url.error(
            "notify= names the channel a trigger notifies each inserted row on (e.g. notify=hoptrace)".into(),
        ));
    }
    let timeout = url.duration("timeout", Duration::from_secs(10))?;
    let config = connection_config(url, "hoptrace-listen", timeout.min(Duration::from_secs(5)));
    Ok(Some((config, channel.to_owned())))
}

/// The bound of a poll that wants every row (an empty table at start): 2^53 µs before
/// 1970, in 1684. PostgreSQL's `timestamptz` reaches back to 4713 BC, but `'epoch' + n *
/// interval '1 microsecond'` fails with "timestamp out of range" long before `i64::MIN`.
pub const ALL_ROWS_US: i64 = -(1 << 53);

/// The check at start: the newest time (fails on a missing table or column).
#[must_use]
pub fn open_query(table: &str, key: &str, time: &str) -> String {
    format!(
        "SELECT max({m}), count({k}) FROM {t}",
        k = quote_ident(key),
        m = micros(time),
        t = qualified(table),
    )
}

/// The statement that samples the store's own duration of a poll from `since_us`: the
/// poll's statement with its bound written in (an integer), under `EXPLAIN ANALYZE`.
#[must_use]
pub fn explain_query(
    table: &str,
    key: &str,
    time: &str,
    filter: Option<&str>,
    since_us: i64,
) -> String {
    format!(
        "EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) {}",
        poll_query(table, key, time, filter).replace("$1::int8", &format!("({since_us})::int8"))
    )
}

/// The execution time, ns, of an `EXPLAIN (ANALYZE, FORMAT JSON)` answer: the store's own
/// duration of the query, without planning (a poll's prepared statement is planned once).
///
/// # Errors
/// [`StoreError::Answer`] when the answer is not JSON or has no execution time.
pub fn explain_elapsed_ns(answer: &str) -> Result<u64, StoreError> {
    let v: serde_json::Value = serde_json::from_str(answer).map_err(|_| {
        StoreError::Answer(format!(
            "not an EXPLAIN answer: {}",
            super::clip(answer, 200)
        ))
    })?;
    v.get(0)
        .and_then(|top| top.get("Execution Time"))
        .and_then(serde_json::Value::as_f64)
        .map(|ms| (ms * 1e6).round() as u64)
        .ok_or_else(|| {
            StoreError::Answer(format!(
                "an EXPLAIN answer without an execution time: {}",
                super::clip(answer, 200)
            ))
        })
}

/// Sorts an SQLSTATE into a store error: a missing object, a server that cannot take
/// connections yet, or a failed query.
#[must_use]
pub fn classify(sqlstate: &str, message: String) -> StoreError {
    match sqlstate {
        // undefined_table, undefined_column, invalid_schema_name, invalid_catalog_name
        "42P01" | "42703" | "3F000" | "3D000" => StoreError::Missing(message),
        // cannot_connect_now: starting up or shutting down
        "57P03" => StoreError::Unreachable(message),
        _ => StoreError::Query(message),
    }
}

fn error(e: &tokio_postgres::Error) -> StoreError {
    match e.as_db_error() {
        Some(db) => classify(
            db.code().code(),
            format!(
                "{}: {} (SQLSTATE {})",
                db.severity(),
                db.message(),
                db.code().code()
            ),
        ),
        None => StoreError::Unreachable(e.to_string()),
    }
}

impl Postgres {
    /// A tap of `postgres://USER:PASSWORD@HOST:PORT/DATABASE?table=[S.]T&time=C[&key=hoptrace][&explain_every=N]`.
    ///
    /// # Errors
    /// [`UrlError`] for a missing database, table or time column, an `explain_every` that
    /// is not a count, or an unknown parameter.
    pub fn new(url: &StoreUrl) -> Result<Self, UrlError> {
        url.check_params(&["table", "key", "time", "explain_every", "where", "notify"])?;
        let explain_every = match url.param("explain_every") {
            None => 0,
            Some(v) => v.parse::<u64>().map_err(|_| {
                url.error(format!(
                    "explain_every={v:?} is not a count (every how many polls to sample the store's own duration; 0: never)"
                ))
            })?,
        };
        if url.path.is_empty() {
            return Err(url.error("the path names the database: postgres://USER:PASSWORD@HOST:PORT/DATABASE?table=T&time=C".into()));
        }
        let timeout = url.duration("timeout", Duration::from_secs(10))?;
        let connect_timeout = timeout.min(Duration::from_secs(5));
        let config = connection_config(url, "hoptrace-tap", connect_timeout);
        Ok(Self {
            url: url.clone(),
            config,
            timeout,
            connect_timeout,
            runtime: None,
            table: url.required("table", "table")?.to_owned(),
            key: url.param("key").unwrap_or("hoptrace").to_owned(),
            time: url.required("time", "time column")?.to_owned(),
            overlap: url.duration("overlap", Duration::from_secs(1))?,
            explain_every,
            answered: 0,
            connections: 0,
            to_sample: None,
            filter: url.condition()?,
            client: None,
        })
    }

    /// The server's address, for messages.
    fn at(&self) -> String {
        format!("PostgreSQL {}:{}", self.url.host, self.url.port)
    }

    /// Runs `f` on the tap's runtime for at most `limit`; a server that does not answer
    /// in time is [`StoreError::Unreachable`], naming `what` and the limit.
    fn within<T>(
        runtime: &tokio::runtime::Runtime,
        at: &str,
        what: &str,
        limit: Duration,
        f: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, StoreError> {
        match runtime.block_on(async { tokio::time::timeout(limit, f).await }) {
            Ok(r) => r.map_err(|e| error(&e)),
            Err(_) => Err(StoreError::Unreachable(format!(
                "{at}: no answer within {limit:?} ({what}; the address's timeout=): the server is silent, overloaded or not PostgreSQL"
            ))),
        }
    }

    fn client(&mut self) -> Result<&mut Conn, StoreError> {
        if self.client.as_ref().is_some_and(|c| c.client.is_closed()) {
            self.client = None;
        }
        if self.runtime.is_none() {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| StoreError::Unreachable(format!("starting the tap's runtime: {e}")))?;
            self.runtime = Some(rt);
        }
        if self.client.is_none() {
            let at = self.at();
            let config = self.config.clone();
            let sql = poll_query(&self.table, &self.key, &self.time, self.filter.as_deref());
            let rt = self.runtime.as_ref().expect("made above");
            let conn = Self::within(rt, &at, "connecting", self.connect_timeout, async {
                let (client, connection) = config.connect(NoTls).await?;
                let driver = tokio::spawn(async move {
                    let _ = connection.await;
                });
                let conn = async {
                    client.batch_execute("SET TIME ZONE 'UTC'").await?;
                    client.prepare(&sql).await
                };
                match conn.await {
                    Ok(stmt) => Ok(Conn {
                        client,
                        stmt,
                        driver,
                    }),
                    Err(e) => {
                        driver.abort();
                        Err(e)
                    }
                }
            })
            .map_err(|e| match e {
                StoreError::Unreachable(m) if !m.starts_with(&at) => {
                    StoreError::Unreachable(format!("{at}: {m}"))
                }
                other => other,
            })?;
            self.client = Some(conn);
            self.connections += 1;
        }
        Ok(self.client.as_mut().expect("connected above"))
    }
}

impl Store for Postgres {
    fn kind(&self) -> StoreKind {
        StoreKind::Postgres
    }

    fn reconnections(&self) -> u64 {
        self.connections.saturating_sub(1)
    }

    fn describe(&self) -> String {
        format!(
            "PostgreSQL {}:{} database {}, table {}, key column {}, time column {}{}",
            self.url.host,
            self.url.port,
            self.url.path,
            self.table,
            self.key,
            self.time,
            if self.explain_every > 0 {
                format!(
                    ", the store's own duration sampled by EXPLAIN ANALYZE every {} polls",
                    self.explain_every
                )
            } else {
                String::new()
            }
        )
    }

    fn query_shape(&self) -> String {
        format!(
            "{} with $1 = <newest seen - {:?}>",
            poll_query(&self.table, &self.key, &self.time, self.filter.as_deref()),
            self.overlap
        )
    }

    fn open(&mut self) -> Result<Opened, StoreError> {
        let sql = open_query(&self.table, &self.key, &self.time);
        let where_ = format!(
            "PostgreSQL {}:{} database {}",
            self.url.host, self.url.port, self.url.path
        );
        self.client().map_err(|e| match e {
            StoreError::Missing(m) => {
                StoreError::Missing(format!("{where_}: {m} (check table=, key= and time=)"))
            }
            other => other,
        })?;
        let (at, timeout) = (self.at(), self.timeout);
        let (Some(rt), Some(c)) = (self.runtime.as_ref(), self.client.as_ref()) else {
            unreachable!("connected above");
        };
        let row = Self::within(
            rt,
            &at,
            "the first query",
            timeout,
            c.client.query_one(&sql, &[]),
        )
        .map_err(|e| match e {
            StoreError::Missing(m) => StoreError::Missing(format!("{where_}: {m}")),
            other => other,
        });
        if matches!(row, Err(StoreError::Unreachable(_))) {
            self.client = None;
        }
        let row = row?;
        let newest: Option<i64> = row
            .try_get(0)
            .map_err(|e| StoreError::Answer(format!("the time column is not a timestamp: {e}")))?;
        Ok(Opened {
            newest_ns: newest.map(|us| us.saturating_mul(1000)),
            notice: None,
        })
    }

    fn poll(&mut self, since_ns: Option<i64>) -> Result<Batch, StoreError> {
        let since_us = since_ns.map_or(ALL_ROWS_US, |n| n.div_euclid(1000));
        self.client()?;
        let (at, timeout) = (self.at(), self.timeout);
        let (Some(rt), Some(c)) = (self.runtime.as_ref(), self.client.as_ref()) else {
            unreachable!("connected above");
        };
        let answer = Self::within(
            rt,
            &at,
            "a poll",
            timeout,
            c.client.query(&c.stmt, &[&since_us]),
        );
        let rows = match answer {
            Ok(r) => r,
            Err(err) => {
                // A closed or silent connection, or a table dropped under the prepared
                // statement: connect and prepare again at the next poll.
                if c.client.is_closed()
                    || matches!(err, StoreError::Missing(_) | StoreError::Unreachable(_))
                {
                    self.client = None;
                }
                return Err(err);
            }
        };
        self.answered += 1;
        if self.explain_every > 0 && self.answered.is_multiple_of(self.explain_every) {
            self.to_sample = Some(since_us);
        }
        let mut batch = Batch::default();
        for r in rows {
            let key: Option<String> = r
                .try_get(0)
                .map_err(|e| StoreError::Answer(e.to_string()))?;
            let us: Option<i64> = r
                .try_get(1)
                .map_err(|e| StoreError::Answer(e.to_string()))?;
            match (key, us) {
                (Some(k), Some(us)) if !k.is_empty() => batch.rows.push(Row {
                    key: k,
                    time_ns: us.saturating_mul(1000),
                    series: None,
                }),
                _ => batch.untraced += 1,
            }
        }
        Ok(batch)
    }

    fn sample_own_duration(&mut self) -> Result<Option<u64>, StoreError> {
        let Some(since_us) = self.to_sample.take() else {
            return Ok(None);
        };
        let sql = explain_query(
            &self.table,
            &self.key,
            &self.time,
            self.filter.as_deref(),
            since_us,
        );
        self.client()?;
        let (at, timeout) = (self.at(), self.timeout);
        let (Some(rt), Some(c)) = (self.runtime.as_ref(), self.client.as_ref()) else {
            unreachable!("connected above");
        };
        let answer = Self::within(rt, &at, "EXPLAIN", timeout, c.client.simple_query(&sql));
        if matches!(answer, Err(StoreError::Unreachable(_))) {
            self.client = None;
        }
        let text = answer?
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                _ => None,
            })
            .ok_or_else(|| StoreError::Answer("EXPLAIN returned no row".into()))?;
        explain_elapsed_ns(&text).map(Some)
    }

    fn time_resolution_ns(&self) -> u64 {
        1000
    }

    fn overlap(&self) -> Duration {
        self.overlap
    }
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_quote_every_name() {
        assert_eq!(
            poll_query("public.t", "key", "at", None),
            r#"SELECT "key"::text, (extract(epoch from "at") * 1000000)::int8 FROM "public"."t" WHERE "at" >= timestamptz 'epoch' + $1::int8 * interval '1 microsecond'"#
        );
        assert_eq!(qualified(r#"we"ird"#), r#""we""ird""#);
        assert_eq!(
            open_query("t", "hoptrace", "at"),
            r#"SELECT max((extract(epoch from "at") * 1000000)::int8), count("hoptrace") FROM "t""#
        );
    }

    #[test]
    fn explain_answers() {
        assert_eq!(
            explain_query("t", "hoptrace", "at", None, -5),
            r#"EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) SELECT "hoptrace"::text, (extract(epoch from "at") * 1000000)::int8 FROM "t" WHERE "at" >= timestamptz 'epoch' + (-5)::int8 * interval '1 microsecond'"#
        );
        let answer = r#"[{"Plan": {"Node Type": "Seq Scan"}, "Planning Time": 0.071, "Triggers": [], "Execution Time": 0.024}]"#;
        assert_eq!(explain_elapsed_ns(answer).unwrap(), 24_000);
        assert!(explain_elapsed_ns(r#"[{"Plan": {}}]"#).is_err());
        assert!(explain_elapsed_ns("nope").is_err());
        let u = StoreUrl::parse("postgres://u@h/db?table=t&time=at&explain_every=x").unwrap();
        assert!(
            Postgres::new(&u)
                .unwrap_err()
                .reason
                .contains("explain_every")
        );
        let u = StoreUrl::parse("postgres://u@h/db?table=t&time=at&explain_every=10").unwrap();
        assert!(
            Postgres::new(&u)
                .unwrap()
                .describe()
                .contains("every 10 polls")
        );
    }

    #[test]
    fn sqlstates() {
        assert!(matches!(
            classify("42P01", "x".into()),
            StoreError::Missing(_)
        ));
        assert!(matches!(
            classify("42703", "x".into()),
            StoreError::Missing(_)
        ));
        assert!(matches!(
            classify("57P01", "admin shutdown".into()),
            StoreError::Query(_)
        ));
        assert!(matches!(
            classify("57P03", "the database system is starting up".into()),
            StoreError::Unreachable(_)
        ));
    }

    #[test]
    fn addresses() {
        let u = StoreUrl::parse("postgres://u:p@127.0.0.1:15432/db?table=t").unwrap();
        assert!(Postgres::new(&u).unwrap_err().reason.contains("time="));
        let u = StoreUrl::parse("postgres://u:p@127.0.0.1:15432/?table=t&time=at").unwrap();
        assert!(Postgres::new(&u).is_err());
        let u = StoreUrl::parse("postgres://u:p@127.0.0.1:15432/db?table=t&time=at").unwrap();
        let p = Postgres::new(&u).unwrap();
        assert!(!p.describe().contains(":p@"));
    }
}
