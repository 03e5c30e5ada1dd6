//! InfluxDB 1.x: `GET /query?db=D&epoch=ns&q=SELECT "key" FROM "m" WHERE time >= <since>`.
//!
//! InfluxDB answers a failed *statement* with HTTP 200 and the error inside the body
//! (`{"results":[{"statement_id":0,"error":"database not found: x"}]}`), a query that does
//! not parse with HTTP 400 (`{"error":"error parsing query: ..."}`); both are errors here.
//! A missing measurement is an empty answer, so [`InfluxDb::open`] looks it up. The point
//! time is the store's own clock (ns) when the writer set none: the `store_in` stamp.
//!
//! `where=` adds a condition to every poll. A regular expression on a tag there
//! (`"topic" =~ /^run\//`) makes InfluxDB match it against every value of the tag in the
//! measurement, so a poll costs more the more series the measurement holds (30 ms at
//! 181,000 series here, against 1–3 ms for an equality). `series=TAG=~/REGEX/` instead
//! resolves the matching values with `SHOW TAG VALUES` (by the poll loop: every 100 ms
//! while new ones appear, backing off to once a second) and asks for them by value, `("TAG" = 'a' OR "TAG" = 'b') ... GROUP BY "TAG"`,
//! so each row comes back with its series.
//!
//! `subscribe=HOST:PORT` makes a subscription that sends the tap every accepted write, and
//! each write triggers a query for its points (`crate::subscribe`).
//!
//! A poll costs InfluxDB about as much per series it touches as per row it reads: a message
//! written as several points (one per metric, each its own series) is best polled with a
//! `where=` equality that one of its points meets (`"metric"='m0'`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::{
    Answer, Batch, Http, Opened, Row, Store, StoreError, StoreKind, StoreUrl, UrlError, clip,
};

/// An InfluxDB 1.x measurement polled over HTTP.
pub struct InfluxDb {
    http: Http,
    url: StoreUrl,
    database: String,
    measurement: String,
    key: String,
    rp: Option<String>,
    overlap: Duration,
    /// The address's `where=`.
    filter: Option<String>,
    /// The address's `series=`: the tag and the pattern its values must match.
    series: Option<(String, String)>,
    /// The resolved series polled (the tag's values), and each one's index.
    values: Arc<[String]>,
    index: HashMap<String, u32>,
}

/// `'text'` with `\` and `'` escaped: an InfluxQL string literal.
#[must_use]
pub fn quote_literal(text: &str) -> String {
    let mut s = String::with_capacity(text.len() + 2);
    s.push('\'');
    for c in text.chars() {
        if c == '\'' || c == '\\' {
            s.push('\\');
        }
        s.push(c);
    }
    s.push('\'');
    s
}

/// Parses `series=TAG=~/REGEX/` into the tag and the regular expression's text.
fn parse_series(text: &str) -> Option<(String, String)> {
    let (tag, re) = text.split_once("=~")?;
    let re = re.trim().strip_prefix('/')?.strip_suffix('/')?;
    let tag = tag.trim().trim_matches('"');
    (!tag.is_empty() && !re.is_empty()).then(|| (tag.to_owned(), re.to_owned()))
}

/// The statement that lists the values of `tag` matching `/regex/`.
#[must_use]
pub fn series_query(measurement: &str, rp: Option<&str>, tag: &str, regex: &str) -> String {
    format!(
        "SHOW TAG VALUES FROM {} WITH KEY = {t} WHERE {t} =~ /{regex}/",
        from(measurement, rp),
        t = quote_ident(tag)
    )
}

fn from(measurement: &str, rp: Option<&str>) -> String {
    match rp {
        Some(rp) => format!("{}.{}", quote_ident(rp), quote_ident(measurement)),
        None => quote_ident(measurement),
    }
}

