//! `hoptrace sql`: one query over one or many runs, written as a table, CSV, JSON or
//! Parquet.

use std::io::Write;
use std::path::Path;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::dataframe::DataFrameWriteOptions;
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionContext;

use crate::AnalysisError;

/// How query results are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputFormat {
    /// An aligned text table.
    #[default]
    Table,
    /// CSV with a header line.
    Csv,
    /// One JSON object per line.
    Json,
    /// A Parquet file (needs an output path).
    Parquet,
}

impl std::str::FromStr for OutputFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "table" => Ok(Self::Table),
            "csv" => Ok(Self::Csv),
            "json" | "ndjson" => Ok(Self::Json),
            "parquet" => Ok(Self::Parquet),
            other => Err(format!(
                "unknown format {other:?}: use table, csv, json or parquet"
            )),
        }
    }
}

/// Runs `sql` in `ctx` and returns its batches.
///
/// # Errors
/// When the query does not plan or run; the message names the column, table or function.
pub async fn query(ctx: &SessionContext, sql: &str) -> Result<Vec<RecordBatch>, AnalysisError> {
    let run = async { ctx.sql(sql).await?.collect().await };
    run.await.map_err(|e| explain(ctx, e))
}

/// A query's error said once, and with what to write instead where it can: a syntax error
/// without DataFusion's debug form of the parser's error beside its text; an unknown table
/// with the tables there are (an unknown column already lists the fields).
pub(crate) fn explain(ctx: &SessionContext, e: DataFusionError) -> AnalysisError {
    let root = e.find_root();
    if let DataFusionError::SQL(parser, _) = root {
        return AnalysisError::Query(format!("SQL syntax: {parser}"));
    }
    let text = root.to_string();
    if text.contains("table '") && text.contains("not found") {
        let mut tables: Vec<String> = ctx
            .catalog("datafusion")
            .and_then(|c| c.schema("public"))
            .map(|s| s.table_names())
            .unwrap_or_default()
            .into_iter()
            .filter(|t| !t.contains('_') || t == "traces_raw")
            .collect();
        tables.sort();
        return AnalysisError::Query(format!(
            "{}; the tables are: {}",
            text.replace("datafusion.public.", ""),
            tables.join(", ")
        ));
    }
    e.into()
}

/// Writes `batches` to `out` in `format` (not Parquet: see [`write_parquet`]).
///
/// # Errors
/// When writing fails.
pub fn write(
    batches: &[RecordBatch],
    format: OutputFormat,
    out: &mut dyn Write,
) -> Result<(), AnalysisError> {
    let io = |source| AnalysisError::Io {
        path: "<output>".into(),
        source,
    };
    match format {
        OutputFormat::Table => {
            writeln!(out, "{}", pretty_format_batches(batches)?).map_err(io)?;
            let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
            writeln!(out, "{rows} row(s)").map_err(io)?;
        }
        OutputFormat::Csv => {
            let mut w = datafusion::arrow::csv::Writer::new(out);
            for b in batches {
                w.write(b)?;
            }
        }
        OutputFormat::Json => {
            let mut w = datafusion::arrow::json::LineDelimitedWriter::new(out);
            for b in batches {
                w.write(b)?;
            }
            w.finish()?;
        }
        OutputFormat::Parquet => {
            return Err(AnalysisError::Render(
                "Parquet output needs a file: pass --out FILE.parquet".into(),
            ));
        }
    }
    Ok(())
}

/// Runs `sql` and writes its result as one Parquet file at `path`.
///
/// # Errors
/// When the query or the write fails.
pub async fn write_parquet(
    ctx: &SessionContext,
    sql: &str,
    path: &Path,
) -> Result<(), AnalysisError> {
    let df = ctx.sql(sql).await.map_err(|e| explain(ctx, e))?;
    df.write_parquet(
        &path.to_string_lossy(),
        DataFrameWriteOptions::new().with_single_file_output(true),
        None,
    )
    .await
    .map_err(|e| explain(ctx, e))?;
    Ok(())
}
