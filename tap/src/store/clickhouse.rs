//! ClickHouse over HTTP: `SELECT key, toUnixTimestamp(time) FROM db.t WHERE time >=
//! toDateTime(<since s>) [AND (<where=>)] FORMAT JSONCompact`.
//!
//! ClickHouse answers errors with a non-2xx status and a text body (`Code: 60,
//! e.displayText() = DB::Exception: Table hoptrace.x doesn't exist.`). ClickHouse 18.16 has
//! no sub-second `DateTime`, so the time column has one-second resolution: each poll reads
//! the newest second again (`>=`) and the poll loop drops the keys it already reported. The
//! query's duration as the server measured it comes from the `X-ClickHouse-Summary` header
//! (`elapsed_ns`, newer servers) or the answer's `statistics.elapsed` (18.16).

use std::time::Duration;

use serde_json::Value;

use super::{Batch, Http, Opened, Row, Store, StoreError, StoreKind, StoreUrl, UrlError, clip};

/// A ClickHouse table polled over HTTP.
pub struct ClickHouse {
    http: Http,
    url: StoreUrl,
    table: String,
    key: String,
    time: String,
    auth: Vec<(String, String)>,
    overlap: Duration,
    /// The address's `where=`.
    filter: Option<String>,
}

/// `` `name` `` with `` ` `` and `\` escaped.
#[must_use]
pub fn quote_ident(name: &str) -> String {
    let mut s = String::with_capacity(name.len() + 2);
    s.push('`');
    for c in name.chars() {
        if c == '`' || c == '\\' {
            s.push('\\');
        }
        s.push(c);
    }
    s.push('`');
    s
}

/// `` `db`.`table` `` (a `table` that already names its database is split at its dot).
#[must_use]
pub fn qualified(database: &str, table: &str) -> String {
    match table.split_once('.') {
        Some((d, t)) => format!("{}.{}", quote_ident(d), quote_ident(t)),
        None => format!("{}.{}", quote_ident(database), quote_ident(table)),
    }
}

/// The poll's statement.
#[must_use]
pub fn poll_query(
    table: &str,
    key: &str,
    time: &str,
    since_ns: Option<i64>,
    filter: Option<&str>,
) -> String {
    let mut q = format!(
        "SELECT {k}, toUnixTimestamp({t}) FROM {table}",
        k = quote_ident(key),
        t = quote_ident(time)
    );
    let mut conditions = Vec::new();
    if let Some(s) = since_ns {
        conditions.push(format!(
            "{} >= toDateTime({})",
            quote_ident(time),
            s.div_euclid(1_000_000_000)
        ));
    }
    if let Some(f) = filter {
        conditions.push(format!("({f})"));
    }
    if !conditions.is_empty() {
        q.push_str(" WHERE ");
        q.push_str(&conditions.join(" AND "));
    }
    q.push_str(" FORMAT JSONCompact");
    q
}

/// The check at start: the newest time and the row count of the rows polled (fails on a
/// missing column).
#[must_use]
pub fn open_query(table: &str, key: &str, time: &str, filter: Option<&str>) -> String {
    format!(
        "SELECT max(toUnixTimestamp({t})), count({k}) FROM {table}{w} FORMAT JSONCompact",
        k = quote_ident(key),
        t = quote_ident(time),
        w = filter.map(|f| format!(" WHERE ({f})")).unwrap_or_default()
    )
}