/// `"name"` with `\` and `"` escaped: an InfluxQL identifier that may be a keyword.
#[must_use]
pub fn quote_ident(name: &str) -> String {
    let mut s = String::with_capacity(name.len() + 2);
    s.push('"');
    for c in name.chars() {
        if c == '"' || c == '\\' {
            s.push('\\');
        }
        s.push(c);
    }
    s.push('"');
    s
}

/// The poll's statement: the key field of every point at or after `since_ns` that meets
/// `filter` (the address's `where=`, e.g. `"topic" =~ /^plant\//`) and, given
/// `(tag, values)`, is in one of those series (grouped by the tag).
#[must_use]
pub fn poll_query(
    measurement: &str,
    key: &str,
    rp: Option<&str>,
    since_ns: Option<i64>,
    filter: Option<&str>,
    series: Option<(&str, &[String])>,
) -> String {
    let mut q = format!("SELECT {} FROM {}", quote_ident(key), from(measurement, rp));
    let mut conditions = Vec::new();
    if let Some(s) = since_ns {
        conditions.push(format!("time >= {s}"));
    }
    if let Some(f) = filter {
        conditions.push(format!("({f})"));
    }
    if let Some((tag, values)) = series {
        let t = quote_ident(tag);
        let any: Vec<String> = values
            .iter()
            .map(|v| format!("{t} = {}", quote_literal(v)))
            .collect();
        conditions.push(format!("({})", any.join(" OR ")));
    }
    if !conditions.is_empty() {
        q.push_str(" WHERE ");
        q.push_str(&conditions.join(" AND "));
    }
    if let Some((tag, _)) = series {
        q.push_str(" GROUP BY ");
        q.push_str(&quote_ident(tag));
    }
    q
}

/// The newest point's statement.
#[must_use]
pub fn newest_query(
    measurement: &str,
    key: &str,
    rp: Option<&str>,
    filter: Option<&str>,
) -> String {
    format!(
        "{} ORDER BY time DESC LIMIT 1",
        poll_query(measurement, key, rp, None, filter, None)
    )
}

/// The statement results of an answer, after checking every place an error can be.
fn results(status: u16, body: &str) -> Result<Vec<Value>, StoreError> {
    let v: Value = serde_json::from_str(body).map_err(|_| {
        if status == 200 {
            StoreError::Answer(format!("not JSON: {}", clip(body, 200)))
        } else {
            StoreError::Query(format!("HTTP {status}: {}", clip(body, 300)))
        }
    })?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        return Err(StoreError::Query(format!("HTTP {status}: {e}")));
    }
    if status != 200 {
        return Err(StoreError::Query(format!(
            "HTTP {status}: {}",
            clip(body, 300)
        )));
    }
    let results = v
        .get("results")
        .and_then(Value::as_array)
        .ok_or_else(|| StoreError::Answer(format!("no \"results\": {}", clip(body, 200))))?;
    for r in results {
        if let Some(e) = r.get("error").and_then(Value::as_str) {
            return Err(if e.starts_with("database not found") {
                StoreError::Missing(e.to_owned())
            } else {
                StoreError::Query(e.to_owned())
            });
        }
    }
    Ok(results.clone())
}

/// Parses a poll's answer (`epoch=ns`, one statement selecting the key field); given
/// `(tag, index)`, each row's series is its group's value of the tag, by index.
///
/// # Errors
/// [`StoreError::Query`] or [`StoreError::Missing`] for an error in the body (also with
/// HTTP 200), [`StoreError::Answer`] for an answer of another shape.
pub fn parse_poll(
    status: u16,
    body: &str,
    groups: Option<(&str, &HashMap<String, u32>)>,
) -> Result<Batch, StoreError> {
    let mut batch = Batch::default();
    for r in results(status, body)? {
        if r.get("partial").and_then(Value::as_bool) == Some(true) {
            return Err(StoreError::Query(
                "the answer is partial (max-row-limit reached): poll more often or lower overlap"
                    .into(),
            ));
        }
        for s in r
            .get("series")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let series = groups.and_then(|(tag, index)| {
                s.get("tags")
                    .and_then(|t| t.get(tag))
                    .and_then(Value::as_str)
                    .and_then(|v| index.get(v).copied())
            });
            for row in s
                .get("values")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let cells = row.as_array().map(Vec::as_slice).unwrap_or_default();
                let time_ns = cells.first().and_then(Value::as_i64).ok_or_else(|| {
                    StoreError::Answer(format!(
                        "a row without an integer time (is epoch=ns set?): {row}"
                    ))
                })?;
                match cells.get(1) {
                    Some(Value::String(k)) if !k.is_empty() => batch.rows.push(Row {
                        key: k.clone(),
                        time_ns,
                        series,
                    }),
                    _ => batch.untraced += 1,
                }
            }
        }
    }
    Ok(batch)
}

