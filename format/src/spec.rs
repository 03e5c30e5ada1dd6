//! The pipeline spec: which hops a message passes, which of them every message must pass,
//! the stages (differences of two hops) the report measures, and how the collector joins
//! and writes traces. It is a TOML file with `deny_unknown_fields` everywhere;
//! [`DEFAULT_PIPELINE_TOML`] is a commented example that reproduces the five stages of an
//! MQTT → stream processor → time-series store pipeline.
//!
//! [`PipelineSpec`] is the file as written; [`ResolvedSpec`] is the validated form the
//! collector works with: hop indices instead of names, an O(1) table from wire id to hop
//! index, and the expected hops as a bit mask.
//!
//! ```
//! use hoptrace_format::spec::PipelineSpec;
//! use hoptrace_protocol::HopId;
//!
//! let spec = PipelineSpec::default_pipeline().resolve().unwrap();
//! assert_eq!(spec.hop_index(HopId(1)), Some(1));
//! assert_eq!(spec.hop_names()[1], "flow_in");
//! assert_eq!(spec.stages()[0].name, "Broker Time");
//! ```

mod default;
mod error;

use std::collections::HashSet;
use std::path::Path;

use hoptrace_protocol::{HopId, MAX_HOPS};
use serde::{Deserialize, Serialize};

pub use crate::schema::slug;
pub use default::{DEFAULT_PIPELINE_TOML, OTEL_PIPELINE_TOML};
pub use error::SpecError;

/// A hop's `id`: an integer from 0 to 255 (the wire id is one byte), said so when not.
fn hop_id<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u8>, D::Error> {
    let v = <i64 as serde::Deserialize>::deserialize(d)?;
    u8::try_from(v).map(Some).map_err(|_| {
        serde::de::Error::custom(format!(
            "a hop's `id` is 0-255 (its wire id is one byte), not {v}"
        ))
    })
}

/// The pipeline as declared in its TOML file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// Pipeline name, printed in reports.
    pub name: String,
    /// Hops every message is expected to pass, by name: a trace is complete when all of
    /// them have stamped it. `None` expects every hop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<Vec<String>>,
    /// Hops in pipeline order (1 to 16).
    pub hops: Vec<HopSpec>,
    /// Stages the report measures, in report order.
    pub stages: Vec<StageSpec>,
    /// How records are joined into traces.
    #[serde(default)]
    pub join: JoinSpec,
    /// How traces are written.
    #[serde(default)]
    pub output: OutputSpec,
}

/// One hop: a named point where messages are stamped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HopSpec {
    /// Hop name: non-empty, `[a-z0-9_]+`, unique within the pipeline.
    pub name: String,
    /// Wire id the hop's probe puts in its records; `None` means the hop's index.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "hop_id"
    )]
    pub id: Option<u8>,
    /// What the hop is, in one line.
    #[serde(default)]
    pub description: String,
    /// The hop's stamp is taken by polling (a store tap): the event happened no later
    /// than the stamp and no earlier than the stamp of the hop named here, which the same
    /// tap reports for the same message (the send of the last poll that would have
    /// returned the data and did not, or the data's own time when sharper). Every stage
    /// that starts or ends at this hop is then reported with bounds
    /// ([`PipelineSpec::stage_bound`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earliest: Option<String>,
    /// The hop is stamped by OpenTelemetry spans a collector started with `--otlp`
    /// receives: every span that matches gives the hop the span's start or end time, for
    /// the message its trace id (or each of its links' trace ids) names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span: Option<SpanMatch>,
}

/// Which OpenTelemetry spans stamp a hop ([`HopSpec::span`]): every criterion given must
/// hold, and at least one is given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SpanMatch {
    /// The resource's `service.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The span kind: `internal`, `server`, `client`, `producer` or `consumer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The span name; `*` stands for any run of characters (`"* process"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Span attributes that must be present with these values (an attribute's value as
    /// text: a string as is, an integer in decimal, `true` or `false`), e.g.
    /// `"messaging.destination.name" = "orders"`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub attributes: std::collections::BTreeMap<String, String>,
    /// Which of the span's times is the hop's stamp: `start` (default) or `end`. Two hops
    /// with the same match and different stamps take both from one span (a consumer's
    /// process span: `flow_in` at its start, `flow_out` at its end).
    #[serde(default = "SpanMatch::default_stamp")]
    pub stamp: String,
}

