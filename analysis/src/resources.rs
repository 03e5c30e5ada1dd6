//! CPU and memory of the processes of a run, sampled every second (by `hoptrace soak`):
//! stored as `resources.parquet` in the run directory, summarized per process into the
//! report's resource table, and drawn as CPU and RSS over time.
//!
//! "Flat after warm-up" is judged on the least-squares slope of RSS over the samples
//! after the warm-up: the growth it implies over that span must stay within
//! [`FLAT_GROWTH_FRACTION`] of the mean RSS (or [`FLAT_GROWTH_FLOOR_BYTES`], whichever is
//! larger, so a few MiB of allocator noise in a small process do not count as growth).

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, Float64Array, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::AnalysisError;
use crate::charts::{Chart, SCHEMA};
use crate::report::{Block, Section};
use hoptrace_format::units::count;

/// File name of the samples in a run directory.
pub const FILE: &str = "resources.parquet";
/// RSS growth after warm-up, as a fraction of the mean, still called flat.
pub const FLAT_GROWTH_FRACTION: f64 = 0.05;
/// RSS growth after warm-up below this is flat whatever the fraction.
pub const FLAT_GROWTH_FLOOR_BYTES: f64 = 16.0 * 1_048_576.0;

/// One sample of one process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the run started.
    pub t_s: f64,
    /// Role of the process (`collector`, `broker (mosquitto)`, ...).
    pub process: String,
    /// Its pid.
    pub pid: u32,
    /// CPU used since the previous sample, in cores (1.0 = one core busy).
    pub cpu_cores: f64,
    /// Resident set size, bytes.
    pub rss_bytes: u64,
}

/// One process over the run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessResources {
    /// Role of the process.
    pub process: String,
    /// Its pid.
    pub pid: u32,
    /// Samples taken.
    pub samples: u64,
    /// Mean CPU after warm-up, cores.
    pub cpu_mean: f64,
    /// Highest one-second CPU after warm-up, cores.
    pub cpu_max: f64,
    /// Mean RSS after warm-up, bytes.
    pub rss_mean_bytes: u64,
    /// Highest RSS, bytes (whole run).
    pub rss_max_bytes: u64,
    /// RSS at the last sample, bytes.
    pub rss_end_bytes: u64,
    /// Least-squares RSS slope after warm-up, bytes per minute.
    pub rss_slope_bytes_per_min: f64,
    /// Whether RSS stayed flat after warm-up (see the module docs).
    pub rss_flat: bool,
}

/// Writes samples as Parquet.
///
/// # Errors
/// [`AnalysisError::Io`] or [`AnalysisError::Render`] when the file cannot be written.
pub fn write_parquet(path: &Path, samples: &[Sample]) -> Result<(), AnalysisError> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("t_s", DataType::Float64, false),
        Field::new("process", DataType::Utf8, false),
        Field::new("pid", DataType::UInt32, false),
        Field::new("cpu_cores", DataType::Float64, false),
        Field::new("rss_bytes", DataType::UInt64, false),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Float64Array::from_iter_values(
                samples.iter().map(|s| s.t_s),
            )),
            Arc::new(StringArray::from_iter_values(
                samples.iter().map(|s| s.process.as_str()),
            )),
            Arc::new(UInt32Array::from_iter_values(samples.iter().map(|s| s.pid))),
            Arc::new(Float64Array::from_iter_values(
                samples.iter().map(|s| s.cpu_cores),
            )),
            Arc::new(UInt64Array::from_iter_values(
                samples.iter().map(|s| s.rss_bytes),
            )),
        ],
    )?;
    let io = |source| AnalysisError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::create(path).map_err(io)?;
    let mut w = ArrowWriter::try_new(file, schema, None)
        .map_err(|e| AnalysisError::Render(format!("{}: {e}", path.display())))?;
    w.write(&batch)
        .and_then(|()| w.close().map(drop))
        .map_err(|e| AnalysisError::Render(format!("{}: {e}", path.display())))
}