/// The names in the first column of a `SHOW ...` answer.
fn names(status: u16, body: &str) -> Result<Vec<String>, StoreError> {
    column(status, body, 0)
}

/// The text values in column `index` of every row of an answer.
fn column(status: u16, body: &str, index: usize) -> Result<Vec<String>, StoreError> {
    let mut out = Vec::new();
    for r in results(status, body)? {
        for s in r
            .get("series")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            for row in s
                .get("values")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(n) = row.get(index).and_then(Value::as_str) {
                    out.push(n.to_owned());
                }
            }
        }
    }
    Ok(out)
}

impl InfluxDb {
    /// A tap of `influxdb://HOST:PORT/DATABASE?measurement=M[&key=hoptrace][&rp=RP]`.
    ///
    /// # Errors
    /// [`UrlError`] for a missing database or measurement, or an unknown parameter.
    pub fn new(url: &StoreUrl) -> Result<Self, UrlError> {
        url.check_params(&["measurement", "key", "rp", "where", "series", "subscribe"])?;
        let series = match url.param("series") {
            None => None,
            Some(s) => Some(parse_series(s).ok_or_else(|| {
                url.error(format!(
                    "series={s:?}: TAG=~/REGEX/, the tag whose matching values are the run's series (e.g. series=topic=~/^plant\\//)"
                ))
            })?),
        };
        if url.path.is_empty() {
            return Err(url.error(
                "the path names the database: influxdb://HOST:PORT/DATABASE?measurement=M".into(),
            ));
        }
        Ok(Self {
            http: Http::new(url)?,
            url: url.clone(),
            database: url.path.clone(),
            measurement: url.required("measurement", "measurement")?.to_owned(),
            key: url.param("key").unwrap_or("hoptrace").to_owned(),
            rp: url.param("rp").map(str::to_owned),
            overlap: url.duration("overlap", Duration::from_millis(200))?,
            filter: url.condition()?,
            series,
            values: Arc::from(Vec::new()),
            index: HashMap::new(),
        })
    }

    /// The resolved series of a poll: the tag and its values.
    fn polled_series(&self) -> Option<(&str, &[String])> {
        self.series
            .as_ref()
            .map(|(t, _)| (t.as_str(), &self.values[..]))
    }

    fn query(&self, q: &str) -> Result<Answer, StoreError> {
        self.http.get(
            "/query",
            &[("db", &self.database), ("epoch", "ns"), ("q", q)],
            &[],
        )
    }

    /// A statement that changes the server (InfluxDB takes those only by POST), checked.
    fn execute(&self, q: &str) -> Result<(), StoreError> {
        let a = self
            .http
            .post("/query", &[("db", &self.database), ("q", q)], "", &[])?;
        results(a.status, &a.body).map(drop)
    }

