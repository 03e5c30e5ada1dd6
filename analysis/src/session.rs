//! Runs on disk and the DataFusion session over them.
//!
//! [`RunSet::open`] reads one or many run directories (each with the `run.json` a
//! collector wrote); [`RunSet::session`] registers, over all of them:
//!
//! | table | rows |
//! | --- | --- |
//! | `traces` | one per message: the collector's columns (`run_id`, `publisher`, `stream`, `sequence`, `metric_count`, `intended_ns`, one `<hop>_ns` per hop, `status`, `missing_mask`, `flags`, `otel_trace_id`) and one Int64 `<stage>_ns` column per stage of the pipeline spec (`to - from`, NULL when a hop is missing; e.g. `total_ingestion_ns`) |
//! | `traces_raw` | the Parquet files as written, without stage columns |
//! | `clock` | every clock status a probe host sent, with `run_id` |
//! | `probes` | every counters frame of every probe, with `run_id` |
//! | `runs` | one per run: id, start, end, pipeline, accounting |
//! | `stages` | one per (run, stage): name, hops, definition, headline |
//!
//! the HDR functions of [`crate::hdr`], and the table functions `tail(stage, q)` and
//! `attribution(stage, q)`
//! ([`crate::tail::table`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, RecordBatch, StringArray, TimestampNanosecondArray, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use hoptrace_format::run::RunSummary;
use hoptrace_format::schema::hop_column;
pub use hoptrace_format::schema::stage_column;
use hoptrace_format::spec::{PipelineSpec, StageSpec};

use crate::AnalysisError;

/// One run directory.
#[derive(Debug, Clone)]
pub struct Run {
    /// The directory.
    pub dir: PathBuf,
    /// Its `run.json` (for a collector group's run, every member's files merged).
    pub summary: RunSummary,
    /// A collector group's run: the part files of its valid segments and the member
    /// directory holding `clock.parquet` and `probes.parquet`.
    pub group: Option<(Vec<PathBuf>, PathBuf)>,
    /// Part files in `traces/` that `run.json` does not account for (neither written by
    /// its collector nor recovered from an earlier one): a stray or copied file. Left out
    /// of [`Run::part_files`] unless [`OpenOptions::unlisted`] asked for them.
    pub unlisted: Vec<PathBuf>,
    /// Whether [`Run::unlisted`] is read too.
    pub read_unlisted: bool,
}

impl Run {
    /// Reads `dir/run.json`.
    ///
    /// # Errors
    /// [`AnalysisError::NotARun`] when there is no `run.json`, [`AnalysisError::RunJson`]
    /// when it does not parse.
    pub fn open(dir: &Path) -> Result<Self, AnalysisError> {
        if hoptrace_format::group::is_group_run(dir) {
            let g = hoptrace_format::group::open_group(dir)
                .map_err(|e| AnalysisError::Group(e.to_string()))?;
            if !g.set_aside.is_empty() {
                tracing::info!(
                    files = g.set_aside.len(),
                    "{}: set aside the files of segments a later owner repeated",
                    dir.display()
                );
            }
            return Ok(Self {
                dir: dir.to_owned(),
                summary: g.summary,
                group: Some((g.parts, g.tables_dir)),
                unlisted: Vec::new(),
                read_unlisted: false,
            });
        }
        let path = dir.join("run.json");
        let text = std::fs::read_to_string(&path).map_err(|source| AnalysisError::NotARun {
            dir: dir.to_owned(),
            source,
        })?;
        let summary: RunSummary =
            serde_json::from_str(&text).map_err(|source| AnalysisError::RunJson {
                path: path.clone(),
                source,
            })?;
        let files = traces_files(dir);
        let missing: Vec<String> = summary
            .files
            .iter()
            .filter(|f| {
                !files
                    .iter()
                    .any(|p| p.file_name() == Some(std::ffi::OsStr::new(&f.name)))
            })
            .map(|f| f.name.clone())
            .collect();
        if !missing.is_empty() {
            return Err(AnalysisError::MissingFiles {
                dir: dir.to_owned(),
                missing,
            });
        }
        let (_, unlisted) = split_listed(&files, &summary);
        Ok(Self {
            dir: dir.to_owned(),
            summary,
            group: None,
            unlisted,
            read_unlisted: false,
        })
    }

    /// The directory holding the run's `clock.parquet`, `probes.parquet` and other
    /// tables.
    #[must_use]
    pub fn tables_dir(&self) -> &Path {
        self.group.as_ref().map_or(&self.dir, |(_, d)| d)
    }

