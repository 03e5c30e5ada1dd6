//! VictoriaMetrics: `GET /api/v1/export?match[]={__name__="m",hoptrace!=""}&start=<now -
//! lookback>&nocache=1`, one JSON line per series.
//!
//! VictoriaMetrics keeps numbers with labels, so the trace context is a label value: every
//! message is a new series, and a new series becomes searchable only after VictoriaMetrics
//! registers it, measured here at 3.9–9.7 s with an unchanging selector
//! (`infra/stores/README.md`). The tap therefore looks back `lookback` (default 30 s) from
//! now on every poll rather than from the newest sample seen (a late series carries an
//! older timestamp), the time range changing with every poll, and asks for no cache
//! (`nocache=1`). `nocache=1` does not reach the store's cache of series searches, which is
//! keyed by the selector: asked the same selector again, it answers with the series it
//! knew. So every poll's selector differs from the one before by a matcher no key can fail
//! (`hoptrace!="#<poll number>"`, [`selector_varied`]); `vary=off` polls one fixed
//! selector. In one run of `tap/tests/stores.rs` here (40 new series written at once) the
//! tap saw them 1.7 s after the write with the varied selector and 9.6 s after it with
//! `vary=off`. `where=` adds label matchers to every selector (`where=topic=~"plant/.*"`:
//! only the run's series). Errors are non-2xx answers (400 with
//! text for `/export`, 422 with JSON for `/query`). A sample's time is the writer's unless
//! it sent none; so `store_in` is off by default. Because each poll starts `lookback` before
//! the tap's clock, a writer whose clock is further behind than that is never found (its
//! samples fall before every poll's start, and nothing tells that apart from no data). A
//! writer closer to it is seen: its row times fall before the publish stamps, counted as
//! `store_time_behind` with the most they were behind; raise `lookback=` past that.

use std::time::Duration;

use serde_json::Value;

use super::{
    Batch, Http, Opened, Row, Store, StoreError, StoreKind, StoreUrl, UrlError, clip, duration_ns,
};

/// A VictoriaMetrics metric polled over HTTP.
pub struct VictoriaMetrics {
    http: Http,
    url: StoreUrl,
    metric: String,
    label: String,
    lookback: Duration,
    /// Whether every poll's selector differs from the one before (see [`selector_varied`]).
    vary: bool,
    /// The address's `where=`: label matchers every selector adds.
    matchers: Option<String>,
    polls: u64,
}

/// A MetricsQL string literal.
#[must_use]
pub fn quote_value(v: &str) -> String {
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        match c {
            '"' | '\\' => {
                s.push('\\');
                s.push(c);
            }
            '\n' => s.push_str("\\n"),
            _ => s.push(c),
        }
    }
    s.push('"');
    s
}

/// The series selector: the metric's series that carry the label, and meet `matchers`
/// (the address's `where=`, e.g. `topic=~"plant/.*"`) when given.
#[must_use]
pub fn selector(metric: &str, label: &str, matchers: Option<&str>) -> String {
    let extra = matchers.map(|m| format!(",{m}")).unwrap_or_default();
    format!("{{__name__={},{label}!=\"\"{extra}}}", quote_value(metric))
}

/// The series selector of poll number `n`: [`selector`] plus a matcher no key can fail
/// (`label!="#<n>"`; keys start `ht1.`), so that every poll's selector is new to the
/// store's caches of series searches.
#[must_use]
pub fn selector_varied(metric: &str, label: &str, matchers: Option<&str>, n: u64) -> String {
    let extra = matchers.map(|m| format!(",{m}")).unwrap_or_default();
    format!(
        "{{__name__={},{label}!=\"\",{label}!=\"#{n}\"{extra}}}",
        quote_value(metric)
    )
}

/// `start=` for `/api/v1/export`: Unix seconds with milliseconds.
#[must_use]
pub fn start_param(since_ns: i64) -> String {
    let ms = since_ns.div_euclid(1_000_000);
    format!("{}.{:03}", ms.div_euclid(1000), ms.rem_euclid(1000))
}