    /// The retention policy a subscription is made on: the address's `rp=`, else the
    /// database's default one.
    ///
    /// # Errors
    /// Any [`StoreError`]; [`StoreError::Missing`] when the database has no default.
    pub fn subscription_rp(&self) -> Result<String, StoreError> {
        if let Some(rp) = &self.rp {
            return Ok(rp.clone());
        }
        let a = self.query(&format!(
            "SHOW RETENTION POLICIES ON {}",
            quote_ident(&self.database)
        ))?;
        let results = results(a.status, &a.body)?;
        let series = results
            .first()
            .and_then(|r| r.get("series"))
            .and_then(Value::as_array)
            .and_then(|s| s.first())
            .ok_or_else(|| {
                StoreError::Answer(format!("no retention policies: {}", clip(&a.body, 200)))
            })?;
        let columns = series.get("columns").and_then(Value::as_array);
        let at = |name: &str| columns.and_then(|c| c.iter().position(|v| v.as_str() == Some(name)));
        let (Some(n), Some(d)) = (at("name"), at("default")) else {
            return Err(StoreError::Answer(format!(
                "retention policies without name/default columns: {}",
                clip(&a.body, 200)
            )));
        };
        series
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|row| row.get(d).and_then(Value::as_bool) == Some(true))
            .and_then(|row| row.get(n).and_then(Value::as_str))
            .map(str::to_owned)
            .ok_or_else(|| {
                StoreError::Missing(format!(
                    "database {:?} has no default retention policy: set rp=",
                    self.database
                ))
            })
    }

    /// Subscribes `destination` (`http://HOST:PORT`) to every write to `rp`, as
    /// subscription `name`; a subscription of that name or to that destination left by
    /// an earlier tap is dropped first.
    ///
    /// # Errors
    /// Any [`StoreError`] (a user without the right to manage subscriptions: `Query`).
    pub fn subscribe(&self, rp: &str, name: &str, destination: &str) -> Result<(), StoreError> {
        for (stale, to) in self.subscriptions(rp)? {
            if stale == name || to.iter().any(|d| d == destination) {
                self.unsubscribe(rp, &stale)?;
            }
        }
        self.execute(&format!(
            "CREATE SUBSCRIPTION {} ON {}.{} DESTINATIONS ALL {}",
            quote_ident(name),
            quote_ident(&self.database),
            quote_ident(rp),
            quote_literal(destination)
        ))
    }

    /// Drops subscription `name` on `rp`.
    ///
    /// # Errors
    /// Any [`StoreError`].
    pub fn unsubscribe(&self, rp: &str, name: &str) -> Result<(), StoreError> {
        self.execute(&format!(
            "DROP SUBSCRIPTION {} ON {}.{}",
            quote_ident(name),
            quote_ident(&self.database),
            quote_ident(rp)
        ))
    }

    /// The subscriptions on this database and `rp`: each one's name and destinations.
    ///
    /// # Errors
    /// Any [`StoreError`].
    pub fn subscriptions(&self, rp: &str) -> Result<Vec<(String, Vec<String>)>, StoreError> {
        let a = self.query("SHOW SUBSCRIPTIONS")?;
        let results = results(a.status, &a.body)?;
        let mut out = Vec::new();
        for s in results
            .iter()
            .filter_map(|r| r.get("series").and_then(Value::as_array))
            .flatten()
            .filter(|s| s.get("name").and_then(Value::as_str) == Some(self.database.as_str()))
        {
            // Columns: retention_policy, name, mode, destinations.
            for row in s
                .get("values")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let (Some(r), Some(n)) = (
                    row.get(0).and_then(Value::as_str),
                    row.get(1).and_then(Value::as_str),
                ) else {
                    continue;
                };
                let to: Vec<String> = row
                    .get(3)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect();
                if r == rp {
                    out.push((n.to_owned(), to));
                }
            }
        }
        Ok(out)
    }

    /// Whether InfluxDB's subscriber service runs, as `SHOW DIAGNOSTICS` says
    /// (`config-subscriber`, `enabled`); `None` when it does not say.
    ///
    /// # Errors
    /// Any [`StoreError`] (with authentication on, `SHOW DIAGNOSTICS` needs an admin).
    pub fn subscriber_enabled(&self) -> Result<Option<bool>, StoreError> {
        let a = self.query("SHOW DIAGNOSTICS")?;
        let results = results(a.status, &a.body)?;
        let config = results
            .iter()
            .filter_map(|r| r.get("series").and_then(Value::as_array))
            .flatten()
            .find(|s| s.get("name").and_then(Value::as_str) == Some("config-subscriber"));
        Ok(config.and_then(|c| {
            let i = c
                .get("columns")?
                .as_array()?
                .iter()
                .position(|v| v.as_str() == Some("enabled"))?;
            c.get("values")?.as_array()?.first()?.get(i)?.as_bool()
        }))
    }

    /// What InfluxDB's subscriber service says of subscription `name` (`SHOW STATS FOR
    /// 'subscriber'`): the points written to it and the writes to it that failed (0, 0
    /// before its first write).
    ///
    /// # Errors
    /// Any [`StoreError`] (with authentication on, `SHOW STATS` needs an admin).
    pub fn subscriber_stats(&self, name: &str) -> Result<(u64, u64), StoreError> {
        let a = self.query("SHOW STATS FOR 'subscriber'")?;
        let results = results(a.status, &a.body)?;
        let series: Vec<&Value> = results
            .iter()
            .filter_map(|r| r.get("series").and_then(Value::as_array))
            .flatten()
            .collect();
        let mine = series.iter().find(|s| {
            s.get("tags")
                .and_then(|t| t.get("name"))
                .and_then(Value::as_str)
                == Some(name)
                && s.get("tags")
                    .and_then(|t| t.get("database"))
                    .and_then(Value::as_str)
                    == Some(self.database.as_str())
        });
        let Some(mine) = mine else {
            return Ok((0, 0));
        };
        let columns = mine.get("columns").and_then(Value::as_array);
        let row = mine
            .get("values")
            .and_then(Value::as_array)
            .and_then(|v| v.first());
        let field = |n: &str| {
            columns
                .and_then(|c| c.iter().position(|v| v.as_str() == Some(n)))
                .and_then(|i| row.and_then(|r| r.get(i)))
                .and_then(Value::as_u64)
                .unwrap_or(0)
        };
        Ok((field("pointsWritten"), field("writeFailures")))
    }

    /// The key of every point of the measurement with a time in `[from_ns, to_ns]` in
    /// one of `series` (each a point's tag set; an empty one, a point without tags, makes
    /// the query ask for every series) that meets the address's `where=`.
    ///
    /// # Errors
    /// Any [`StoreError`].
    pub fn points(
        &self,
        from_ns: i64,
        to_ns: i64,
        series: &[&[(String, String)]],
    ) -> Result<Batch, StoreError> {
        let mut q = poll_query(
            &self.measurement,
            &self.key,
            self.rp.as_deref(),
            Some(from_ns),
            self.filter.as_deref(),
            None,
        );
        q.push_str(&format!(" AND time <= {to_ns}"));
        if !series.iter().any(|t| t.is_empty()) {
            let any: Vec<String> = series
                .iter()
                .map(|tags| {
                    let all: Vec<String> = tags
                        .iter()
                        .map(|(k, v)| format!("{} = {}", quote_ident(k), quote_literal(v)))
                        .collect();
                    format!("({})", all.join(" AND "))
                })
                .collect();
            q.push_str(&format!(" AND ({})", any.join(" OR ")));
        }
        let a = self.query(&q)?;
        parse_poll(a.status, &a.body, None)
    }

    /// The tag of the address's `series=`: what tells the run's series apart.
    #[must_use]
    pub fn series_tag(&self) -> Option<&str> {
        self.series.as_ref().map(|(t, _)| t.as_str())
    }

    /// The measurement polled and its key field.
    #[must_use]
    pub fn measurement_and_key(&self) -> (&str, &str) {
        (&self.measurement, &self.key)
    }
}