/// The span kinds a [`SpanMatch`] names, in OpenTelemetry's numbering (1 = internal).
pub const SPAN_KINDS: [&str; 5] = ["internal", "server", "client", "producer", "consumer"];

impl SpanMatch {
    fn default_stamp() -> String {
        "start".into()
    }

    /// The OTLP `SpanKind` number of [`Self::kind`] (1 internal … 5 consumer).
    #[must_use]
    pub fn kind_number(&self) -> Option<i32> {
        let k = self.kind.as_deref()?;
        SPAN_KINDS
            .iter()
            .position(|n| *n == k)
            .map(|i| i as i32 + 1)
    }

    /// Whether the stamp is the span's end.
    #[must_use]
    pub fn stamps_end(&self) -> bool {
        self.stamp == "end"
    }

    /// Why the match is unusable, if it is.
    fn problem(&self) -> Option<String> {
        if let Some(k) = &self.kind
            && self.kind_number().is_none()
        {
            return Some(format!(
                "`kind` {k:?} is not one of {}",
                SPAN_KINDS.join(", ")
            ));
        }
        if !matches!(self.stamp.as_str(), "start" | "end") {
            return Some(format!(
                "`stamp` {:?} is neither \"start\" nor \"end\"",
                self.stamp
            ));
        }
        let empty = |o: &Option<String>| o.as_deref().is_none_or(str::is_empty);
        if empty(&self.service)
            && empty(&self.kind)
            && empty(&self.name)
            && self.attributes.is_empty()
        {
            return Some(
                "matches every span: give at least one of `service`, `kind`, `name`, `attributes`"
                    .into(),
            );
        }
        None
    }

    /// Whether `name` fits [`Self::name`]'s pattern (`*`: any run of characters); true
    /// when no name is given.
    #[must_use]
    pub fn name_fits(&self, name: impl AsRef<[u8]>) -> bool {
        self.name
            .as_deref()
            .is_none_or(|p| glob(p.as_bytes(), name.as_ref()))
    }
}

/// `text` fits `pattern`, where `*` stands for any run of bytes.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut back: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            back = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((bp, bt)) = back {
            p = bp + 1;
            t = bt + 1;
            back = Some((bp, bt + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|c| *c == b'*')
}

/// A stage one of whose hops is polled: its delta lies between the delta of `lower`'s
/// hops and that of `upper`'s (each a `(from, to)` pair of hop names), message by
/// message, so every statistic of the stage lies between the same statistic of the two
/// (percentiles, min, max and mean are monotone in the values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageBound {
    /// The delta at its smallest: from the `from` hop's latest instant to the `to` hop's
    /// earliest.
    pub lower: (String, String),
    /// The delta at its largest: from the `from` hop's earliest instant to the `to`
    /// hop's latest.
    pub upper: (String, String),
}

/// One component of a stage: a stage of the spec on the way from the stage's `from` hop
/// to its `to` hop, or two consecutive hops no stage joins ([`PipelineSpec::components`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Component {
    /// The spec's stage name, or `from → to` for two consecutive hops no stage joins.
    pub name: String,
    /// Hop it starts at.
    pub from: String,
    /// Hop it ends at.
    pub to: String,
    /// Whether it is a stage of the spec (else two consecutive hops).
    pub spec_stage: bool,
}

/// One stage: the difference of two hops' stamps, `to - from`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    /// Stage name as the report prints it; unique within the pipeline.
    pub name: String,
    /// Hop name the stage starts at.
    pub from: String,
    /// Hop name the stage ends at.
    pub to: String,
    /// One-line definition printed by the report.
    pub definition: String,
    /// Whether the stage is shown in the report's highlights.
    #[serde(default)]
    pub headline: bool,
}

/// Join settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinSpec {
    /// Milliseconds (collector monotonic clock) to wait, from a trace's first record, for
    /// its other records before emitting it as incomplete.
    #[serde(default = "default_window_ms")]
    pub window_ms: u64,
    /// Most traces pending at once; at this many the collector stops reading from probes.
    #[serde(default = "default_max_pending")]
    pub max_pending: usize,
    /// Seconds before the collector's start and after the current time outside which a
    /// stamp or intended time is implausible.
    #[serde(default = "default_plausible_window_s")]
    pub plausible_window_s: u64,
}