/// Parses an `/api/v1/export` answer: per series, the label's value and its first sample's
/// time.
///
/// # Errors
/// [`StoreError::Query`] for a non-2xx answer, [`StoreError::Answer`] for a line that is
/// not a series.
pub fn parse_poll(status: u16, body: &str, label: &str) -> Result<Batch, StoreError> {
    if !(200..300).contains(&status) {
        return Err(StoreError::Query(format!(
            "HTTP {status}: {}",
            clip(body, 300)
        )));
    }
    let mut batch = Batch::default();
    for line in body.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line)
            .map_err(|_| StoreError::Answer(format!("not a JSON series: {}", clip(line, 200))))?;
        let ts = v
            .get("timestamps")
            .and_then(Value::as_array)
            .and_then(|t| t.iter().filter_map(Value::as_i64).min())
            .ok_or_else(|| {
                StoreError::Answer(format!("a series without timestamps: {}", clip(line, 200)))
            })?;
        match v
            .get("metric")
            .and_then(|m| m.get(label))
            .and_then(Value::as_str)
        {
            Some(k) if !k.is_empty() => batch.rows.push(Row {
                key: k.to_owned(),
                time_ns: ts.saturating_mul(1_000_000),
                series: None,
            }),
            _ => batch.untraced += 1,
        }
    }
    Ok(batch)
}

fn is_label_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

impl VictoriaMetrics {
    /// A tap of `victoriametrics://HOST:PORT/?metric=M[&label=hoptrace][&lookback=30s]`.
    ///
    /// # Errors
    /// [`UrlError`] for a missing metric, a label that is not a label name, or an unknown
    /// parameter.
    pub fn new(url: &StoreUrl) -> Result<Self, UrlError> {
        url.check_params(&["metric", "label", "lookback", "vary", "where"])?;
        let vary = match url.param("vary").unwrap_or("on") {
            "on" | "1" | "true" => true,
            "off" | "0" | "false" => false,
            v => return Err(url.error(format!("vary={v:?}: on or off"))),
        };
        let label = url.param("label").unwrap_or("hoptrace").to_owned();
        if !is_label_name(&label) {
            return Err(url.error(format!("label={label:?} is not a label name")));
        }
        let lookback = match url.param("overlap") {
            Some(_) => url.duration("overlap", Duration::ZERO)?,
            None => url.duration("lookback", Duration::from_secs(30))?,
        };
        let matchers = url.condition()?;
        if let Some(m) = matchers.as_deref().filter(|m| m.contains(['{', '}'])) {
            return Err(url.error(format!(
                "where={m:?}: label matchers without braces (e.g. where=topic=~\"plant/.*\")"
            )));
        }
        Ok(Self {
            http: Http::new(url)?,
            url: url.clone(),
            metric: url.required("metric", "metric name")?.to_owned(),
            label,
            lookback,
            vary,
            matchers,
            polls: 0,
        })
    }
}

impl Store for VictoriaMetrics {
    fn kind(&self) -> StoreKind {
        StoreKind::VictoriaMetrics
    }

    fn describe(&self) -> String {
        format!(
            "VictoriaMetrics {}:{} metric {}, key label {}",
            self.url.host, self.url.port, self.metric, self.label
        )
    }

    fn query_shape(&self) -> String {
        format!(
            "/api/v1/export?match[]={}&start=<now - {:?}>&nocache=1",
            if self.vary {
                selector_varied(&self.metric, &self.label, self.matchers.as_deref(), 0)
                    .replace("#0", "#<poll number>")
            } else {
                selector(&self.metric, &self.label, self.matchers.as_deref())
            },
            self.lookback
        )
    }

