//! A run directory before and after a run: whether a collector may write into it, and
//! what only the command that ran the collector knows (that the run was interrupted).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use hoptrace_format::run::RunSummary;
use hoptrace_format::spec::PipelineSpec;

/// The hops of a pipeline as (name, wire id).
fn hop_ids(spec: &PipelineSpec) -> Vec<(String, u8)> {
    spec.hop_ids().map(|(n, id)| (n.to_owned(), id.0)).collect()
}

fn hop_list(hops: &[String]) -> String {
    hops.join(", ")
}

/// The run.json at `path`, or an error naming it and saying to choose another run id.
fn read_run_json(path: &Path) -> anyhow::Result<RunSummary> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| {
        anyhow::anyhow!(
            "{} does not read ({e}): choose another --run-id",
            path.display()
        )
    })
}

/// Checks, before a long run, that its output can be written at `dir`, creating nothing:
/// a run that measures for minutes and then cannot write its report has wasted them. The
/// nearest part of `dir` that exists must be a directory a file can be written in (the
/// rest is created later). `what` names the option (`--out`).
///
/// # Errors
/// A part of `dir` is not a directory, or nothing can be written in it.
pub fn check_writable(dir: &Path, what: &str) -> anyhow::Result<()> {
    let fail = |why: String| {
        anyhow::anyhow!(
            "{what} {}: cannot write there ({why}); choose another {what} (nothing was run)",
            dir.display()
        )
    };
    let mut existing = dir;
    while !existing.as_os_str().is_empty() && !existing.exists() {
        existing = existing.parent().unwrap_or(Path::new(""));
    }
    let existing = if existing.as_os_str().is_empty() {
        Path::new(".")
    } else {
        existing
    };
    if !existing.is_dir() {
        return Err(fail(format!("{} is not a directory", existing.display())));
    }
    let probe = existing.join(format!(".hoptrace-write-check-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| fail(format!("{}: {e}", existing.display())))?;
    std::fs::remove_file(&probe).map_err(|e| fail(format!("{}: {e}", existing.display())))?;
    Ok(())
}

/// Refuses to write into `dir` when it holds a run that closed cleanly (unless
/// `continue_run`) or data of another pipeline (always): either would leave a directory
/// that no reader can make sense of. A directory a killed collector left (part files, no
/// `run.json`) of the same pipeline is taken over and its complete files kept.
///
/// # Errors
/// What `dir` holds, and what to do instead.
pub fn check(dir: &Path, spec: &PipelineSpec, continue_run: bool) -> anyhow::Result<()> {
    let ours = hop_ids(spec);
    let our_names: Vec<String> = ours.iter().map(|(n, _)| n.clone()).collect();
    let run_json = dir.join("run.json");
    if run_json.exists() {
        let prev = read_run_json(&run_json)?;
        if hop_ids(&prev.pipeline) != ours {
            bail!(
                "{} holds run {:?} of pipeline {:?} (hops {}), not of this pipeline {:?} (hops {}): choose another --run-id",
                dir.display(),
                prev.run_id,
                prev.pipeline.name,
                hop_list(
                    &prev
                        .pipeline
                        .hops
                        .iter()
                        .map(|h| h.name.clone())
                        .collect::<Vec<_>>()
                ),
                spec.name,
                hop_list(&our_names)
            );
        }
        if !continue_run {
            let rows: u64 = prev.files.iter().map(|f| f.rows).sum();
            bail!(
                "{} holds run {:?}, which closed cleanly with {rows} traces in {} file(s): choose another --run-id, or pass --continue to add to it",
                dir.display(),
                prev.run_id,
                prev.files.len()
            );
        }
        return Ok(());
    }
    // No run.json: a collector was killed here. Its part files name their hops.
    let traces = dir.join("traces");
    let mut parts: Vec<PathBuf> = std::fs::read_dir(&traces)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
                .collect()
        })
        .unwrap_or_default();
    parts.sort();
    if let Some(theirs) = parts.iter().find_map(|p| part_hops(p))
        && theirs != our_names
    {
        bail!(
            "{} holds the files of another pipeline's run (hops {}), not of this pipeline {:?} (hops {}): choose another --run-id",
            dir.display(),
            hop_list(&theirs),
            spec.name,
            hop_list(&our_names)
        );
    }
    Ok(())
}