/// Parquet output settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    /// Rows after which a new file is started.
    #[serde(default = "default_roll_rows")]
    pub roll_rows: u64,
    /// Seconds after which a new file is started.
    #[serde(default = "default_roll_seconds")]
    pub roll_seconds: u64,
    /// Rows per row group.
    #[serde(default = "default_row_group_rows")]
    pub row_group_rows: usize,
    /// zstd compression level, 1..=22.
    #[serde(default = "default_zstd_level")]
    pub zstd_level: i32,
}

fn default_window_ms() -> u64 {
    10_000
}
fn default_max_pending() -> usize {
    2_000_000
}
fn default_plausible_window_s() -> u64 {
    3_600
}
fn default_roll_rows() -> u64 {
    1_000_000
}
fn default_roll_seconds() -> u64 {
    60
}
fn default_row_group_rows() -> usize {
    1_000_000
}
fn default_zstd_level() -> i32 {
    1
}

impl Default for JoinSpec {
    fn default() -> Self {
        Self {
            window_ms: default_window_ms(),
            max_pending: default_max_pending(),
            plausible_window_s: default_plausible_window_s(),
        }
    }
}

impl Default for OutputSpec {
    fn default() -> Self {
        Self {
            roll_rows: default_roll_rows(),
            roll_seconds: default_roll_seconds(),
            row_group_rows: default_row_group_rows(),
            zstd_level: default_zstd_level(),
        }
    }
}

impl PipelineSpec {
    /// Parses and validates a spec.
    ///
    /// # Errors
    /// [`SpecError::Toml`] for TOML syntax errors, unknown or missing fields (the message
    /// carries toml's line and column), any other variant for a spec that fails
    /// [`Self::validate`].
    pub fn from_toml_str(text: &str) -> Result<Self, SpecError> {
        let spec: Self = toml::from_str(text)?;
        spec.validate()?;
        Ok(spec)
    }

    /// The wire id of the hop at `index`: its `id`, or its index when it names none. The
    /// one place this rule is written; every reader and writer of ids asks here.
    ///
    /// # Panics
    /// When `index` is not a hop of the spec.
    #[must_use]
    pub fn hop_id(&self, index: usize) -> HopId {
        let hop = &self.hops[index];
        HopId(
            hop.id.unwrap_or_else(|| {
                u8::try_from(index).expect("a validated spec has at most 16 hops")
            }),
        )
    }

    /// The wire id of the hop named `name`, or `None` when the spec declares none.
    #[must_use]
    pub fn hop(&self, name: &str) -> Option<HopId> {
        let index = self.hops.iter().position(|h| h.name == name)?;
        Some(self.hop_id(index))
    }

    /// Each hop's name and wire id, in the spec's order.
    pub fn hop_ids(&self) -> impl Iterator<Item = (&str, HopId)> {
        (0..self.hops.len()).map(|i| (self.hops[i].name.as_str(), self.hop_id(i)))
    }

    /// The error of a hop the spec does not declare: it names the hop, the pipeline and
    /// every hop it does declare, so that the user sees what to write instead.
    #[must_use]
    pub fn undeclared(&self, name: &str) -> String {
        let declared: Vec<&str> = self.hops.iter().map(|h| h.name.as_str()).collect();
        format!(
            "hop {name:?} is not declared by the pipeline {:?} ({})",
            self.name,
            declared.join(", ")
        )
    }

    /// What is valid in a spec but most likely a mistake: a stage whose `from` hop comes
    /// after its `to` hop in the order of `[[hops]]` measures every message as negative.
    #[must_use]
    pub fn warnings(&self) -> Vec<String> {
        let position = |name: &str| self.hops.iter().position(|h| h.name == name);
        self.stages
            .iter()
            .filter(|st| matches!((position(&st.from), position(&st.to)), (Some(f), Some(t)) if f > t))
            .map(|st| {
                format!(
                    "stage {:?} runs backwards: `from` hop {:?} comes after `to` hop {:?} in the order of [[hops]], so its deltas will be negative; swap `from` and `to`, or list the hops in pipeline order",
                    st.name, st.from, st.to
                )
            })
            .collect()
    }