/// The address's `subscribe=HOST:PORT`: where the tap takes the writes an InfluxDB
/// subscription sends it (`None`: no subscription).
///
/// # Errors
/// [`UrlError`] for a value that is not `HOST:PORT`.
pub fn subscribe_target(url: &StoreUrl) -> Result<Option<std::net::SocketAddr>, UrlError> {
    let Some(at) = url.param("subscribe") else {
        return Ok(None);
    };
    use std::net::ToSocketAddrs;
    at.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(Some)
        .ok_or_else(|| {
            url.error(format!(
                "subscribe={at:?}: HOST:PORT where the tap takes what an InfluxDB subscription sends (an address InfluxDB can reach, e.g. subscribe=127.0.0.1:18090)"
            ))
        })
}

impl Store for InfluxDb {
    fn kind(&self) -> StoreKind {
        StoreKind::InfluxDb
    }

    fn describe(&self) -> String {
        format!(
            "InfluxDB {}:{} database {}, measurement {}, key field {}",
            self.url.host, self.url.port, self.database, self.measurement, self.key
        )
    }

    fn query_shape(&self) -> String {
        let q = poll_query(
            &self.measurement,
            &self.key,
            self.rp.as_deref(),
            Some(0),
            self.filter.as_deref(),
            None,
        )
        .replace(
            "time >= 0",
            &format!("time >= <newest seen - {:?}>", self.overlap),
        );
        match &self.series {
            Some((tag, re)) => format!(
                "{q} AND ({t} = <each value of {t} matching /{re}/, resolved every 0.1-1 s>) GROUP BY {t}",
                t = quote_ident(tag)
            ),
            None => q,
        }
    }

