//! The report of a fixed generated run, pinned: `report.md`, `summary.json` and the chart
//! specs of a seeded run from the collector's generator must come out byte for byte as
//! committed under `tests/pinned/`, so a refactoring cannot change what users read
//! without the change showing in review. Where the host running the test shows (its
//! name, kernel, CPU, the run's directory), the text is replaced by a fixed word first.
//!
//! A deliberate change to the report: run with `HOPTRACE_BLESS=1` to rewrite the pinned
//! files, and review their diff.

use std::path::{Path, PathBuf};

use hoptrace_analysis::{RunSet, charts, report, summary};
use hoptrace_collector::generate::{GenerateOptions, generate, remove};

fn pinned_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pinned")
}

/// `text` with the run's directory (a fresh temporary one) replaced by a fixed word.
fn normalise(text: &str, run_dir: &Path) -> String {
    text.replace(&run_dir.display().to_string(), "<run dir>")
}

/// `v` as pretty JSON with every fractional number to 10 significant digits: sums of
/// floating-point values merged from parallel partitions may differ in their last bit
/// from run to run; anything a reader sees is far coarser.
fn json_text(v: &serde_json::Value) -> String {
    fn round(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Number(n) if n.is_f64() => {
                let f = n.as_f64().unwrap_or_default();
                let r: f64 = format!("{f:.9e}").parse().unwrap_or(f);
                if let Some(x) = serde_json::Number::from_f64(r) {
                    *n = x;
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(round),
            serde_json::Value::Object(o) => o.values_mut().for_each(round),
            _ => {}
        }
    }
    let mut v = v.clone();
    round(&mut v);
    serde_json::to_string_pretty(&v).unwrap()
}

/// Replaces the generating machine in `run.json` by a fixed one, so that nothing of the
/// host running the test reaches the report.
fn pin_host(run_dir: &Path) {
    let path = run_dir.join("run.json");
    let mut run: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    run["collector_host"] = serde_json::json!({
        "host": "pinned-host",
        "cpu_model": "pinned CPU",
        "cpus": 2,
        "memory_bytes": 25_769_803_776_u64,
        "kernel": "6.1.0-pinned",
    });
    std::fs::write(&path, serde_json::to_vec_pretty(&run).unwrap()).unwrap();
}

fn check(name: &str, got: &str, bless: bool, failures: &mut Vec<String>) {
    let path = pinned_dir().join(name);
    if bless {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with HOPTRACE_BLESS=1 to write it",
            path.display()
        )
    });
    if want != got {
        let line = want
            .lines()
            .zip(got.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| want.lines().count().min(got.lines().count()));
        failures.push(format!(
            "{name} differs from the pinned file from line {}:\n  pinned: {:?}\n  now:    {:?}",
            line + 1,
            want.lines().nth(line).unwrap_or("<end>"),
            got.lines().nth(line).unwrap_or("<end>"),
        ));
    }
}

#[test]
fn the_report_of_a_fixed_generated_run_is_as_pinned() {
    let bless = std::env::var("HOPTRACE_BLESS").as_deref() == Ok("1");
    let dir = hoptrace_testkit::tempdir("pinned");
    let mut o = GenerateOptions::new(20_000, &dir, "pinned");
    o.rows_per_file = 8_000;
    o.streams = 40;
    // The per-message shape the pinned files were made with.
    o.batch_max = 1;
    let g = generate(&o, |_| {}).unwrap();
    pin_host(&g.run_dir);
    let runs = RunSet::open(&[&g.run_dir]).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let (s, hists) = rt
        .block_on(async {
            let ctx = runs.session().await?;
            summary::compute(&runs, &ctx).await
        })
        .unwrap();
    let charts = charts::all(&s, &hists);
    let blocks = report::blocks(&s, &charts);
    let markdown = report::markdown(&blocks, &charts);
    let json = json_text(&serde_json::to_value(&s).unwrap());

    let mut failures = Vec::new();
    check(
        "report.md",
        &normalise(&markdown, &g.run_dir),
        bless,
        &mut failures,
    );
    check(
        "summary.json",
        &normalise(&json, &g.run_dir),
        bless,
        &mut failures,
    );
    for c in &charts {
        let spec = json_text(&c.spec);
        check(
            &format!("charts/{}.vl.json", c.stem),
            &normalise(&spec, &g.run_dir),
            bless,
            &mut failures,
        );
    }
    remove(&g.run_dir).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        failures.is_empty(),
        "the report changed (HOPTRACE_BLESS=1 rewrites the pinned files; review their diff):\n{}",
        failures.join("\n")
    );
}