/// Reads samples written by [`write_parquet`].
///
/// # Errors
/// [`AnalysisError::Io`], or [`AnalysisError::Render`] naming what is wrong with the file.
pub fn read_parquet(path: &Path) -> Result<Vec<Sample>, AnalysisError> {
    let bad = |e: &dyn std::fmt::Display| {
        AnalysisError::Render(format!("{}: not a resources file: {e}", path.display()))
    };
    let file = std::fs::File::open(path).map_err(|source| AnalysisError::Io {
        path: path.to_owned(),
        source,
    })?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.build())
        .map_err(|e| bad(&e))?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| bad(&e))?;
        let col = |name: &str| {
            batch
                .column_by_name(name)
                .ok_or_else(|| bad(&format!("no column {name}")))
        };
        let t = col("t_s")?.as_any().downcast_ref::<Float64Array>();
        let p = col("process")?.as_any().downcast_ref::<StringArray>();
        let pid = col("pid")?.as_any().downcast_ref::<UInt32Array>();
        let cpu = col("cpu_cores")?.as_any().downcast_ref::<Float64Array>();
        let rss = col("rss_bytes")?.as_any().downcast_ref::<UInt64Array>();
        let (Some(t), Some(p), Some(pid), Some(cpu), Some(rss)) = (t, p, pid, cpu, rss) else {
            return Err(bad(&"a column has the wrong type"));
        };
        for i in 0..batch.num_rows() {
            out.push(Sample {
                t_s: t.value(i),
                process: p.value(i).to_owned(),
                pid: pid.value(i),
                cpu_cores: cpu.value(i),
                rss_bytes: rss.value(i),
            });
        }
    }
    Ok(out)
}

/// Least-squares slope of `ys` over `xs` (0 with fewer than two distinct x).
fn slope(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len() as f64;
    if xs.len() < 2 {
        return 0.0;
    }
    let mx = xs.iter().sum::<f64>() / n;
    let my = ys.iter().sum::<f64>() / n;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (x, y) in xs.iter().zip(ys) {
        sxy += (x - mx) * (y - my);
        sxx += (x - mx) * (x - mx);
    }
    if sxx > 0.0 { sxy / sxx } else { 0.0 }
}

/// Per process (in order of first appearance): CPU and RSS after `warmup_s`, RSS slope
/// and whether it stayed flat.
#[must_use]
pub fn summarize(samples: &[Sample], warmup_s: f64) -> Vec<ProcessResources> {
    let mut order: Vec<(&str, u32)> = Vec::new();
    for s in samples {
        if !order.contains(&(s.process.as_str(), s.pid)) {
            order.push((s.process.as_str(), s.pid));
        }
    }
    order
        .into_iter()
        .map(|(process, pid)| {
            let all: Vec<&Sample> = samples
                .iter()
                .filter(|s| s.process == process && s.pid == pid)
                .collect();
            let after: Vec<&Sample> = all.iter().copied().filter(|s| s.t_s >= warmup_s).collect();
            let steady = if after.is_empty() { &all } else { &after };
            let n = steady.len().max(1) as f64;
            let cpu_mean = steady.iter().map(|s| s.cpu_cores).sum::<f64>() / n;
            let cpu_max = steady.iter().map(|s| s.cpu_cores).fold(0.0, f64::max);
            let rss_mean = steady.iter().map(|s| s.rss_bytes as f64).sum::<f64>() / n;
            let xs: Vec<f64> = steady.iter().map(|s| s.t_s).collect();
            let ys: Vec<f64> = steady.iter().map(|s| s.rss_bytes as f64).collect();
            let per_s = slope(&xs, &ys);
            let span = xs.last().copied().unwrap_or(0.0) - xs.first().copied().unwrap_or(0.0);
            let growth = per_s * span;
            ProcessResources {
                process: process.to_owned(),
                pid,
                samples: all.len() as u64,
                cpu_mean,
                cpu_max,
                rss_mean_bytes: rss_mean as u64,
                rss_max_bytes: all.iter().map(|s| s.rss_bytes).max().unwrap_or(0),
                rss_end_bytes: all.last().map_or(0, |s| s.rss_bytes),
                rss_slope_bytes_per_min: per_s * 60.0,
                rss_flat: growth <= (FLAT_GROWTH_FRACTION * rss_mean).max(FLAT_GROWTH_FLOOR_BYTES),
            }
        })
        .collect()
}

fn mib(b: f64) -> String {
    format!("{:.1} MiB", b / 1_048_576.0)
}

/// The resource table, as a report block.
#[must_use]
pub fn table(rows: &[ProcessResources]) -> Block {
    Block::Table(
        [
            "Process",
            "PID",
            "Samples",
            "CPU mean (cores)",
            "CPU max (cores)",
            "RSS mean",
            "RSS max",
            "RSS end",
            "RSS slope after warm-up",
            "RSS flat",
        ]
        .map(str::to_owned)
        .to_vec(),
        rows.iter()
            .map(|r| {
                vec![
                    r.process.clone(),
                    r.pid.to_string(),
                    count(r.samples),
                    format!("{:.3}", r.cpu_mean),
                    format!("{:.3}", r.cpu_max),
                    mib(r.rss_mean_bytes as f64),
                    mib(r.rss_max_bytes as f64),
                    mib(r.rss_end_bytes as f64),
                    format!("{}/min", mib(r.rss_slope_bytes_per_min)),
                    if r.rss_flat { "yes" } else { "NO" }.to_owned(),
                ]
            })
            .collect(),
    )
}