    fn open(&mut self) -> Result<Opened, StoreError> {
        // SHOW MEASUREMENTS on a database that does not exist answers as on an empty one.
        let a = self.query("SHOW DATABASES")?;
        let databases = names(a.status, &a.body)?;
        if !databases.contains(&self.database) {
            return Err(StoreError::Missing(format!(
                "InfluxDB {}:{}: database not found: {:?} (it has {}; create it, or fix the path of the address)",
                self.url.host,
                self.url.port,
                self.database,
                databases.join(", ")
            )));
        }
        let a = self.query("SHOW MEASUREMENTS")?;
        let measurements = names(a.status, &a.body)?;
        if !measurements.contains(&self.measurement) {
            return Ok(Opened {
                newest_ns: None,
                notice: Some(format!(
                    "measurement {:?} does not exist yet in database {:?} (InfluxDB creates it with its first point; if nothing arrives, check measurement=; it has {})",
                    self.measurement,
                    self.database,
                    if measurements.is_empty() {
                        "no measurements".to_owned()
                    } else {
                        measurements.join(", ")
                    }
                )),
            });
        }
        let a = self.query(&format!(
            "SHOW FIELD KEYS FROM {}",
            quote_ident(&self.measurement)
        ))?;
        let fields = names(a.status, &a.body)?;
        if !fields.contains(&self.key) {
            return Err(StoreError::Missing(format!(
                "measurement {:?} has no field {:?} (its fields: {}); set key= to the field that carries the trace context",
                self.measurement,
                self.key,
                fields.join(", ")
            )));
        }
        // The newest point of the run's series: once, with the pattern itself.
        let pattern = self
            .series
            .as_ref()
            .map(|(t, re)| format!("{} =~ /{re}/", quote_ident(t)));
        let filter = match (self.filter.as_deref(), pattern.as_deref()) {
            (Some(f), Some(p)) => Some(format!("({f}) AND {p}")),
            (f, p) => f.or(p).map(str::to_owned),
        };
        let a = self.query(&newest_query(
            &self.measurement,
            &self.key,
            self.rp.as_deref(),
            filter.as_deref(),
        ))?;
        let b = parse_poll(a.status, &a.body, None)?;
        Ok(Opened {
            newest_ns: b.rows.first().map(|r| r.time_ns),
            notice: None,
        })
    }