/// Refuses to let a member of a collector group (`collect --from kafka://...`) write into
/// `dir` when it holds a single collector's run (the group's files beside its `run.json`
/// would never be read) or a group run of another pipeline (a finished member's
/// `run.json`, or a member's part files, name other hops). A group run of the same
/// pipeline is where every member of the group writes: it is not refused.
///
/// # Errors
/// What `dir` holds, and what to do instead.
pub fn check_group(dir: &Path, spec: &PipelineSpec) -> anyhow::Result<()> {
    if dir.join("run.json").exists() {
        // Another pipeline's run is named as such; a run of this pipeline is refused too.
        check(dir, spec, true)?;
        bail!(
            "{} holds a run of a single collector (its run.json): a consumer group's members cannot add to it; choose another --run-id",
            dir.display()
        );
    }
    let ours = hop_ids(spec);
    let our_names: Vec<String> = ours.iter().map(|(n, _)| n.clone()).collect();
    let members = dir.join(hoptrace_format::group::MEMBERS_DIR);
    let mut names: Vec<PathBuf> = std::fs::read_dir(&members)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    for m in &names {
        let run_json = m.join("run.json");
        if run_json.exists() {
            let prev = read_run_json(&run_json)?;
            if hop_ids(&prev.pipeline) != ours {
                bail!(
                    "{} holds group run {:?} of pipeline {:?} (member {}, hops {}), not of this pipeline {:?} (hops {}): choose another --run-id",
                    dir.display(),
                    prev.run_id,
                    prev.pipeline.name,
                    m.file_name()
                        .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
                    hop_list(
                        &prev
                            .pipeline
                            .hops
                            .iter()
                            .map(|h| h.name.clone())
                            .collect::<Vec<_>>()
                    ),
                    spec.name,
                    hop_list(&our_names)
                );
            }
            continue;
        }
        // A member that did not finish: its part files name their hops.
        let traces = m.join("traces");
        let mut parts: Vec<PathBuf> = std::fs::read_dir(&traces)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .flat_map(|p| std::fs::read_dir(p).into_iter().flatten().flatten())
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
                    .collect()
            })
            .unwrap_or_default();
        parts.sort();
        if let Some(theirs) = parts.iter().find_map(|p| part_hops(p))
            && theirs != our_names
        {
            bail!(
                "{} holds the files of another pipeline's group run (hops {}), not of this pipeline {:?} (hops {}): choose another --run-id",
                dir.display(),
                hop_list(&theirs),
                spec.name,
                hop_list(&our_names)
            );
        }
    }
    Ok(())
}

/// The hops a traces part file has columns for (`<hop>_ns`), or `None` when it does not
/// read.
fn part_hops(path: &Path) -> Option<Vec<String>> {
    use hoptrace_analysis::datafusion::parquet::file::reader::{
        FileReader as _, SerializedFileReader,
    };
    let reader = SerializedFileReader::new(std::fs::File::open(path).ok()?).ok()?;
    let schema = reader.metadata().file_metadata().schema_descr_ptr();
    Some(
        schema
            .root_schema()
            .get_fields()
            .iter()
            .filter_map(|f| f.name().strip_suffix("_ns"))
            .filter(|n| *n != "intended")
            .map(str::to_owned)
            .collect(),
    )
}

/// Marks the run in `run_json` as interrupted (the collector that wrote it could not
/// know).
///
/// # Errors
/// The file does not read, parse or write.
pub fn mark_interrupted(run_json: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read(run_json).with_context(|| format!("reading {}", run_json.display()))?;
    let mut run: RunSummary =
        serde_json::from_slice(&text).with_context(|| format!("reading {}", run_json.display()))?;
    run.interrupted = true;
    run.write(run_json)
        .with_context(|| format!("writing {}", run_json.display()))
}