/// The error code of a ClickHouse exception text (`Code: 60, ...`).
#[must_use]
pub fn error_code(body: &str) -> Option<u32> {
    let rest = body.trim_start().strip_prefix("Code: ")?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

fn check_status(status: u16, body: &str) -> Result<(), StoreError> {
    if (200..300).contains(&status) {
        return Ok(());
    }
    let text = clip(body, 300);
    // 60 unknown table, 81 unknown database, 47 unknown identifier, 16 no such column.
    Err(match error_code(body) {
        Some(60 | 81 | 47 | 16) => StoreError::Missing(text),
        _ => StoreError::Query(format!("HTTP {status}: {text}")),
    })
}

fn as_i64(v: &Value) -> Option<i64> {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

/// The server's own duration of the query, ns: `elapsed_ns` of `X-ClickHouse-Summary`,
/// else `statistics.elapsed` (seconds) of the answer.
#[must_use]
pub fn server_elapsed_ns(summary_header: Option<&str>, answer: &Value) -> Option<u64> {
    summary_header
        .and_then(|h| serde_json::from_str::<Value>(h).ok())
        .and_then(|v| v.get("elapsed_ns").and_then(as_i64))
        .and_then(|n| u64::try_from(n).ok())
        .or_else(|| {
            answer
                .get("statistics")
                .and_then(|s| s.get("elapsed"))
                .and_then(Value::as_f64)
                .map(|s| (s * 1e9).round() as u64)
        })
}

/// Parses a poll's answer (`FORMAT JSONCompact`, columns key and Unix seconds).
///
/// # Errors
/// [`StoreError::Missing`] (unknown table, database or column), [`StoreError::Query`]
/// (any other exception), [`StoreError::Answer`] (not the expected JSON).
pub fn parse_poll(
    status: u16,
    summary_header: Option<&str>,
    body: &str,
) -> Result<Batch, StoreError> {
    check_status(status, body)?;
    let v: Value = serde_json::from_str(body)
        .map_err(|_| StoreError::Answer(format!("not JSON: {}", clip(body, 300))))?;
    let data = v
        .get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| StoreError::Answer(format!("no \"data\": {}", clip(body, 200))))?;
    let mut batch = Batch {
        server_elapsed_ns: server_elapsed_ns(summary_header, &v),
        ..Batch::default()
    };
    for row in data {
        let cells = row.as_array().map(Vec::as_slice).unwrap_or_default();
        let secs = cells
            .get(1)
            .and_then(as_i64)
            .ok_or_else(|| StoreError::Answer(format!("a row without a time: {row}")))?;
        match cells.first() {
            Some(Value::String(k)) if !k.is_empty() => batch.rows.push(Row {
                key: k.clone(),
                time_ns: secs.saturating_mul(1_000_000_000),
                series: None,
            }),
            _ => batch.untraced += 1,
        }
    }
    Ok(batch)
}

impl ClickHouse {
    /// A tap of `clickhouse://HOST:PORT/DATABASE?table=T[&time=inserted][&key=hoptrace]`.
    ///
    /// # Errors
    /// [`UrlError`] for a missing table or an unknown parameter.
    pub fn new(url: &StoreUrl) -> Result<Self, UrlError> {
        url.check_params(&["table", "key", "time", "user", "password", "where"])?;
        let database = if url.path.is_empty() {
            "default"
        } else {
            url.path.as_str()
        };
        let mut auth = Vec::new();
        if let Some(u) = url.param("user").or(url.user.as_deref()) {
            auth.push(("user".to_owned(), u.to_owned()));
        }
        if let Some(p) = url.param("password").or(url.password.as_deref()) {
            auth.push(("password".to_owned(), p.to_owned()));
        }
        Ok(Self {
            http: Http::new(url)?,
            url: url.clone(),
            table: qualified(database, url.required("table", "table")?),
            key: url.param("key").unwrap_or("hoptrace").to_owned(),
            time: url.param("time").unwrap_or("inserted").to_owned(),
            auth,
            overlap: url.duration("overlap", Duration::from_secs(1))?,
            filter: url.condition()?,
        })
    }

    fn run(&self, sql: &str) -> Result<(u16, Option<String>, String), StoreError> {
        let q: Vec<(&str, &str)> = self
            .auth
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let a = self.http.post("/", &q, sql, &["X-ClickHouse-Summary"])?;
        let summary = a.header("X-ClickHouse-Summary").map(str::to_owned);
        Ok((a.status, summary, a.body))
    }
}

impl Store for ClickHouse {
    fn kind(&self) -> StoreKind {
        StoreKind::ClickHouse
    }

    fn describe(&self) -> String {
        format!(
            "ClickHouse {}:{} table {}, key column {}, time column {}",
            self.url.host, self.url.port, self.table, self.key, self.time
        )
    }

    fn query_shape(&self) -> String {
        poll_query(
            &self.table,
            &self.key,
            &self.time,
            Some(0),
            self.filter.as_deref(),
        )
        .replace(
            "toDateTime(0)",
            &format!("toDateTime(<newest second seen - {:?}>)", self.overlap),
        )
    }

    fn open(&mut self) -> Result<Opened, StoreError> {
        let (status, _, body) = self.run(&open_query(
            &self.table,
            &self.key,
            &self.time,
            self.filter.as_deref(),
        ))?;
        check_status(status, &body).map_err(|e| match e {
            StoreError::Missing(m) => StoreError::Missing(format!(
                "ClickHouse {}:{}: {m} (check table=, key= and time=)",
                self.url.host, self.url.port
            )),
            other => other,
        })?;
        let v: Value = serde_json::from_str(&body)
            .map_err(|_| StoreError::Answer(format!("not JSON: {}", clip(&body, 300))))?;
        let newest = v
            .get("data")
            .and_then(|d| d.get(0))
            .and_then(|r| r.get(0))
            .and_then(as_i64)
            .filter(|s| *s > 0);
        Ok(Opened {
            newest_ns: newest.map(|s| s.saturating_mul(1_000_000_000)),
            notice: None,
        })
    }

    fn poll(&mut self, since_ns: Option<i64>) -> Result<Batch, StoreError> {
        let (status, summary, body) = self.run(&poll_query(
            &self.table,
            &self.key,
            &self.time,
            since_ns,
            self.filter.as_deref(),
        ))?;
        parse_poll(status, summary.as_deref(), &body)
    }

    fn time_resolution_ns(&self) -> u64 {
        1_000_000_000
    }

    fn overlap(&self) -> Duration {
        self.overlap
    }
}

impl std::fmt::Debug for ClickHouse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries() {
        let t = qualified("hoptrace", "t_1");
        assert_eq!(t, "`hoptrace`.`t_1`");
        assert_eq!(qualified("x", "db.t"), "`db`.`t`");
        assert_eq!(quote_ident("a`b"), "`a\\`b`");
        assert_eq!(
            poll_query(
                &t,
                "hoptrace",
                "inserted",
                Some(1_700_000_000_999_999_999),
                None
            ),
            "SELECT `hoptrace`, toUnixTimestamp(`inserted`) FROM `hoptrace`.`t_1` WHERE `inserted` >= toDateTime(1700000000) FORMAT JSONCompact"
        );
        // Only the run's rows (where=).
        assert_eq!(
            poll_query(
                &t,
                "hoptrace",
                "inserted",
                Some(1_700_000_000_999_999_999),
                Some("topic LIKE 'run/%'")
            ),
            "SELECT `hoptrace`, toUnixTimestamp(`inserted`) FROM `hoptrace`.`t_1` WHERE `inserted` >= toDateTime(1700000000) AND (topic LIKE 'run/%') FORMAT JSONCompact"
        );
        assert_eq!(
            open_query(&t, "key", "inserted", Some("a = 1")),
            "SELECT max(toUnixTimestamp(`inserted`)), count(`key`) FROM `hoptrace`.`t_1` WHERE (a = 1) FORMAT JSONCompact"
        );
        assert_eq!(
            open_query(&t, "key", "inserted", None),
            "SELECT max(toUnixTimestamp(`inserted`)), count(`key`) FROM `hoptrace`.`t_1` FORMAT JSONCompact"
        );
    }

    #[test]
    fn parses_rows_and_the_servers_duration() {
        let body = r#"{"meta":[{"name":"hoptrace","type":"String"},{"name":"toUnixTimestamp(inserted)","type":"UInt32"}],
            "data":[["ht1.AQ",1700000000],["",1700000001],["ht1.AB","1700000002"]],
            "rows":3,"statistics":{"elapsed":0.000512,"rows_read":3,"bytes_read":60}}"#;
        let b = parse_poll(200, None, body).unwrap();
        assert_eq!(b.rows.len(), 2);
        assert_eq!(b.rows[0].time_ns, 1_700_000_000_000_000_000);
        assert_eq!(b.rows[1].time_ns, 1_700_000_002_000_000_000);
        assert_eq!(b.untraced, 1);
        assert_eq!(b.server_elapsed_ns, Some(512_000));
        let b = parse_poll(
            200,
            Some(r#"{"read_rows":"3","read_bytes":"60","elapsed_ns":"123456"}"#),
            body,
        )
        .unwrap();
        assert_eq!(b.server_elapsed_ns, Some(123_456));
    }

    #[test]
    fn errors() {
        let e = parse_poll(
            404,
            None,
            "Code: 60, e.displayText() = DB::Exception: Table hoptrace.x doesn't exist., e.what() = DB::Exception\n",
        )
        .unwrap_err();
        assert!(
            matches!(e, StoreError::Missing(ref m) if m.contains("doesn't exist")),
            "{e:?}"
        );
        let e = parse_poll(500, None, "Code: 395, e.displayText() = DB::Exception: Value passed to 'throwIf' function is non zero").unwrap_err();
        assert!(
            matches!(e, StoreError::Query(ref m) if m.contains("HTTP 500")),
            "{e:?}"
        );
        assert_eq!(error_code("Code: 81, e.displayText()"), Some(81));
        assert_eq!(error_code("nope"), None);
        assert!(matches!(
            parse_poll(200, None, "Code: 241 ..."),
            Err(StoreError::Answer(_))
        ));
    }
}