    fn poll(&mut self, since_ns: Option<i64>) -> Result<Batch, StoreError> {
        // No series of the run yet: nothing to ask for (and nothing of the run there).
        if self.series.is_some() && self.values.is_empty() {
            return Ok(Batch::default());
        }
        let q = poll_query(
            &self.measurement,
            &self.key,
            self.rp.as_deref(),
            since_ns,
            self.filter.as_deref(),
            self.polled_series(),
        );
        let a = self.query(&q)?;
        let groups = self.series.as_ref().map(|(t, _)| (t.as_str(), &self.index));
        parse_poll(a.status, &a.body, groups)
    }

    fn resolve_series(&mut self) -> Result<Option<Vec<String>>, StoreError> {
        let Some((tag, re)) = &self.series else {
            return Ok(None);
        };
        let a = self.query(&series_query(
            &self.measurement,
            self.rp.as_deref(),
            tag,
            re,
        ))?;
        // Rows of `SHOW TAG VALUES` are [key, value].
        let values = column(a.status, &a.body, 1)?;
        Ok(Some(values))
    }

    fn set_series(&mut self, series: Arc<[String]>) {
        self.index = series
            .iter()
            .enumerate()
            .map(|(i, v)| (v.clone(), u32::try_from(i).unwrap_or(u32::MAX)))
            .collect();
        self.values = series;
    }

    fn time_resolution_ns(&self) -> u64 {
        1
    }

    fn overlap(&self) -> Duration {
        self.overlap
    }
}