fn line_chart(samples: &[Sample], stem: &str, title: &str, field: &str, axis: &str) -> Chart {
    let values: Vec<Value> = samples
        .iter()
        .map(|s| {
            let v = if field == "cpu" {
                s.cpu_cores
            } else {
                s.rss_bytes as f64 / 1_048_576.0
            };
            json!({"t_s": s.t_s, "process": s.process, "v": v})
        })
        .collect();
    Chart {
        stem: stem.to_owned(),
        title: title.to_owned(),
        spec: json!({
            "$schema": SCHEMA,
            "width": 640,
            "height": 220,
            "data": {"values": values},
            "mark": {"type": "line", "interpolate": "step-after"},
            "encoding": {
                "x": {"field": "t_s", "type": "quantitative", "title": "time since start (s)"},
                "y": {"field": "v", "type": "quantitative", "title": axis},
                "color": {"field": "process", "type": "nominal", "title": "process"}
            }
        }),
    }
}

/// CPU and RSS over time, one line per process.
#[must_use]
pub fn charts(samples: &[Sample]) -> Vec<Chart> {
    vec![
        line_chart(
            samples,
            "resources-cpu",
            "CPU per process (cores, 1 s samples)",
            "cpu",
            "CPU (cores)",
        ),
        line_chart(
            samples,
            "resources-rss",
            "Resident memory per process (MiB, 1 s samples)",
            "rss",
            "RSS (MiB)",
        ),
    ]
}

/// The report section of a run's resources: the table, how flatness is judged, and the
/// CPU and RSS charts.
#[must_use]
pub fn section(samples: &[Sample], warmup_s: f64) -> Section {
    let rows = summarize(samples, warmup_s);
    Section {
        blocks: vec![
            Block::Heading(2, "Resources".into()),
            Block::Para(format!(
                "CPU and resident memory of every process of the run, sampled from /proc every second. Means and CPU max leave out a {warmup_s:.0} s warm-up; RSS is flat when the growth its least-squares slope implies after the warm-up stays within {:.0} % of its mean (or {}).",
                FLAT_GROWTH_FRACTION * 100.0,
                mib(FLAT_GROWTH_FLOOR_BYTES)
            )),
            table(&rows),
            Block::Chart(0),
            Block::Chart(1),
        ],
        charts: charts(samples),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(process: &str, rss: impl Fn(f64) -> f64) -> Vec<Sample> {
        (0..120)
            .map(|i| Sample {
                t_s: f64::from(i),
                process: process.to_owned(),
                pid: 7,
                cpu_cores: if i < 10 { 1.0 } else { 0.5 },
                rss_bytes: rss(f64::from(i)) as u64,
            })
            .collect()
    }

    #[test]
    fn flat_and_growing_memory_are_told_apart() {
        let mut s = series("flat", |t| 200e6 + if t < 10.0 { t * 10e6 } else { 100e6 });
        s.extend(series("leak", |t| 200e6 + t * 2e6));
        let r = summarize(&s, 10.0);
        assert_eq!(r.len(), 2);
        assert!(r[0].rss_flat, "{:?}", r[0]);
        assert!((r[0].cpu_mean - 0.5).abs() < 1e-9, "warm-up is left out");
        assert!((r[0].cpu_max - 0.5).abs() < 1e-9);
        assert_eq!(r[0].rss_max_bytes, 300_000_000);
        assert!(!r[1].rss_flat, "{:?}", r[1]);
        assert!((r[1].rss_slope_bytes_per_min - 120e6).abs() < 1.0);
    }

    #[test]
    fn samples_round_trip_through_parquet() {
        let s = series("collector", |t| 1e8 + t);
        let path =
            std::env::temp_dir().join(format!("hoptrace-res-{}.parquet", std::process::id()));
        write_parquet(&path, &s).unwrap();
        assert_eq!(read_parquet(&path).unwrap(), s);
        std::fs::write(&path, b"PAR1 not really").unwrap();
        let e = read_parquet(&path).unwrap_err().to_string();
        assert!(e.contains("not a resources file"), "{e}");
        std::fs::remove_file(&path).unwrap();
    }
}