    /// The hop holding the earliest instant of polled hop `hop` (its `earliest`).
    #[must_use]
    pub fn earliest_of(&self, hop: &str) -> Option<&str> {
        self.hops
            .iter()
            .find(|h| h.name == hop)
            .and_then(|h| h.earliest.as_deref())
    }

    /// The components of `stage`, which chain from its `from` hop to its `to` hop: from
    /// the hop reached so far, the spec's stage (other than `stage`) that starts there and
    /// ends nearest on the way; where none leads on, the next hop of the pipeline (a hop
    /// that only holds another hop's earliest instant is not on the way). Their deltas add
    /// up to the stage's for every message with all their hops. A single component, the
    /// stage itself, when nothing splits it (its `from` does not come before its `to`).
    #[must_use]
    pub fn components(&self, stage: &StageSpec) -> Vec<Component> {
        let itself = || {
            vec![Component {
                name: stage.name.clone(),
                from: stage.from.clone(),
                to: stage.to.clone(),
                spec_stage: true,
            }]
        };
        let bounds_only: HashSet<&str> = self
            .hops
            .iter()
            .filter_map(|h| h.earliest.as_deref())
            .collect();
        let on_way: Vec<&str> = self
            .hops
            .iter()
            .map(|h| h.name.as_str())
            .filter(|h| !bounds_only.contains(h) || *h == stage.from || *h == stage.to)
            .collect();
        let pos = |hop: &str| on_way.iter().position(|h| *h == hop);
        let (Some(start), Some(end)) = (pos(&stage.from), pos(&stage.to)) else {
            return itself();
        };
        if start >= end {
            return itself();
        }
        let mut out = Vec::new();
        let mut at = start;
        while at < end {
            let here = on_way[at];
            let next_stage = self
                .stages
                .iter()
                .filter(|s| s.name != stage.name && s.from == here)
                .filter_map(|s| pos(&s.to).filter(|&p| p > at && p <= end).map(|p| (p, s)))
                .min_by_key(|(p, _)| *p);
            let (next, c) = match next_stage {
                Some((p, s)) => (
                    p,
                    Component {
                        name: s.name.clone(),
                        from: s.from.clone(),
                        to: s.to.clone(),
                        spec_stage: true,
                    },
                ),
                None => (
                    at + 1,
                    Component {
                        name: format!("{here} → {}", on_way[at + 1]),
                        from: here.to_owned(),
                        to: on_way[at + 1].to_owned(),
                        spec_stage: false,
                    },
                ),
            };
            out.push(c);
            at = next;
        }
        out
    }

    /// The bounds of `stage` when one of its hops is polled (has an `earliest`); `None`
    /// when neither is. (A stage between two stamps of one poll, the poll's send and its
    /// response, is exact: the analysis, which knows from the taps' announcements which
    /// hops one poll stamped, does not bound it.)
    #[must_use]
    pub fn stage_bound(&self, stage: &StageSpec) -> Option<StageBound> {
        let (from_e, to_e) = (self.earliest_of(&stage.from), self.earliest_of(&stage.to));
        if from_e.is_none() && to_e.is_none() {
            return None;
        }
        Some(StageBound {
            lower: (stage.from.clone(), to_e.unwrap_or(&stage.to).to_owned()),
            upper: (from_e.unwrap_or(&stage.from).to_owned(), stage.to.clone()),
        })
    }

