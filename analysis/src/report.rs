//! The report of a run, in the shape of the reference report: highlights, test
//! environment, stage definitions, per-stage statistics with precision and clock
//! uncertainty, throughput, accounting and charts.
//!
//! [`write()`] produces, in one directory: `report.md` (tables and SVG chart images),
//! `report.html` (self-contained and offline: vega, vega-lite and vega-embed inlined),
//! `summary.json` and `charts/*.vl.json` (+ `charts/*.svg`).

mod block;
mod blocks;
mod render;
mod tail;

use std::path::{Path, PathBuf};
use std::process::Command;

pub use block::{Block, TimelineRow, Timelines};
pub use blocks::blocks;
pub use render::{anchors, html, markdown, slug};

use crate::charts::{self, Chart};
use crate::summary::{StageHistograms, Summary};
use crate::{AnalysisError, write_file};

/// Where the chart libraries are: `$HOPTRACE_WEB_DIR`; else `analysis/web` of the
/// nearest enclosing hoptrace checkout of the working directory that has them
/// installed; else `analysis/web` of the source tree this binary was built from.
#[must_use]
pub fn web_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HOPTRACE_WEB_DIR") {
        return PathBuf::from(dir);
    }
    let built = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/web"));
    std::env::current_dir()
        .ok()
        .and_then(|cwd| {
            cwd.ancestors()
                .map(|dir| dir.join("analysis/web"))
                .find(|web| web.join(LIBS[0]).is_file())
        })
        .unwrap_or(built)
}

const LIBS: [&str; 3] = [
    "node_modules/vega/build/vega.min.js",
    "node_modules/vega-lite/build/vega-lite.min.js",
    "node_modules/vega-embed/build/vega-embed.min.js",
];

/// What [`write()`] produced.
#[derive(Debug, Clone)]
pub struct Written {
    /// `report.md`.
    pub markdown: PathBuf,
    /// `report.html`.
    pub html: PathBuf,
    /// `summary.json`.
    pub summary: PathBuf,
    /// Chart specs.
    pub charts: Vec<PathBuf>,
    /// Whether the SVG images of `report.md` were rendered.
    pub images: bool,
}

/// Reads the chart libraries to inline into `report.html`.
///
/// # Errors
/// [`AnalysisError::Render`] naming the missing file and how to install it.
pub fn read_libs() -> Result<Vec<String>, AnalysisError> {
    let dir = web_dir();
    LIBS.iter()
        .map(|rel| {
            let p = dir.join(rel);
            std::fs::read_to_string(&p).map_err(|e| {
                AnalysisError::Render(format!(
                    "{}: {e}; install the chart libraries with `npm ci --prefix {}` (infra/setup.sh does) or set HOPTRACE_WEB_DIR",
                    p.display(),
                    dir.display()
                ))
            })
        })
        .collect()
}

/// Renders chart specs to SVG with Node.js (`analysis/web/render.mjs`).
///
/// # Errors
/// When node is missing or a chart fails to render.
pub fn render_svgs(specs: &[(PathBuf, PathBuf)]) -> Result<(), AnalysisError> {
    let script = web_dir().join("render.mjs");
    let mut cmd = Command::new("node");
    cmd.arg(&script);
    for (spec, svg) in specs {
        cmd.arg(spec).arg(svg);
    }
    let out = cmd
        .output()
        .map_err(|e| AnalysisError::Render(format!("running node {}: {e}", script.display())))?;
    if !out.status.success() {
        return Err(AnalysisError::Render(format!(
            "rendering chart images failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// A section a caller appends to a report (the soak's resources, for one): its blocks,
/// whose [`Block::Chart`] indices count from 0 within the section's own charts.
#[derive(Debug, Clone, Default)]
pub struct Section {
    /// The section's blocks.
    pub blocks: Vec<Block>,
    /// The section's charts.
    pub charts: Vec<Chart>,
}

/// Writes the whole report of `summary` into `dir`.
///
/// # Errors
/// When a file cannot be written or the chart libraries are missing. SVG images that
/// fail to render (no Node.js) are not an error: `report.md` then says so.
pub fn write(
    dir: &Path,
    summary: &Summary,
    hists: &[StageHistograms],
) -> Result<Written, AnalysisError> {
    write_with(dir, summary, hists, &[])
}

/// [`write()`], with `sections` appended after the report's own.
///
/// # Errors
/// As [`write()`].
pub fn write_with(
    dir: &Path,
    summary: &Summary,
    hists: &[StageHistograms],
    sections: &[Section],
) -> Result<Written, AnalysisError> {
    let mut charts = charts::all(summary, hists);
    let mut extra = Vec::new();
    for sec in sections {
        let offset = charts.len();
        extra.extend(sec.blocks.iter().map(|b| match b {
            Block::Chart(i) => Block::Chart(offset + i),
            other => other.clone(),
        }));
        charts.extend(sec.charts.iter().cloned());
    }
    let mut blocks = blocks(summary, &charts);
    blocks.extend(extra);
    let title = format!("{} Test Report", summary.pipeline);
    let page = write_page(dir, "report", &title, &blocks, &charts)?;
    let written = Written {
        markdown: page.markdown,
        html: page.html,
        summary: dir.join("summary.json"),
        charts: page.charts,
        images: page.images,
    };
    write_file(
        &written.summary,
        serde_json::to_vec_pretty(summary).unwrap_or_default(),
    )?;
    Ok(written)
}

/// What [`write_page`] produced.
#[derive(Debug, Clone)]
pub struct Page {
    /// `<stem>.md`.
    pub markdown: PathBuf,
    /// `<stem>.html`, self-contained.
    pub html: PathBuf,
    /// Chart specs, `charts/<chart>.vl.json`.
    pub charts: Vec<PathBuf>,
    /// Whether the SVG images the Markdown shows were rendered.
    pub images: bool,
}

/// Writes `blocks` as `<stem>.md` (with SVG images of the charts) and a self-contained
/// `<stem>.html` into `dir`, the chart specs and images under `dir/charts/`.
///
/// # Errors
/// When a file cannot be written or the chart libraries are missing. SVG images that
/// fail to render (no Node.js) are not an error: the Markdown then says so.
pub fn write_page(
    dir: &Path,
    stem: &str,
    title: &str,
    blocks: &[Block],
    charts: &[Chart],
) -> Result<Page, AnalysisError> {
    let libs = read_libs()?;
    let chart_dir = dir.join("charts");
    let mut spec_paths = Vec::new();
    let mut pairs = Vec::new();
    for c in charts {
        let spec = chart_dir.join(format!("{}.vl.json", c.stem));
        write_file(
            &spec,
            serde_json::to_vec_pretty(&c.spec).unwrap_or_default(),
        )?;
        pairs.push((spec.clone(), chart_dir.join(format!("{}.svg", c.stem))));
        spec_paths.push(spec);
    }
    let images = match render_svgs(&pairs) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!("chart images not rendered: {e}");
            false
        }
    };
    let mut md = markdown(blocks, charts);
    if !images {
        md.push_str(&format!("\n_Chart images were not rendered (Node.js missing); the charts are in {stem}.html and charts/*.vl.json._\n"));
    }
    let page = Page {
        markdown: dir.join(format!("{stem}.md")),
        html: dir.join(format!("{stem}.html")),
        charts: spec_paths,
        images,
    };
    write_file(&page.markdown, md)?;
    write_file(&page.html, html(blocks, charts, title, &libs))?;
    Ok(page)
}

#[cfg(test)]
mod tests;