impl std::fmt::Debug for InfluxDb {
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
            poll_query(
                "nodered",
                "key",
                None,
                Some(1_700_000_000_000_000_000),
                None,
                None
            ),
            r#"SELECT "key" FROM "nodered" WHERE time >= 1700000000000000000"#
        );
        assert_eq!(
            poll_query(r#"a"b"#, r"c\d", Some("autogen"), None, None, None),
            r#"SELECT "c\\d" FROM "autogen"."a\"b""#
        );
        assert_eq!(
            newest_query("m", "hoptrace", None, None),
            r#"SELECT "hoptrace" FROM "m" ORDER BY time DESC LIMIT 1"#
        );
        // Only the run's series, on a store with others: the address's where=.
        let f = r#""topic" =~ /^plant\//"#;
        assert_eq!(
            poll_query("m", "hoptrace", None, Some(5), Some(f), None),
            r#"SELECT "hoptrace" FROM "m" WHERE time >= 5 AND ("topic" =~ /^plant\//)"#
        );
        assert_eq!(
            newest_query("m", "hoptrace", None, Some(f)),
            r#"SELECT "hoptrace" FROM "m" WHERE ("topic" =~ /^plant\//) ORDER BY time DESC LIMIT 1"#
        );
        let u = StoreUrl::parse("influxdb://h/db?measurement=m&where=a;b").unwrap();
        assert!(
            InfluxDb::new(&u)
                .unwrap_err()
                .reason
                .contains("without `;`")
        );
    }

    #[test]
    fn parses_rows() {
        let body = r#"{"results":[{"statement_id":0,"series":[{"name":"nodered","columns":["time","hoptrace"],"values":[[1700000000000000001,"ht1.AQ"],[1700000000000000002,null],[1700000000000000003,""]]}]}]}"#;
        let b = parse_poll(200, body, None).unwrap();
        assert_eq!(
            b.rows,
            vec![Row {
                key: "ht1.AQ".into(),
                time_ns: 1_700_000_000_000_000_001,
                series: None,
            }]
        );
        assert_eq!(b.untraced, 2);
        assert_eq!(b.server_elapsed_ns, None);
        let empty = parse_poll(200, r#"{"results":[{"statement_id":0}]}"#, None).unwrap();
        assert!(empty.rows.is_empty());
    }

    #[test]
    fn errors_inside_http_200_are_errors() {
        let e = parse_poll(
            200,
            r#"{"results":[{"statement_id":0,"error":"database not found: no_such_db"}]}"#,
            None,
        )
        .unwrap_err();
        assert_eq!(
            e,
            StoreError::Missing("database not found: no_such_db".into())
        );
        let e = parse_poll(
            200,
            r#"{"results":[{"statement_id":0,"error":"shard is closed"}]}"#,
            None,
        )
        .unwrap_err();
        assert!(
            matches!(e, StoreError::Query(ref m) if m == "shard is closed"),
            "{e:?}"
        );
        let e = parse_poll(
            400,
            r#"{"error":"error parsing query: found KEY, expected identifier at line 1, char 8"}"#,
            None,
        )
        .unwrap_err();
        assert!(
            matches!(e, StoreError::Query(ref m) if m.contains("found KEY")),
            "{e:?}"
        );
        let e = parse_poll(502, "<html>bad gateway</html>", None).unwrap_err();
        assert!(
            matches!(e, StoreError::Query(ref m) if m.contains("502")),
            "{e:?}"
        );
        assert!(matches!(
            parse_poll(200, "nope", None),
            Err(StoreError::Answer(_))
        ));
        assert!(matches!(
            parse_poll(200, r#"{"results":[{"partial":true}]}"#, None),
            Err(StoreError::Query(_))
        ));
        assert!(matches!(
            parse_poll(
                200,
                r#"{"results":[{"series":[{"values":[["2023-01-01T00:00:00Z","k"]]}]}]}"#,
                None
            ),
            Err(StoreError::Answer(_))
        ));
    }

    #[test]
    fn resolved_series_are_asked_by_value_and_rows_carry_theirs() {
        let values = vec!["run/a".to_owned(), "it's".to_owned()];
        assert_eq!(
            poll_query(
                "m",
                "hoptrace",
                None,
                Some(5),
                None,
                Some(("topic", &values))
            ),
            r#"SELECT "hoptrace" FROM "m" WHERE time >= 5 AND ("topic" = 'run/a' OR "topic" = 'it\'s') GROUP BY "topic""#
        );
        assert_eq!(
            series_query("m", Some("autogen"), "topic", r"^run\/"),
            r#"SHOW TAG VALUES FROM "autogen"."m" WITH KEY = "topic" WHERE "topic" =~ /^run\//"#
        );
        assert_eq!(
            parse_series(r#""topic"=~/^run\//"#),
            Some(("topic".into(), r"^run\/".into()))
        );
        assert_eq!(parse_series("topic=/x/"), None);
        assert_eq!(parse_series("topic=~//"), None);
        let u = StoreUrl::parse("influxdb://h/db?measurement=m&series=topic").unwrap();
        assert!(
            InfluxDb::new(&u)
                .unwrap_err()
                .reason
                .contains("TAG=~/REGEX/")
        );
        let index: HashMap<String, u32> = [("run/a".to_owned(), 0), ("run/b".to_owned(), 1)].into();
        let body = r#"{"results":[{"statement_id":0,"series":[{"name":"m","tags":{"topic":"run/b"},"columns":["time","hoptrace"],"values":[[7,"ht1.B"]]},{"name":"m","tags":{"topic":"run/a"},"columns":["time","hoptrace"],"values":[[5,"ht1.A"]]}]}]}"#;
        let b = parse_poll(200, body, Some(("topic", &index))).unwrap();
        let got: Vec<(&str, Option<u32>)> =
            b.rows.iter().map(|r| (r.key.as_str(), r.series)).collect();
        assert_eq!(got, vec![("ht1.B", Some(1)), ("ht1.A", Some(0))]);
    }

    #[test]
    fn show_answers() {
        let body = r#"{"results":[{"statement_id":0,"series":[{"name":"measurements","columns":["name"],"values":[["cpu"],["nodered"]]}]}]}"#;
        assert_eq!(names(200, body).unwrap(), vec!["cpu", "nodered"]);
    }
}
