//! The run directory: its name, its creation, what is synced, and what a continued run
//! removes to write again.

use std::path::{Path, PathBuf};

use crate::error::CollectorError;

/// `run-YYYYMMDDTHHMMSSZ` from Unix ns.
pub(super) fn default_run_id(unix_ns: i64) -> String {
    let (y, m, d, h, min, s, _) = hoptrace_format::units::utc_parts(unix_ns);
    format!("run-{y:04}{m:02}{d:02}T{h:02}{min:02}{s:02}Z")
}

/// Creates `out_dir/<base>` for a new run, or `<base>-2`, `<base>-3`, ... when a run of
/// that name exists; returns the id and the directory.
pub(super) fn claim_run_dir(
    out_dir: &Path,
    base: &str,
) -> Result<(String, PathBuf), CollectorError> {
    std::fs::create_dir_all(out_dir).map_err(|source| CollectorError::Io {
        path: out_dir.to_owned(),
        source,
    })?;
    let mut n = 1u32;
    loop {
        let id = if n == 1 {
            base.to_owned()
        } else {
            format!("{base}-{n}")
        };
        let dir = out_dir.join(&id);
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok((id, dir)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 10_000 => n += 1,
            Err(source) => return Err(CollectorError::Io { path: dir, source }),
        }
    }
}

/// Waits until the disk has every file of the run directory outside the log, and the
/// directories' entries (`fsync`).
pub(super) fn sync_files(run_dir: &Path) -> Result<(), CollectorError> {
    let sync = |p: &Path| {
        std::fs::File::open(p)
            .and_then(|f| f.sync_all())
            .map_err(|source| CollectorError::Io {
                path: p.to_owned(),
                source,
            })
    };
    for dir in [
        run_dir.to_owned(),
        run_dir.join("traces"),
        run_dir.join("hdr"),
    ] {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_file()) {
                sync(&e.path())?;
            }
        }
        sync(&dir)?;
    }
    Ok(())
}

/// The complete part files (`part-*.parquet`) in `dir`, by name.
pub(super) fn part_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with("part-") && n.ends_with(".parquet"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Removes what a replayed log writes again: the part files of `traces/` not in `kept`
/// (finished or left open by the killed collector; files set aside earlier as unfinished
/// or corrupt stay), `hdr/` (unless the replay starts from a checkpoint, which cuts the
/// interval logs back to what it recorded), `clock.parquet` and `probes.parquet`.
pub(super) fn remove_derived(
    run_dir: &Path,
    kept: &[String],
    checkpoint: bool,
) -> Result<(), CollectorError> {
    let rm_err = |path: &Path| {
        let path = path.to_owned();
        move |source| CollectorError::Io { path, source }
    };
    let traces = run_dir.join("traces");
    if let Ok(rd) = std::fs::read_dir(&traces) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let ours = name.ends_with(".parquet") || name.ends_with(".inprogress");
            if name.starts_with("part-") && ours && !kept.contains(&name) {
                std::fs::remove_file(e.path()).map_err(rm_err(&e.path()))?;
            }
        }
    }
    let hdr = run_dir.join("hdr");
    if !checkpoint && hdr.exists() {
        std::fs::remove_dir_all(&hdr).map_err(rm_err(&hdr))?;
    }
    for name in ["clock.parquet", "probes.parquet"] {
        let p = run_dir.join(name);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(rm_err(&p)(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_utc_times() {
        assert_eq!(default_run_id(0), "run-19700101T000000Z");
        // Two runs started within the same second get directories of their own.
        let out = std::env::temp_dir().join(format!("hoptrace-claim-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let (a, _) = claim_run_dir(&out, "run-x").unwrap();
        let (b, dir) = claim_run_dir(&out, "run-x").unwrap();
        assert_eq!((a.as_str(), b.as_str()), ("run-x", "run-x-2"));
        assert!(dir.is_dir());
        std::fs::remove_dir_all(&out).unwrap();
        assert_eq!(
            default_run_id(1_700_000_000_000_000_000),
            "run-20231114T221320Z"
        );
        assert_eq!(
            default_run_id(1_709_210_096_000_000_000),
            "run-20240229T123456Z"
        );
    }
}