    /// Reads, parses and validates a spec file.
    ///
    /// # Errors
    /// [`SpecError::Read`] when the file cannot be read, otherwise as
    /// [`Self::from_toml_str`]; those errors do not name the file, so callers add it.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, SpecError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| SpecError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml_str(&text)
    }

    /// The spec of [`DEFAULT_PIPELINE_TOML`].
    ///
    /// # Panics
    /// Never: a test checks that the constant parses and validates.
    #[must_use]
    pub fn default_pipeline() -> Self {
        Self::from_toml_str(DEFAULT_PIPELINE_TOML).expect("the default pipeline spec is valid")
    }

    /// A pipeline of `hops` in order (ids 0, 1, ...), every hop expected, with a stage
    /// between each pair of neighbours (`a -> b`) and a headline stage over the whole chain
    /// (`total (first -> last)`).
    ///
    /// # Errors
    /// As [`Self::validate`] (fewer than 2 or more than 16 hops, bad or repeated names).
    pub fn chain(name: &str, hops: &[String]) -> Result<Self, SpecError> {
        let mut stages: Vec<StageSpec> = hops
            .windows(2)
            .map(|w| StageSpec {
                name: format!("{} -> {}", w[0], w[1]),
                from: w[0].clone(),
                to: w[1].clone(),
                definition: format!("From the {} stamp to the {} stamp.", w[0], w[1]),
                headline: false,
            })
            .collect();
        if let (Some(first), Some(last)) = (hops.first(), hops.last()) {
            stages.push(StageSpec {
                name: format!("total ({first} -> {last})"),
                from: first.clone(),
                to: last.clone(),
                definition: format!("From the {first} stamp to the {last} stamp."),
                headline: true,
            });
        }
        let spec = Self {
            name: name.to_owned(),
            expected: None,
            hops: hops
                .iter()
                .enumerate()
                .map(|(i, h)| HopSpec {
                    name: h.clone(),
                    id: u8::try_from(i).ok(),
                    description: String::new(),
                    earliest: None,
                    span: None,
                })
                .collect(),
            stages,
            join: JoinSpec::default(),
            output: OutputSpec::default(),
        };
        spec.validate()?;
        Ok(spec)
    }

    /// Checks the rules of every field: hop names non-empty, unique and `[a-z0-9_]+`;
    /// wire ids unique; 1 to 16 hops; `expected` names declared hops; stage names
    /// non-empty and unique; stage hops declared and different; positive window,
    /// `max_pending`, roll limits and row-group size; zstd level 1 to 22.
    ///
    /// # Errors
    /// The first rule broken, as a [`SpecError`] naming the field and value.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.resolve().map(drop)
    }

    /// Validates the spec and resolves names to hop indices.
    ///
    /// # Errors
    /// As [`Self::validate`].
    pub fn resolve(&self) -> Result<ResolvedSpec, SpecError> {
        ResolvedSpec::new(self)
    }
}

/// A stage with its hops resolved to hop indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedStage {
    /// Stage name.
    pub name: String,
    /// Index of the hop the stage starts at.
    pub from_index: usize,
    /// Index of the hop the stage ends at.
    pub to_index: usize,
    /// One-line definition.
    pub definition: String,
    /// Whether the report's highlights show it.
    pub headline: bool,
}

/// A validated spec in the form the collector uses. Hops are addressed by *index* (their
/// position in the spec, 0..16), which is what the join's bit masks and stamp arrays use;
/// [`Self::hop_index`] maps a record's wire id to it.
#[derive(Debug, Clone)]
pub struct ResolvedSpec {
    spec: PipelineSpec,
    hop_names: Vec<String>,
    hop_ids: Vec<HopId>,
    index_by_id: [Option<u8>; 256],
    expected_mask: u16,
    stages: Vec<ResolvedStage>,
}