    fn open(&mut self) -> Result<Opened, StoreError> {
        let a = self.http.get("/api/v1/label/__name__/values", &[], &[])?;
        if !(200..300).contains(&a.status) {
            return Err(StoreError::Query(format!(
                "HTTP {}: {}",
                a.status,
                clip(&a.body, 300)
            )));
        }
        let v: Value = serde_json::from_str(&a.body)
            .map_err(|_| StoreError::Answer(format!("not JSON: {}", clip(&a.body, 200))))?;
        let names: Vec<&str> = v
            .get("data")
            .and_then(Value::as_array)
            .map(|d| d.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        Ok(Opened {
            newest_ns: None,
            notice: (!names.contains(&self.metric.as_str())).then(|| {
                format!(
                    "metric {:?} has no samples yet (VictoriaMetrics knows a metric from its first sample; if nothing arrives, check metric=)",
                    self.metric
                )
            }),
        })
    }

    fn poll(&mut self, since_ns: Option<i64>) -> Result<Batch, StoreError> {
        self.polls += 1;
        let sel = if self.vary {
            selector_varied(
                &self.metric,
                &self.label,
                self.matchers.as_deref(),
                self.polls,
            )
        } else {
            selector(&self.metric, &self.label, self.matchers.as_deref())
        };
        let start = since_ns.map(start_param);
        let mut q: Vec<(&str, &str)> = vec![("match[]", &sel), ("nocache", "1")];
        if let Some(s) = &start {
            q.push(("start", s));
        }
        let a = self.http.get("/api/v1/export", &q, &[])?;
        parse_poll(a.status, &a.body, &self.label)
    }

    fn time_resolution_ns(&self) -> u64 {
        1_000_000
    }

    fn since(&self, _newest_ns: Option<i64>, now_ns: i64, further_ns: i64) -> Option<i64> {
        Some(
            now_ns
                .saturating_sub(duration_ns(self.lookback))
                .saturating_sub(further_ns),
        )
    }

    fn overlap(&self) -> Duration {
        self.lookback
    }
}

impl std::fmt::Debug for VictoriaMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries() {
        assert_eq!(
            selector("m", "hoptrace", None),
            r#"{__name__="m",hoptrace!=""}"#
        );
        assert_eq!(
            selector_varied("m", "hoptrace", None, 7),
            r##"{__name__="m",hoptrace!="",hoptrace!="#7"}"##
        );
        // Only the run's series (where=).
        assert_eq!(
            selector_varied("m", "hoptrace", Some(r#"topic=~"run/.*""#), 7),
            r##"{__name__="m",hoptrace!="",hoptrace!="#7",topic=~"run/.*"}"##
        );
        let url = |w: &str| {
            StoreUrl::parse(&format!("victoriametrics://h:1?metric=m&where={w}")).unwrap()
        };
        assert!(VictoriaMetrics::new(&url("a%3D%22b%22")).is_ok());
        let e = VictoriaMetrics::new(&url("a%3D%22b%22%7D%7Bc%3D%22d%22"))
            .err()
            .unwrap();
        assert!(e.to_string().contains("without braces"), "{e}");
        assert_eq!(quote_value(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(start_param(1_700_000_000_123_456_789), "1700000000.123");
        assert!(is_label_name("hoptrace"));
        assert!(!is_label_name("1x"));
        assert!(!is_label_name("a-b"));
    }

    #[test]
    fn parses_series() {
        let body = concat!(
            r#"{"metric":{"__name__":"m","hoptrace":"ht1.AQ"},"values":[1,2],"timestamps":[1700000000123,1700000000100]}"#,
            "\n",
            r#"{"metric":{"__name__":"m"},"values":[1],"timestamps":[1700000000200]}"#,
            "\n"
        );
        let b = parse_poll(200, body, "hoptrace").unwrap();
        assert_eq!(
            b.rows,
            vec![Row {
                key: "ht1.AQ".into(),
                time_ns: 1_700_000_000_100_000_000,
                series: None
            }]
        );
        assert_eq!(b.untraced, 1);
        assert!(parse_poll(200, "", "hoptrace").unwrap().rows.is_empty());
    }

    #[test]
    fn errors() {
        let e = parse_poll(
            400,
            "cannot parse match[]=\"{\": unexpected end",
            "hoptrace",
        )
        .unwrap_err();
        assert!(
            matches!(e, StoreError::Query(ref m) if m.contains("HTTP 400")),
            "{e:?}"
        );
        let e = parse_poll(
            422,
            r#"{"status":"error","errorType":"422","error":"unknown func"}"#,
            "hoptrace",
        )
        .unwrap_err();
        assert!(
            matches!(e, StoreError::Query(ref m) if m.contains("unknown func")),
            "{e:?}"
        );
        assert!(matches!(
            parse_poll(200, "{\"metric\":{}}", "hoptrace"),
            Err(StoreError::Answer(_))
        ));
    }
}
