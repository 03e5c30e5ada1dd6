//! Why a pipeline spec was refused.

use std::path::PathBuf;

use hoptrace_protocol::MAX_HOPS;

/// Why a pipeline spec was refused. Each variant names the offending field and value.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The spec file could not be read: check the path and its permissions.
    #[error("cannot read pipeline spec {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, or a field is unknown, missing or of the wrong type: fix the spot the
    /// message points at (line and column).
    #[error("invalid pipeline spec: {0}")]
    Toml(#[from] toml::de::Error),
    /// A hop's `[hops.span]` cannot be used: fix the field the message names.
    #[error("hop \"{hop}\": `span` {why}")]
    BadSpanMatch {
        /// The hop.
        hop: String,
        /// What is wrong.
        why: String,
    },
    /// `name` is empty: name the pipeline, the reports print it.
    #[error("`name` is empty: give the pipeline a name")]
    EmptyName,
    /// Too few or too many hops: declare between 1 and 16 `[[hops]]`.
    #[error("`hops` declares {count} hops; declare between 1 and {MAX_HOPS}")]
    HopCount {
        /// Hops declared.
        count: usize,
    },
    /// A hop without a name: give every `[[hops]]` a `name`.
    #[error("hop #{index}: `name` is empty")]
    EmptyHopName {
        /// Position of the hop, from 0.
        index: usize,
    },
    /// A hop name with characters other than `a-z`, `0-9` and `_`: rename the hop.
    #[error("hop \"{name}\": `name` may only contain a-z, 0-9 and _")]
    BadHopName {
        /// The name.
        name: String,
    },
    /// Two hops with the same name: rename one.
    #[error("hop \"{name}\" is declared twice")]
    DuplicateHopName {
        /// The name.
        name: String,
    },
    /// Two hops with the same wire id (explicit, or defaulted to the hop's index): give
    /// one of them another `id`.
    #[error(
        "hop \"{name}\": `id` {id}{} is already used by hop \"{other}\"{}: give one of them another `id` (0-255)",
        if *defaulted { " (its position in [[hops]], counting from 0: a hop without `id` takes its position)" } else { "" },
        if *other_defaulted { " (its position in [[hops]], as it gives no `id`)" } else { "" }
    )]
    DuplicateHopId {
        /// The later hop.
        name: String,
        /// The id.
        id: u8,
        /// The earlier hop with that id.
        other: String,
        /// The later hop gives no `id`: it defaulted to its index.
        defaulted: bool,
        /// The earlier hop gives no `id` either.
        other_defaulted: bool,
    },
    /// `expected` is an empty list: list at least one hop, or leave `expected` out to
    /// expect every hop.
    #[error("`expected` is empty: list at least one hop, or leave it out to expect all hops")]
    EmptyExpected,
    /// `expected` names a hop that `[[hops]]` does not declare: fix the name or declare it.
    #[error("`expected`: hop \"{name}\" is not declared (hops: {hops})")]
    UnknownExpectedHop {
        /// The name.
        name: String,
        /// The declared hops, comma-separated.
        hops: String,
    },
    /// `expected` lists a hop twice: remove one.
    #[error("`expected` lists hop \"{name}\" twice")]
    DuplicateExpectedHop {
        /// The name.
        name: String,
    },
    /// A stage without a name: give every `[[stages]]` a `name`.
    #[error("stage #{index}: `name` is empty")]
    EmptyStageName {
        /// Position of the stage, from 0.
        index: usize,
    },
    /// Two stages with the same name: rename one.
    #[error("stage \"{name}\" is declared twice")]
    DuplicateStageName {
        /// The name.
        name: String,
    },
    /// A stage's column in the results (`<slug of its name>_ns`) is already a column: a
    /// hop's, another stage's, or one of the trace columns. Rename the stage.
    #[error("stage \"{stage}\": its column `{column}` would clash with {other}; rename the stage")]
    StageColumnClash {
        /// The stage.
        stage: String,
        /// The column its name makes.
        column: String,
        /// What already has that column.
        other: String,
    },
    /// A stage's `from` or `to` names an undeclared hop: fix the name or declare the hop.
    #[error("stage \"{stage}\": `{field}` hop \"{hop}\" is not declared (hops: {hops})")]
    UnknownStageHop {
        /// The stage.
        stage: String,
        /// `from` or `to`.
        field: &'static str,
        /// The undeclared name.
        hop: String,
        /// The declared hops, comma-separated.
        hops: String,
    },
    /// A stage from a hop to itself, always 0: pick two different hops.
    #[error(
        "stage \"{stage}\": `from` and `to` are both \"{hop}\"; a stage spans two different hops"
    )]
    SameHop {
        /// The stage.
        stage: String,
        /// The hop.
        hop: String,
    },
    /// A hop's `earliest` names no declared hop, itself, or a hop that has an `earliest`
    /// of its own: name the hop the tap reports as the earliest instant.
    #[error("hop \"{hop}\": `earliest` \"{earliest}\" {why}")]
    BadEarliest {
        /// The polled hop.
        hop: String,
        /// What its `earliest` names.
        earliest: String,
        /// What is wrong with it.
        why: String,
    },
    /// A setting that must be positive is 0: raise it.
    #[error("`{field}` is 0; it must be greater than 0")]
    Zero {
        /// The setting, e.g. `join.window_ms`.
        field: &'static str,
    },
    /// A zstd level zstd does not have: use 1 to 22.
    #[error("`output.zstd_level` is {0}; use 1 (fastest) to 22 (smallest)")]
    ZstdLevel(i32),
}