impl ResolvedSpec {
    /// Validates `spec` and resolves it.
    ///
    /// # Errors
    /// As [`PipelineSpec::validate`].
    pub fn new(spec: &PipelineSpec) -> Result<Self, SpecError> {
        if spec.name.trim().is_empty() {
            return Err(SpecError::EmptyName);
        }
        let count = spec.hops.len();
        if count == 0 || count > MAX_HOPS {
            return Err(SpecError::HopCount { count });
        }
        let mut index_by_id = [None; 256];
        let mut hop_names = Vec::with_capacity(count);
        let mut hop_ids = Vec::with_capacity(count);
        for (index, hop) in (0u8..).zip(&spec.hops) {
            if hop.name.is_empty() {
                return Err(SpecError::EmptyHopName {
                    index: usize::from(index),
                });
            }
            if !hop
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                return Err(SpecError::BadHopName {
                    name: hop.name.clone(),
                });
            }
            if hop_names.contains(&hop.name) {
                return Err(SpecError::DuplicateHopName {
                    name: hop.name.clone(),
                });
            }
            let HopId(id) = spec.hop_id(usize::from(index));
            if let Some(other) = index_by_id[usize::from(id)] {
                return Err(SpecError::DuplicateHopId {
                    name: hop.name.clone(),
                    id,
                    other: spec.hops[usize::from(other)].name.clone(),
                    defaulted: hop.id.is_none(),
                    other_defaulted: spec.hops[usize::from(other)].id.is_none(),
                });
            }
            index_by_id[usize::from(id)] = Some(index);
            hop_names.push(hop.name.clone());
            hop_ids.push(HopId(id));
        }
        let declared = || hop_names.join(", ");
        let find = |name: &str| hop_names.iter().position(|h| h == name);
        for hop in &spec.hops {
            let Some(e) = &hop.earliest else {
                continue;
            };
            let bad = |why: String| SpecError::BadEarliest {
                hop: hop.name.clone(),
                earliest: e.clone(),
                why,
            };
            let Some(i) = find(e) else {
                return Err(bad(format!("is not declared (hops: {})", declared())));
            };
            if *e == hop.name {
                return Err(bad("is the hop itself".into()));
            }
            if spec.hops[i].earliest.is_some() {
                return Err(bad(
                    "has an `earliest` of its own: name the hop that holds the earliest instant"
                        .into(),
                ));
            }
        }

        for hop in &spec.hops {
            if let Some(why) = hop.span.as_ref().and_then(SpanMatch::problem) {
                return Err(SpecError::BadSpanMatch {
                    hop: hop.name.clone(),
                    why,
                });
            }
        }

        let all_mask = all_hops_mask(count);
        let expected_mask = match &spec.expected {
            None => all_mask,
            Some(names) if names.is_empty() => return Err(SpecError::EmptyExpected),
            Some(names) => {
                let mut mask = 0u16;
                for name in names {
                    let Some(i) = find(name) else {
                        return Err(SpecError::UnknownExpectedHop {
                            name: name.clone(),
                            hops: declared(),
                        });
                    };
                    if mask & (1 << i) != 0 {
                        return Err(SpecError::DuplicateExpectedHop { name: name.clone() });
                    }
                    mask |= 1 << i;
                }
                mask
            }
        };