    /// The run's part files, in order: those its `run.json` accounts for (and the
    /// unlisted ones when asked).
    #[must_use]
    pub fn part_files(&self) -> Vec<PathBuf> {
        if let Some((parts, _)) = &self.group {
            return parts.clone();
        }
        let all = traces_files(&self.dir);
        if self.read_unlisted {
            return all;
        }
        split_listed(&all, &self.summary).0
    }
}

/// Every `traces/*.parquet` of a run directory, sorted.
fn traces_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("traces"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// `part-NNNNN...` → NNNNN.
fn part_index(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    name.strip_prefix("part-")?.get(..5)?.parse().ok()
}

/// Splits a run's part files into those its `run.json` accounts for and the others. It
/// lists the files its collector wrote; the files an earlier, killed collector left are
/// counted in `recovered` and numbered below the first file of the collector that kept
/// them.
fn split_listed(files: &[PathBuf], summary: &RunSummary) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let listed: std::collections::HashSet<&str> =
        summary.files.iter().map(|f| f.name.as_str()).collect();
    let first_listed = summary
        .files
        .iter()
        .filter_map(|f| part_index(Path::new(&f.name)))
        .min();
    let mut recovered_left = summary.recovered.as_ref().map_or(0, |r| r.files);
    let (mut read, mut unlisted) = (Vec::new(), Vec::new());
    for f in files {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let earlier = part_index(f).is_some_and(|i| first_listed.is_none_or(|m| i < m));
        if listed.contains(name) {
            read.push(f.clone());
        } else if earlier && recovered_left > 0 {
            recovered_left -= 1;
            read.push(f.clone());
        } else {
            unlisted.push(f.clone());
        }
    }
    (read, unlisted)
}

/// What [`RunSet::open_with`] reads beyond the default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Read every run directory of a run id, not only the first: copies of a run are
    /// otherwise left out, so that no trace counts twice.
    pub duplicates: bool,
    /// Read part files a run's `run.json` does not account for.
    pub unlisted: bool,
}

/// Expands `*` and `?` in the last component of each path (shells expand unquoted globs
/// already; this is for quoted ones and for programs).
fn expand(pattern: &Path) -> Vec<PathBuf> {
    let text = pattern.to_string_lossy();
    if !text.contains(['*', '?', '[']) {
        return vec![pattern.to_owned()];
    }
    let mut out: Vec<PathBuf> = glob::glob(&text)
        .map(|paths| paths.flatten().collect())
        .unwrap_or_default();
    out.sort();
    out
}

/// The runs a query or report reads.
#[derive(Debug, Clone)]
pub struct RunSet {
    /// Runs, in the order given.
    pub runs: Vec<Run>,
    /// What was found but not read, or read though dubious: run directories a glob or
    /// folder matched that hold no finished run, copies of a run id, part files that
    /// `run.json` does not list. One line each, for the user.
    pub notes: Vec<String>,
}

impl RunSet {
    /// Opens every run directory in `paths` (globs allowed) with the default
    /// [`OpenOptions`]. A directory holding run directories (such as `runs/`) opens all of
    /// them.
    ///
    /// # Errors
    /// When a path is not a run, a `run.json` does not parse, nothing matched, or the runs'
    /// pipelines declare different hops (their traces cannot be one table).
    pub fn open<P: AsRef<Path>>(paths: &[P]) -> Result<Self, AnalysisError> {
        Self::open_with(paths, OpenOptions::default())
    }