/// For a collector started without `--run-id`: the unfinished runs under `runs` (their
/// collector was stopped without closing them: their log, `wal/`, is still there). With
/// `resume`, the id of the newest one of this pipeline, to continue; without, each is
/// named with the command that continues it, and the collector starts a new run (`None`).
/// What to tell the user comes with it, a line each.
///
/// # Errors
/// `--resume` and no unfinished run of this pipeline.
pub fn unfinished_runs(
    runs: &Path,
    spec: &PipelineSpec,
    resume: bool,
) -> anyhow::Result<(Option<String>, Vec<String>)> {
    let mut said = Vec::new();
    let resolved = hoptrace_format::spec::ResolvedSpec::new(spec)?;
    let ours: Vec<(u8, String)> = resolved
        .hop_ids()
        .iter()
        .zip(resolved.hop_names())
        .map(|(id, name)| (id.0, name.clone()))
        .collect();
    // (modified, id, of this pipeline)
    let mut found: Vec<(std::time::SystemTime, String, bool)> = std::fs::read_dir(runs)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let wal = e.path().join(hoptrace_collector::wal::WAL_DIR);
            let modified = std::fs::metadata(&wal).ok()?.modified().ok()?;
            let id = e.file_name().into_string().ok()?;
            let theirs = hoptrace_collector::wal::hops(&e.path()).ok().flatten();
            Some((modified, id, theirs.is_none_or(|t| t == ours)))
        })
        .collect();
    found.sort();
    if resume {
        let Some((_, id, _)) = found.iter().rev().find(|(_, _, ours)| *ours) else {
            bail!(
                "--resume: no unfinished run of this pipeline under {} (an unfinished run is one whose collector was stopped without closing it: its wal/ is still there); start without --resume for a new run",
                runs.display()
            );
        };
        said.push(format!(
            "resuming the unfinished run {id} under {} (--resume)",
            runs.display()
        ));
        return Ok((Some(id.clone()), said));
    }
    for (_, id, ours) in &found {
        let dir = runs.join(id);
        if *ours {
            said.push(format!(
                "warning: {} is an unfinished run: its collector was stopped without closing it, and its log ({}/wal/) is still there. To continue it with nothing lost, start this collector with --run-id {id} (or --resume); this one starts a new run",
                dir.display(),
                dir.display()
            ));
        } else {
            said.push(format!(
                "warning: {} is an unfinished run of another pipeline (its log, {}/wal/, names other hops): to continue it, start a collector with that run's pipeline spec and --run-id {id}",
                dir.display(),
                dir.display()
            ));
        }
    }
    Ok((None, said))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interrupted_run_says_so_and_a_finished_run_is_not_written_over() {
        let runs = std::env::temp_dir().join(format!("hoptrace-rundir-{}", std::process::id()));
        let dir = runs.join("r");
        let spec = PipelineSpec::default_pipeline();
        check(&dir, &spec, false).unwrap();
        // A run that closed cleanly, with no probe: run.json and nothing else.
        let mut cfg = hoptrace_collector::CollectorConfig::new("127.0.0.1:0", spec.clone(), &runs);
        cfg.run_id = Some("r".into());
        hoptrace_collector::Collector::start(cfg)
            .unwrap()
            .stop()
            .unwrap();
        let e = check(&dir, &spec, false).unwrap_err().to_string();
        assert!(
            e.contains("closed cleanly") && e.contains("--continue"),
            "{e}"
        );
        check(&dir, &spec, true).unwrap();
        let other = PipelineSpec::chain("other", &["a".into(), "b".into()]).unwrap();
        let e = check(&dir, &other, true).unwrap_err().to_string();
        assert!(e.contains("not of this pipeline"), "{e}");
        mark_interrupted(&dir.join("run.json")).unwrap();
        let back: RunSummary =
            serde_json::from_slice(&std::fs::read(dir.join("run.json")).unwrap()).unwrap();
        assert!(back.interrupted);
        // run.json is replaced whole or not at all: when the new content cannot be
        // written (here its temporary file cannot be created), the old file is intact.
        let before = std::fs::read(dir.join("run.json")).unwrap();
        std::fs::create_dir(dir.join("run.json.tmp")).unwrap();
        assert!(mark_interrupted(&dir.join("run.json")).is_err());
        assert_eq!(std::fs::read(dir.join("run.json")).unwrap(), before);
        std::fs::remove_dir(dir.join("run.json.tmp")).unwrap();
        mark_interrupted(&dir.join("run.json")).unwrap();
        assert!(!dir.join("run.json.tmp").exists());
        let _ = std::fs::remove_dir_all(&runs);
    }
}