        let mut stage_names = HashSet::new();
        // Every column of the results a stage's column could clash with.
        let mut columns: std::collections::HashMap<String, String> = [
            "run_id",
            "publisher",
            "stream",
            "sequence",
            "metric_count",
            "intended_ns",
            "status",
            "missing_mask",
            "flags",
            "otel_trace_id",
        ]
        .into_iter()
        .map(|c| (c.to_owned(), format!("the trace column `{c}`")))
        .collect();
        for h in &spec.hops {
            columns.insert(
                crate::schema::hop_column(&h.name),
                format!("hop \"{}\"", h.name),
            );
        }
        let mut stages = Vec::with_capacity(spec.stages.len());
        for (index, stage) in spec.stages.iter().enumerate() {
            if stage.name.trim().is_empty() {
                return Err(SpecError::EmptyStageName { index });
            }
            if !stage_names.insert(stage.name.as_str()) {
                return Err(SpecError::DuplicateStageName {
                    name: stage.name.clone(),
                });
            }
            let column = crate::schema::stage_column(&stage.name);
            if let Some(other) = columns.get(&column) {
                return Err(SpecError::StageColumnClash {
                    stage: stage.name.clone(),
                    column,
                    other: other.clone(),
                });
            }
            columns.insert(column, format!("stage \"{}\"", stage.name));
            if spec.stage_bound(stage).is_some() {
                let (lower, upper) = crate::schema::stage_bound_columns(&stage.name);
                for c in [lower, upper] {
                    if let Some(other) = columns.get(&c) {
                        return Err(SpecError::StageColumnClash {
                            stage: stage.name.clone(),
                            column: c,
                            other: other.clone(),
                        });
                    }
                    columns.insert(c, format!("the bounds of stage \"{}\"", stage.name));
                }
            }
            let resolve = |field: &'static str, hop: &str| {
                find(hop).ok_or_else(|| SpecError::UnknownStageHop {
                    stage: stage.name.clone(),
                    field,
                    hop: hop.to_owned(),
                    hops: declared(),
                })
            };
            let from_index = resolve("from", &stage.from)?;
            let to_index = resolve("to", &stage.to)?;
            if from_index == to_index {
                return Err(SpecError::SameHop {
                    stage: stage.name.clone(),
                    hop: stage.from.clone(),
                });
            }
            stages.push(ResolvedStage {
                name: stage.name.clone(),
                from_index,
                to_index,
                definition: stage.definition.clone(),
                headline: stage.headline,
            });
        }

        let zero = |value: u64, field: &'static str| {
            if value == 0 {
                Err(SpecError::Zero { field })
            } else {
                Ok(())
            }
        };
        zero(spec.join.window_ms, "join.window_ms")?;
        zero(spec.join.max_pending as u64, "join.max_pending")?;
        zero(spec.join.plausible_window_s, "join.plausible_window_s")?;
        zero(spec.output.roll_rows, "output.roll_rows")?;
        zero(spec.output.roll_seconds, "output.roll_seconds")?;
        zero(spec.output.row_group_rows as u64, "output.row_group_rows")?;
        if !(1..=22).contains(&spec.output.zstd_level) {
            return Err(SpecError::ZstdLevel(spec.output.zstd_level));
        }

        Ok(Self {
            spec: spec.clone(),
            hop_names,
            hop_ids,
            index_by_id,
            expected_mask,
            stages,
        })
    }

    /// The spec this was resolved from.
    #[must_use]
    pub fn spec(&self) -> &PipelineSpec {
        &self.spec
    }

    /// Pipeline name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The index of the hop with wire id `id`, or `None` for an id the spec does not
    /// declare. O(1).
    #[inline]
    #[must_use]
    pub fn hop_index(&self, id: HopId) -> Option<usize> {
        self.index_by_id[usize::from(id.0)].map(usize::from)
    }

    /// Number of hops (1 to 16).
    #[must_use]
    pub fn hop_count(&self) -> usize {
        self.hop_names.len()
    }

    /// Hop names in pipeline order (by index).
    #[must_use]
    pub fn hop_names(&self) -> &[String] {
        &self.hop_names
    }

    /// Wire ids by hop index.
    #[must_use]
    pub fn hop_ids(&self) -> &[HopId] {
        &self.hop_ids
    }

    /// The wire id of the hop named `name`, or `None` when the spec declares none.
    #[must_use]
    pub fn hop(&self, name: &str) -> Option<HopId> {
        let index = self.hop_names.iter().position(|h| h == name)?;
        Some(self.hop_ids[index])
    }

    /// The hops every trace must pass: bit `i` is hop index `i`.
    #[must_use]
    pub fn expected_mask(&self) -> u16 {
        self.expected_mask
    }

    /// Every declared hop: bit `i` is hop index `i`.
    #[must_use]
    pub fn all_hops_mask(&self) -> u16 {
        all_hops_mask(self.hop_count())
    }

    /// The names of the hops in `mask` (bit `i` = hop index `i`), in pipeline order.
    #[must_use]
    pub fn mask_names(&self, mask: u16) -> Vec<&str> {
        self.hop_names
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, n)| n.as_str())
            .collect()
    }

    /// Stages in report order.
    #[must_use]
    pub fn stages(&self) -> &[ResolvedStage] {
        &self.stages
    }

    /// The join window in nanoseconds (saturating).
    #[must_use]
    pub fn window_ns(&self) -> u64 {
        self.spec.join.window_ms.saturating_mul(1_000_000)
    }

    /// Most pending traces before back-pressure.
    #[must_use]
    pub fn max_pending(&self) -> usize {
        self.spec.join.max_pending
    }

    /// The plausibility window in nanoseconds (saturating).
    #[must_use]
    pub fn plausible_window_ns(&self) -> i64 {
        i64::try_from(
            self.spec
                .join
                .plausible_window_s
                .saturating_mul(1_000_000_000),
        )
        .unwrap_or(i64::MAX)
    }

    /// Output settings.
    #[must_use]
    pub fn output(&self) -> &OutputSpec {
        &self.spec.output
    }
}

fn all_hops_mask(count: usize) -> u16 {
    if count >= 16 {
        u16::MAX
    } else {
        (1u16 << count) - 1
    }
}

#[cfg(test)]
mod tests;
