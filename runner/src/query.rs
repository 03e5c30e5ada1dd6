//! The query runtime: the one way this program builds the tokio runtime that DataFusion
//! queries run on (`hoptrace sql`, `report`, `compare`, and the reports of `demo`,
//! `soak` and `sweep`), so that every report is computed, and timed, the same way.

use anyhow::Context as _;
use hoptrace_analysis::summary::{self, StageHistograms};
use hoptrace_analysis::{RunSet, Summary};

/// Sets glibc's allocator up for queries over large runs, once per process.
///
/// A scan allocates and frees buffers of up to a few MiB for every batch of every column.
/// By default glibc hands such memory back to the kernel as soon as it is freed (unmapping
/// large blocks, trimming the top of the heap) and the next batch faults it in again,
/// zeroed page by page: over 100M traces that was about a sixth of `hoptrace report`'s CPU
/// time, spent in the kernel. Freed memory is kept for reuse instead, with no more arenas
/// than query threads.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune_allocator() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let threads = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let arenas = libc::c_int::try_from(threads.max(2)).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only changes glibc's allocation parameters, under glibc's own
        // lock; memory already allocated is unaffected.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    });
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_allocator() {}

/// The runtime queries run on: multi-threaded, with the allocator set up for large
/// scans.
///
/// # Errors
/// The runtime cannot start (no threads).
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tune_allocator();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the query runtime")
}

/// The summary and per-stage histograms of `runs` (what a report is written from),
/// computed on `rt`.
///
/// # Errors
/// A run that does not read, or a failed query.
pub fn summarize(
    rt: &tokio::runtime::Runtime,
    runs: &RunSet,
) -> anyhow::Result<(Summary, Vec<StageHistograms>)> {
    summarize_with(rt, runs, hoptrace_analysis::tail::DEFAULT_EXEMPLARS)
}

/// [`summarize`] listing the `exemplars` slowest messages of each headline stage.
///
/// # Errors
/// As [`summarize`], and when `exemplars` is more than the analysis lists.
pub fn summarize_with(
    rt: &tokio::runtime::Runtime,
    runs: &RunSet,
    exemplars: usize,
) -> anyhow::Result<(Summary, Vec<StageHistograms>)> {
    Ok(rt.block_on(async {
        let ctx = runs.session().await?;
        summary::compute_with(runs, &ctx, exemplars).await
    })?)
}
