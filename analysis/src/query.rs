//! The SQL session over a run set: every table registered (`traces` with its stage and
//! bound columns, `clock`, `probes`, `runs`, `stages`, and the sweep's `cells`) and the
//! HDR functions. It sits above the sweep, whose cell files it reads, so that the run set
//! itself ([`crate::session`]) depends on nothing that builds on it.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Float64Array, RecordBatch, StringArray, TimestampNanosecondArray,
    UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::AnalysisError;
use crate::session::RunSet;

impl RunSet {
    /// A session with this set's tables and the HDR functions registered.
    ///
    /// # Errors
    /// When a Parquet file does not read (truncated, not Parquet, another schema).
    pub async fn session(&self) -> Result<SessionContext, AnalysisError> {
        // Two partitions per core: a partition waiting for its next column chunk (read
        // on a blocking thread) leaves its core to another partition's decoding, which
        // keeps both cores busy when the run is larger than the page cache.
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let config = SessionConfig::new()
            .with_information_schema(true)
            .with_target_partitions(2 * cores);
        let ctx = SessionContext::new_with_config(config);
        crate::hdr::register(&ctx);
        self.register_traces(&ctx).await?;
        let traces = ctx.table("traces").await?.logical_plan().clone();
        for (name, kind) in [
            ("tail", crate::tail::table::Kind::Tail),
            ("attribution", crate::tail::table::Kind::Attribution),
        ] {
            ctx.register_udtf(
                name,
                Arc::new(crate::tail::table::TailTable::new(
                    kind,
                    traces.clone(),
                    self.pipeline().clone(),
                    crate::hdr::floor_udaf(),
                )),
            );
        }
        self.register_small(&ctx, "clock", &hoptrace_format::schema::clock_schema())
            .await?;
        self.register_small(&ctx, "probes", &Schema::empty())
            .await?;
        ctx.register_batch("runs", self.runs_batch())?;
        ctx.register_batch("stages", self.stages_batch())?;
        ctx.register_batch("cells", self.cells_batch()?)?;
        Ok(ctx)
    }

    /// The sweep cells among the runs (their `cell.json`): one row each, the settings
    /// as columns.
    fn cells_batch(&self) -> Result<RecordBatch, AnalysisError> {
        let cells = self
            .runs
            .iter()
            .map(|r| r.dir.join(crate::sweep::CELL_FILE))
            .filter(|p| p.exists())
            .map(|p| crate::sweep::Cell::read(&p))
            .collect::<Result<Vec<_>, _>>()?;
        let tsf = || DataType::Timestamp(TimeUnit::Nanosecond, None);
        let mut fields = vec![
            Field::new("run_id", DataType::Utf8, false),
            Field::new("sweep", DataType::Utf8, false),
            Field::new("cell", DataType::UInt64, false),
            Field::new("target_metrics_per_s", DataType::UInt64, false),
            Field::new("achieved_metrics_per_s", DataType::Float64, false),
            Field::new("window_from", tsf(), false),
            Field::new("window_to", tsf(), false),
            Field::new("holds", DataType::Boolean, false),
        ];
        let mut settings: Vec<String> = Vec::new();
        for c in &cells {
            for s in &c.settings {
                if !settings.contains(&s.name) && fields.iter().all(|f| f.name() != &s.name) {
                    settings.push(s.name.clone());
                }
            }
        }
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(
                cells.iter().map(|c| c.run_id.clone()),
            )),
            Arc::new(StringArray::from_iter_values(
                cells.iter().map(|c| c.sweep.clone()),
            )),
            Arc::new(UInt64Array::from_iter_values(
                cells.iter().map(|c| c.index as u64),
            )),
            Arc::new(UInt64Array::from_iter_values(
                cells.iter().map(|c| c.target_metrics_per_s),
            )),
            Arc::new(Float64Array::from_iter_values(
                cells.iter().map(crate::sweep::Cell::achieved_metrics_per_s),
            )),
            Arc::new(TimestampNanosecondArray::from_iter_values(
                cells.iter().map(|c| c.window.from_unix_ns),
            )),
            Arc::new(TimestampNanosecondArray::from_iter_values(
                cells.iter().map(|c| c.window.to_unix_ns),
            )),
            Arc::new(BooleanArray::from(
                cells
                    .iter()
                    .map(crate::sweep::Cell::holds)
                    .collect::<Vec<_>>(),
            )),
        ];
        for name in settings {
            columns.push(Arc::new(StringArray::from(
                cells.iter().map(|c| c.setting(&name)).collect::<Vec<_>>(),
            )));
            fields.push(Field::new(name, DataType::Utf8, true));
        }
        Ok(RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            columns,
        )?)
    }
}