    /// Opens every run directory in `paths` (globs allowed). A path named as such must
    /// be a run (or a folder of runs); directories a glob or a folder matches that hold
    /// no finished run (no `run.json`: a report folder, a run whose collector never
    /// finished) are skipped with a note. A run id met again (a copied run) is left out
    /// with a note unless `options.duplicates`; part files a `run.json` does not list are
    /// left out with a note unless `options.unlisted`.
    ///
    /// # Errors
    /// When a path is not a run, a `run.json` does not parse, nothing matched, or the runs'
    /// pipelines declare different hops (their traces cannot be one table).
    pub fn open_with<P: AsRef<Path>>(
        paths: &[P],
        options: OpenOptions,
    ) -> Result<Self, AnalysisError> {
        let is_run =
            |d: &Path| d.join("run.json").exists() || hoptrace_format::group::is_group_run(d);
        let mut runs = Vec::new();
        let mut notes = Vec::new();
        let skipped = |dir: &Path, notes: &mut Vec<String>| {
            if dir.join("traces").is_dir() {
                notes.push(format!(
                    "skipped {}: no run.json (its collector did not finish; running `hoptrace collect` again with its --run-id recovers the closed files)",
                    dir.display()
                ));
            } else {
                notes.push(format!("skipped {}: not a run directory", dir.display()));
            }
        };
        for p in paths {
            let pattern = p.as_ref();
            let globbed = pattern.to_string_lossy().contains(['*', '?', '[']);
            let matched = expand(pattern);
            if matched.is_empty() {
                return Err(AnalysisError::NoRuns(pattern.display().to_string()));
            }
            for dir in matched {
                if is_run(&dir) || !dir.is_dir() && !globbed {
                    runs.push(Run::open(&dir)?);
                    continue;
                }
                if !dir.is_dir() {
                    continue;
                }
                let mut children: Vec<PathBuf> = std::fs::read_dir(&dir)
                    .map_err(|source| AnalysisError::NotARun {
                        dir: dir.clone(),
                        source,
                    })?
                    .flatten()
                    .map(|e| e.path())
                    .filter(|c| c.is_dir())
                    .collect();
                children.sort();
                let (found, others): (Vec<PathBuf>, Vec<PathBuf>) =
                    children.into_iter().partition(|c| is_run(c));
                if found.is_empty() {
                    if globbed {
                        skipped(&dir, &mut notes);
                        continue;
                    }
                    runs.push(Run::open(&dir)?);
                }
                for c in others.iter().filter(|c| c.join("traces").is_dir()) {
                    skipped(c, &mut notes);
                }
                for c in found {
                    runs.push(Run::open(&c)?);
                }
            }
        }
        // One run id, one run: a copy of a run directory would count its traces twice.
        let mut seen: Vec<(String, PathBuf)> = Vec::new();
        runs.retain(|r| {
            let id = &r.summary.run_id;
            match seen.iter().find(|(s, _)| s == id) {
                Some((_, first)) => {
                    notes.push(format!(
                        "run id {id:?} is in both {} and {}: {}",
                        first.display(),
                        r.dir.display(),
                        if options.duplicates {
                            "reading both (--duplicates), its traces count twice"
                        } else {
                            "reading the first only (--duplicates reads both)"
                        }
                    ));
                    options.duplicates
                }
                None => {
                    seen.push((id.clone(), r.dir.clone()));
                    true
                }
            }
        });
        for r in &mut runs {
            r.read_unlisted = options.unlisted;
            if !r.unlisted.is_empty() {
                notes.push(format!(
                    "{} holds {} part file(s) that its run.json does not list ({}): {}",
                    r.dir.display(),
                    r.unlisted.len(),
                    r.unlisted
                        .iter()
                        .filter_map(|f| f.file_name())
                        .map(|n| n.to_string_lossy().into_owned())
                        .collect::<Vec<_>>()
                        .join(", "),
                    if options.unlisted {
                        "reading them too (--unlisted)"
                    } else {
                        "left out (--unlisted reads them)"
                    }
                ));
            }
        }
        let Some(first) = runs.first() else {
            return Err(AnalysisError::NoRuns(
                paths
                    .iter()
                    .map(|p| p.as_ref().display().to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
            ));
        };
        // Hops are the same when their names and ids are; descriptions may differ.
        let hop_ids = |r: &Run| -> String {
            r.summary
                .pipeline
                .hop_ids()
                .map(|(name, id)| format!("{name}={}", id.0))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let hops = hop_ids(first);
        if let Some(other) = runs.iter().find(|r| hop_ids(r) != hops) {
            return Err(AnalysisError::Mismatch(format!(
                "{} declares hops [{hops}] but {} declares [{}]; open them separately",
                first.dir.display(),
                other.dir.display(),
                hop_ids(other)
            )));
        }
        Ok(Self { runs, notes })
    }

    /// The pipeline of the first run (all runs share its hops).
    #[must_use]
    pub fn pipeline(&self) -> &PipelineSpec {
        &self.runs[0].summary.pipeline
    }

    /// The stages the pipeline's polled hops bound ([`crate::bounds`]): a stage whose
    /// two hops one probe connection announced (a poll's send and its response) is exact.
    #[must_use]
    pub(crate) fn bound_stages(&self) -> crate::bounds::BoundStages {
        crate::bounds::BoundStages::new(self.pipeline(), |st| {
            self.runs
                .iter()
                .flat_map(|r| r.summary.probes.iter())
                .any(|p| p.hops.contains(&st.from) && p.hops.contains(&st.to))
        })
    }

    /// Every part file of every run.
    #[must_use]
    pub fn part_files(&self) -> Vec<PathBuf> {
        self.runs.iter().flat_map(Run::part_files).collect()
    }

    pub(crate) async fn register_traces(&self, ctx: &SessionContext) -> Result<(), AnalysisError> {
        let files: Vec<String> = self
            .part_files()
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if files.is_empty() {
            let hops: Vec<String> = self
                .pipeline()
                .hops
                .iter()
                .map(|h| h.name.clone())
                .collect();
            let schema = hoptrace_format::schema::traces_schema(&hops);
            ctx.register_batch("traces_raw", RecordBatch::new_empty(schema))?;
        } else {
            for f in &files {
                check_parquet(Path::new(f))?;
            }
            let df = ctx
                .read_parquet(files, ParquetReadOptions::default())
                .await?;
            ctx.register_table("traces_raw", df.into_view())?;
        }
        let mut select = String::from("SELECT *");
        for stage in &self.pipeline().stages {
            select.push_str(&format!(
                ", {} AS {}",
                stage_expr(stage),
                quote_ident(&stage_column(&stage.name))
            ));
        }
        // A stage with a polled hop: its deltas at the earliest and at the latest instants
        // the stamps allow, as `<stage>_lower_ns` and `<stage>_upper_ns`.
        let bounds = self.bound_stages();
        for (stage, of) in self.pipeline().stages.iter().zip(&bounds.of) {
            let Some((lo, hi)) = of else {
                continue;
            };
            let (lower, upper) = hoptrace_format::schema::stage_bound_columns(&stage.name);
            for (j, name) in [(*lo, lower), (*hi, upper)] {
                select.push_str(&format!(
                    ", {} AS {}",
                    stage_expr(&bounds.scan[j]),
                    quote_ident(&name)
                ));
            }
        }
        select.push_str(" FROM traces_raw");
        let view = ctx.sql(&select).await?;
        ctx.register_table("traces", view.into_view())?;
        Ok(())
    }

    /// Registers `name` as the union of every run's `name.parquet` with a `run_id` column.
    pub(crate) async fn register_small(
        &self,
        ctx: &SessionContext,
        name: &str,
        empty: &Schema,
    ) -> Result<(), AnalysisError> {
        let mut parts = Vec::new();
        for (i, run) in self.runs.iter().enumerate() {
            let path = run.tables_dir().join(format!("{name}.parquet"));
            if !path.exists() {
                continue;
            }
            check_parquet(&path)?;
            let df = ctx
                .read_parquet(
                    path.to_string_lossy().into_owned(),
                    ParquetReadOptions::default(),
                )
                .await?;
            let table = format!("{name}_{i}");
            ctx.register_table(table.as_str(), df.into_view())?;
            parts.push(format!(
                "SELECT {} AS run_id, * FROM {table}",
                quote_literal(&run.summary.run_id)
            ));
        }
        if parts.is_empty() {
            let mut fields = vec![Field::new("run_id", DataType::Utf8, false)];
            fields.extend(empty.fields().iter().map(|f| f.as_ref().clone()));
            ctx.register_batch(name, RecordBatch::new_empty(Arc::new(Schema::new(fields))))?;
            return Ok(());
        }
        let view = ctx.sql(&parts.join(" UNION ALL BY NAME ")).await?;
        ctx.register_table(name, view.into_view())?;
        Ok(())
    }

    pub(crate) fn runs_batch(&self) -> RecordBatch {
        let s = |f: &dyn Fn(&RunSummary) -> String| -> ArrayRef {
            Arc::new(StringArray::from_iter_values(
                self.runs.iter().map(|r| f(&r.summary)),
            ))
        };
        let ts = |f: &dyn Fn(&RunSummary) -> i64| -> ArrayRef {
            Arc::new(TimestampNanosecondArray::from_iter_values(
                self.runs.iter().map(|r| f(&r.summary)),
            ))
        };
        let n = |f: &dyn Fn(&RunSummary) -> u64| -> ArrayRef {
            Arc::new(UInt64Array::from_iter_values(
                self.runs.iter().map(|r| f(&r.summary)),
            ))
        };
        let sum = |f: fn(&hoptrace_format::run::PublisherAccount) -> u64| {
            move |r: &RunSummary| r.accounting.publishers.iter().map(f).sum::<u64>()
        };
        let tsf = || DataType::Timestamp(TimeUnit::Nanosecond, None);
        let schema = Schema::new(vec![
            Field::new("run_id", DataType::Utf8, false),
            Field::new("dir", DataType::Utf8, false),
            Field::new("pipeline", DataType::Utf8, false),
            Field::new("started_ns", tsf(), false),
            Field::new("ended_ns", tsf(), false),
            Field::new("sent", DataType::UInt64, false),
            Field::new("sent_metrics", DataType::UInt64, false),
            Field::new("complete", DataType::UInt64, false),
            Field::new("incomplete", DataType::UInt64, false),
            Field::new("unseen", DataType::UInt64, false),
            Field::new("records_lost_by_probes", DataType::UInt64, false),
            Field::new("adds_up", DataType::Boolean, false),
            Field::new("collector_host", DataType::Utf8, false),
        ]);
        let dirs: ArrayRef = Arc::new(StringArray::from_iter_values(
            self.runs.iter().map(|r| r.dir.display().to_string()),
        ));
        let columns = vec![
            s(&|r| r.run_id.clone()),
            dirs,
            s(&|r| r.pipeline.name.clone()),
            ts(&|r| r.started_unix_ns),
            ts(&|r| r.ended_unix_ns),
            n(&sum(|p| p.sent)),
            n(&sum(|p| p.sent_metrics)),
            n(&sum(|p| p.complete)),
            n(&sum(|p| p.incomplete)),
            n(&sum(|p| p.unseen)),
            n(&|r| r.accounting.records_lost_by_probes),
            Arc::new(BooleanArray::from_iter(
                self.runs.iter().map(|r| Some(r.summary.accounting.adds_up)),
            )),
            s(&|r| r.collector_host.host.clone()),
        ];
        RecordBatch::try_new(Arc::new(schema), columns).expect("columns match the schema")
    }

    pub(crate) fn stages_batch(&self) -> RecordBatch {
        let rows: Vec<(&str, &StageSpec)> = self
            .runs
            .iter()
            .flat_map(|r| {
                r.summary
                    .pipeline
                    .stages
                    .iter()
                    .map(|s| (r.summary.run_id.as_str(), s))
            })
            .collect();
        let col = |f: &dyn Fn(&str, &StageSpec) -> String| -> ArrayRef {
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|(r, s)| f(r, s)),
            ))
        };
        let schema = Schema::new(vec![
            Field::new("run_id", DataType::Utf8, false),
            Field::new("name", DataType::Utf8, false),
            Field::new("column", DataType::Utf8, false),
            Field::new("from_hop", DataType::Utf8, false),
            Field::new("to_hop", DataType::Utf8, false),
            Field::new("definition", DataType::Utf8, false),
            Field::new("headline", DataType::Boolean, false),
        ]);
        let columns = vec![
            col(&|r, _| r.to_owned()),
            col(&|_, s| s.name.clone()),
            col(&|_, s| stage_column(&s.name)),
            col(&|_, s| s.from.clone()),
            col(&|_, s| s.to.clone()),
            col(&|_, s| s.definition.clone()),
            Arc::new(BooleanArray::from_iter(
                rows.iter().map(|(_, s)| Some(s.headline)),
            )),
        ];
        RecordBatch::try_new(Arc::new(schema), columns).expect("columns match the schema")
    }
}

/// Reads a Parquet footer so a truncated or foreign file is named in the error.
fn check_parquet(path: &Path) -> Result<(), AnalysisError> {
    let bad = |reason: String| AnalysisError::BadParquet {
        path: path.to_owned(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    parquet::file::reader::SerializedFileReader::new(file)
        .map(drop)
        .map_err(|e| bad(e.to_string()))
}

/// The SQL expression of a stage's delta in ns over `traces_raw` columns.
#[must_use]
pub fn stage_expr(stage: &StageSpec) -> String {
    format!(
        "(CAST({} AS BIGINT) - CAST({} AS BIGINT))",
        quote_ident(&hop_column(&stage.to)),
        quote_ident(&hop_column(&stage.from))
    )
}

/// A double-quoted SQL identifier.
#[must_use]
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// A single-quoted SQL string literal.
#[must_use]
pub fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}
