//! Every ```sh and ```bash block of README.md, run in order in one scratch directory with
//! the local services up (`infra/services.sh up`), by the shell it names (`sh` is POSIX:
//! a block that uses bash's arrays must say `bash`): each block must exit 0.
//!
//! The blocks run as written but for these substitutions, so that the whole README runs
//! in a few minutes on a shared 2-core machine:
//!
//! 1. `infra/demo.sh ARGS` is `hoptrace demo --runs runs --out reports/demo ARGS`: what
//!    the script runs once it has set the machine up and built a release binary (the
//!    suite has built its own binary already). `infra/test.sh` is the command running
//!    this test: it is only checked to be there.
//!    Other `infra/` scripts and `tap/testdata/` files are the repository's (the blocks
//!    run in a scratch directory), and `a && b` runs as two lines, so that a failing `a`
//!    fails the block.
//! 2. Durations (`--duration`, `--warmup`, `--window`) longer than 3 s are 3 s, and
//!    `--ramp-up` longer than 1 s is 1 s; commands whose default runs longer (publish,
//!    demo and soak without `--duration`; sweep without `--warmup`/`--window`) are given
//!    3 s (sweep: `--warmup 1s --window 2s`).
//! 3. `--rate` values are scaled down so that the largest is at most 20k metrics/s.
//! 4. Port 7400 (the default collector port, which others on this machine may hold) is a
//!    free port, and `hoptrace collect`/`relay` without `--listen` listen on it.
//! 5. A command that runs until Ctrl-C (`hoptrace collect`, `relay`, `tap` without
//!    `--duration`, whether or not the README ends it with `&`) runs in the background, as
//!    in a terminal of its own, is waited for until it listens (collect, relay) or for 2 s
//!    (tap), and gets SIGINT at the end of its block; it must exit 0 too.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{bin, broker};

/// The ```sh and ```bash blocks of a Markdown text: the line each starts on, the shell it
/// names, its text.
fn sh_blocks(markdown: &str) -> Vec<(usize, &'static str, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, &'static str, String)> = None;
    for (i, line) in markdown.lines().enumerate() {
        match &mut current {
            None => {
                let shell = match line.trim_start() {
                    "```sh" => "sh",
                    "```bash" => "bash",
                    _ => continue,
                };
                current = Some((i + 1, shell, String::new()));
            }
            Some(_) if line.trim_start().starts_with("```") => {
                blocks.push(current.take().unwrap());
            }
            Some((_, _, text)) => {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    assert!(current.is_none(), "an unclosed ```sh block");
    blocks
}

/// Splits shell text into logical lines (continuations and multi-line quotes joined),
/// each without its comment.
fn logical_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    let (mut single, mut double, mut comment) = (false, false, false);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if comment {
            if c == '\n' {
                comment = false;
                if !cur.trim().is_empty() {
                    lines.push(std::mem::take(&mut cur));
                }
                cur.clear();
            }
            continue;
        }
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && (cur.is_empty() || cur.ends_with(char::is_whitespace)) => {
                comment = true;
                continue;
            }
            '\\' if !single && chars.peek() == Some(&'\n') => {
                chars.next();
                cur.push(' ');
                continue;
            }
            '\n' if !single && !double => {
                if !cur.trim().is_empty() {
                    lines.push(std::mem::take(&mut cur));
                }
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        lines.push(cur);
    }
    lines.into_iter().map(|l| l.trim_end().to_owned()).collect()
}

/// Seconds in a duration written with a unit, when it has one of s, m, h.
fn seconds(v: &str) -> Option<f64> {
    let split = v.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (n, unit) = v.split_at(split);
    let n: f64 = n.parse().ok()?;
    match unit {
        "s" => Some(n),
        "m" | "min" => Some(n * 60.0),
        "h" => Some(n * 3600.0),
        _ => None,
    }
}

fn rate_value(v: &str) -> Option<f64> {
    let (n, mult) = match v.chars().last()? {
        'k' => (&v[..v.len() - 1], 1e3),
        'M' => (&v[..v.len() - 1], 1e6),
        _ => (v, 1.0),
    };
    n.parse::<f64>().ok().map(|x| x * mult)
}

/// Substitutions 2 and 3 on the words of one command line.
fn shorten(words: &mut [String]) {
    for i in 1..words.len() {
        let (flag, value) = (words[i - 1].as_str(), words[i].clone());
        match flag {
            "--duration" | "--warmup" | "--window" if seconds(&value).is_some_and(|s| s > 3.0) => {
                words[i] = "3s".into();
            }
            "--ramp-up" if seconds(&value).is_some_and(|s| s > 1.0) => {
                words[i] = "1s".into();
            }
            "--rate" => {
                let rates: Option<Vec<f64>> = value.split(',').map(rate_value).collect();
                if let Some(rates) = rates {
                    let max = rates.iter().copied().fold(0.0, f64::max);
                    if max > 20_000.0 {
                        words[i] = rates
                            .iter()
                            .map(|r| format!("{:.0}", r * 20_000.0 / max))
                            .collect::<Vec<_>>()
                            .join(",");
                    }
                }
            }
            _ => {}
        }
    }
}

/// `infra/...` at the start of a word as the repository's path: the blocks run in a
/// scratch directory.
fn repo_infra(line: &str) -> String {
    let mut out = String::new();
    let mut at_word_start = true;
    let mut rest = line;
    while let Some(c) = rest.chars().next() {
        if let Some(dir) = REPO_DIRS
            .iter()
            .find(|d| at_word_start && rest.starts_with(*d))
        {
            out.push_str(&format!("{}/{dir}", repo().display()));
            rest = &rest[dir.len()..];
            at_word_start = false;
            continue;
        }
        at_word_start = c.is_whitespace() || c == ';' || c == '(' || c == '=';
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// Paths in README commands that name the repository's files.
const REPO_DIRS: [&str; 2] = ["infra/", "tap/testdata/"];

/// One README line as the test runs it.
fn substitute(line: &str, port: u16) -> String {
    // `a && b` (services.sh up && infra/demo.sh ...) on two lines: under `set -e` a failing
    // `a` would otherwise skip `b` silently.
    if line.contains(" && ") {
        return line
            .split(" && ")
            .map(|part| substitute(part, port))
            .collect::<Vec<_>>()
            .join("\n");
    }
    let line = line.replace(":7400", &format!(":{port}"));
    let trimmed = line.trim_start();
    if let Some(rest) = trimmed.strip_prefix("infra/demo.sh") {
        return substitute(
            &format!("hoptrace demo --runs runs --out reports/demo{rest}"),
            port,
        );
    }
    if trimmed.starts_with("infra/test.sh") {
        return format!("test -x {}/infra/test.sh", repo().display());
    }
    if !trimmed.starts_with("hoptrace ") {
        return repo_infra(&line);
    }
    let background = trimmed.ends_with('&') && !trimmed.ends_with("&&");
    let body = trimmed.trim_end_matches('&').trim_end();
    // The words of a hoptrace command: README commands quote with '...' and "..." only
    // around words, so splitting on spaces outside quotes keeps each word whole.
    let mut words = Vec::new();
    let mut cur = String::new();
    let (mut single, mut double) = (false, false);
    for c in body.chars() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            ' ' if !single && !double => {
                if !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    shorten(&mut words);
    let sub = words.get(1).map_or("", String::as_str).to_owned();
    let given: Vec<String> = words.clone();
    let has = |flag: &str| {
        given
            .iter()
            .any(|w| w == flag || w.starts_with(&format!("{flag}=")))
    };
    match sub.as_str() {
        "publish" if !has("--duration") && !has("--messages") && !has("--replay") => {
            words.extend(["--duration".into(), "3s".into()]);
        }
        "demo" | "soak" if !has("--duration") => {
            words.extend(["--duration".into(), "3s".into()]);
        }
        "sweep" => {
            if !has("--warmup") {
                words.extend(["--warmup".into(), "1s".into()]);
            }
            if !has("--window") {
                words.extend(["--window".into(), "2s".into()]);
            }
        }
        "collect" | "relay" if !has("--listen") && !has("--from") => {
            words.extend(["--listen".into(), format!("127.0.0.1:{port}")]);
        }
        _ => {}
    }
    let mut out = repo_infra(&words.join(" "));
    let runs_until_stopped =
        matches!(sub.as_str(), "collect" | "relay" | "tap") && !has("--duration");
    if runs_until_stopped {
        // Substitution 5: in the background (whether or not the README puts it there),
        // ready before the next line, stopped at the end of the block.
        let listens = matches!(sub.as_str(), "collect" | "relay") && !has("--from");
        out.push_str(" & __bg=\"$__bg $!\";");
        if listens {
            out.push_str(&format!(" __ready {port} $!"));
        } else {
            out.push_str(" sleep 2");
        }
    } else if background {
        out.push_str(" &");
    }
    out
}

/// What every block's script starts with, in POSIX sh (a `bash` block runs it too):
/// `__ready PORT PID` waits until something listens on the port (or the process ended),
/// `__stop` interrupts the background commands and checks that each exited 0.
const PREAMBLE: &str = r#"set -eu
__bg=""
__ready() {
    # Until something listens on 127.0.0.1:$1, or process $2 ended.
    __i=0
    while [ "$__i" -lt 300 ]; do
        if python3 -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.5).close()' "$1" 2>/dev/null; then return 0; fi
        kill -0 "$2" 2>/dev/null || { echo "readme: process $2 ended before listening on $1" >&2; return 1; }
        sleep 0.1
        __i=$((__i + 1))
    done
    echo "readme: nothing listens on 127.0.0.1:$1 after 30 s" >&2
    return 1
}
__stop() {
    __rc=0
    for __p in $__bg; do kill -INT "$__p" 2>/dev/null || true; done
    # 127: the block waited for it itself (`kill -INT %1; wait %1`).
    for __p in $__bg; do
        __s=0
        wait "$__p" 2>/dev/null || __s=$?
        if [ "$__s" -ne 0 ] && [ "$__s" -ne 127 ]; then
            echo "readme: background process $__p exited $__s" >&2
            __rc=1
        fi
    done
    __bg=""
    return $__rc
}
trap 'for __p in $__bg; do kill -INT "$__p" 2>/dev/null || true; done' EXIT
"#;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs one block's script in `dir` with `shell` (`sh` or `bash`), at most `within`.
fn run_block(dir: &Path, shell: &str, script: &str, within: Duration) -> (bool, String) {
    let bin_dir = Path::new(bin()).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let log = dir.join("block.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(shell)
        .args(["-c", script])
        .current_dir(dir)
        .env("PATH", path)
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let status = hoptrace_testkit::exit_within(&mut child, within);
    if status.is_none() {
        child.kill().ok();
        child.wait().ok();
    }
    let out = std::fs::read_to_string(&log).unwrap_or_default();
    match status {
        Some(s) => (s.success(), format!("{out}\n(exit: {s})")),
        None => (
            false,
            format!("{out}\n(still running after {within:?}: killed)"),
        ),
    }
}

#[test]
fn substitutions() {
    let p = 9999;
    assert_eq!(
        substitute(
            "hoptrace collect --listen 127.0.0.1:7400 --pipeline p.toml --runs runs/",
            p
        ),
        "hoptrace collect --listen 127.0.0.1:9999 --pipeline p.toml --runs runs/ & __bg=\"$__bg $!\"; __ready 9999 $!"
    );
    assert_eq!(
        substitute(
            "hoptrace publish --to mqtt://h:1 --rate 1M --duration 30m",
            p
        ),
        "hoptrace publish --to mqtt://h:1 --rate 20000 --duration 3s"
    );
    assert_eq!(
        substitute("hoptrace sweep --broker x --rate 100k,300k,500k --out o", p),
        "hoptrace sweep --broker x --rate 4000,12000,20000 --out o --warmup 1s --window 2s"
    );
    let infra = format!("{}/infra/", repo().display());
    assert_eq!(
        substitute(
            "infra/services.sh up && infra/demo.sh --broker 'kafka://a/b?x=1&y=2'",
            p
        ),
        format!(
            "{infra}services.sh up\nhoptrace demo --runs runs --out reports/demo --broker 'kafka://a/b?x=1&y=2' --duration 3s"
        )
    );
    // A repository path assigned to a variable (`P=tap/testdata/x.toml`) is one too.
    assert_eq!(
        substitute("source infra/env.sh; x=infra/y", p),
        format!("source {infra}env.sh; x={infra}y")
    );
    assert_eq!(
        substitute(
            "hoptrace record --from m --topics 'f/#' --out c.parquet --duration 60s &",
            p
        ),
        "hoptrace record --from m --topics 'f/#' --out c.parquet --duration 3s &"
    );
    assert_eq!(
        substitute(
            "hoptrace tap --from x --collector 127.0.0.1:7400 --pipeline tap/testdata/a.toml &",
            p
        ),
        format!(
            "hoptrace tap --from x --collector 127.0.0.1:9999 --pipeline {}/tap/testdata/a.toml & __bg=\"$__bg $!\"; sleep 2",
            repo().display()
        )
    );
    let lines = logical_lines(
        "a 'x # y' # comment\nb \\\n  c\nd \"1\n2\" e\n# only a comment\n  f ||\n    g\n",
    );
    assert_eq!(
        lines,
        ["a 'x # y'", "b    c", "d \"1\n2\" e", "  f ||", "    g"]
    );
}

#[test]
#[ignore = "needs the brokers (infra/services.sh up; source infra/env.sh): infra/test.sh runs it"]
fn every_readme_command_block_runs() {
    let (_mqtt, _kafka) = (broker("HOPTRACE_MQTT"), broker("HOPTRACE_KAFKA"));
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let blocks = sh_blocks(&readme);
    assert!(blocks.len() >= 10, "{} blocks", blocks.len());
    let dir = std::env::temp_dir().join(format!("hoptrace-readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    for (line, shell, text) in &blocks {
        let mut script = String::from(PREAMBLE);
        for l in logical_lines(text) {
            // A line continued on the next (`cmd ||`) is joined with it by bash itself.
            script.push_str(&substitute(&l, port));
            script.push('\n');
        }
        script.push_str("__stop\n");
        let started = Instant::now();
        let (ok, out) = run_block(&dir, shell, &script, Duration::from_secs(900));
        eprintln!(
            "README.md:{line}: {} in {:.0} s\n{script}\n{out}",
            if ok { "ran" } else { "FAILED" },
            started.elapsed().as_secs_f64()
        );
        assert!(
            ok,
            "README.md block at line {line} failed.\n--- as run\n{script}\n--- output\n{out}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The words of one command line, quotes removed (README commands quote whole words).
fn unquoted_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let (mut single, mut double) = (false, false);
    for c in line.trim().trim_end_matches('&').chars() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            ' ' if !single && !double => {
                if !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    words
}

/// The value of `flag` in `words`, if given.
fn flag<'a>(words: &'a [String], flag: &str) -> Option<&'a str> {
    words
        .windows(2)
        .find(|w| w[0] == flag)
        .map(|w| w[1].as_str())
        .or_else(|| {
            words
                .iter()
                .find_map(|w| w.strip_prefix(&format!("{flag}=")))
        })
}

/// A README recipe, run as written, ends with complete traces: in every block that starts
/// a collector and reports to it with taps and publishers, each reports hops the
/// collector's pipeline declares, with the same `--pipeline`, and together they stamp
/// every hop that pipeline expects. (The publish-and-tap recipe once tapped `flow_in`
/// of the six-hop default pipeline: every message ended incomplete.)
#[test]
fn readme_recipes_stamp_every_hop_their_collector_expects() {
    use hoptrace_format::spec::PipelineSpec;
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let mut checked = 0;
    for (line, _, text) in sh_blocks(&readme) {
        // The block's shell variables (`P=tap/testdata/x.toml`), expanded in its commands.
        let mut vars: Vec<(String, String)> = Vec::new();
        let mut commands: Vec<Vec<String>> = Vec::new();
        for l in logical_lines(&text) {
            let words = unquoted_words(&l);
            if let [only] = words.as_slice()
                && let Some((name, value)) = only.split_once('=')
                && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
            {
                vars.push((name.to_owned(), value.to_owned()));
                continue;
            }
            if words.first().is_some_and(|p| p == "hoptrace") {
                commands.push(
                    words
                        .into_iter()
                        .map(|w| {
                            vars.iter()
                                .fold(w, |w, (n, v)| w.replace(&format!("${n}"), v))
                        })
                        .collect(),
                );
            }
        }
        let Some(collect) = commands
            .iter()
            .find(|w| w[1] == "collect" && flag(w, "--from").is_none())
        else {
            continue;
        };
        let reporters: Vec<&Vec<String>> = commands
            .iter()
            .filter(|w| {
                matches!(w[1].as_str(), "tap" | "publish") && flag(w, "--collector").is_some()
            })
            .collect();
        if reporters.is_empty() {
            continue;
        }
        let pipeline = flag(collect, "--pipeline");
        let spec = pipeline.map_or_else(PipelineSpec::default_pipeline, |p| {
            PipelineSpec::load(repo().join(p))
                .unwrap_or_else(|e| panic!("README.md:{line}: {p}: {e}"))
        });
        let declared: Vec<&str> = spec.hops.iter().map(|h| h.name.as_str()).collect();
        let mut stamped: Vec<String> = Vec::new();
        for w in reporters {
            assert_eq!(
                flag(w, "--pipeline"),
                pipeline,
                "README.md:{line}: `{}` and its collector name different pipelines",
                w.join(" ")
            );
            let from = flag(w, "--from").unwrap_or_default();
            let hops: Vec<String> = if w[1] == "tap" && hoptrace_tap::store::is_store_url(from) {
                let kind = hoptrace_tap::StoreUrl::parse(from).unwrap().kind;
                let queryable = flag(w, "--queryable-hop").unwrap_or("queryable");
                let mut h = vec![queryable.to_owned()];
                // A polled hop's earliest instant, where the spec names a hop for it.
                if let Some(e) = spec.earliest_of(queryable) {
                    h.push(e.to_owned());
                }
                match flag(w, "--query-start-hop") {
                    Some("none") => {}
                    other => h.push(other.unwrap_or("query_start").to_owned()),
                }
                let store_in = match flag(w, "--store-in") {
                    Some("on") => true,
                    Some("off") => false,
                    _ => kind.store_in_by_default(),
                };
                if store_in {
                    h.push(flag(w, "--store-in-hop").unwrap_or("store_in").to_owned());
                }
                h
            } else {
                let default = if w[1] == "tap" { "broker" } else { "publish" };
                vec![flag(w, "--hop").unwrap_or(default).to_owned()]
            };
            for h in hops {
                assert!(
                    declared.contains(&h.as_str()),
                    "README.md:{line}: `{}` reports hop {h:?}, which the collector's pipeline {:?} does not declare ({declared:?})",
                    w.join(" "),
                    spec.name
                );
                stamped.push(h);
            }
        }
        let expected: Vec<&str> = match &spec.expected {
            Some(e) => e.iter().map(String::as_str).collect(),
            None => declared.clone(),
        };
        for hop in expected {
            assert!(
                stamped.iter().any(|s| s == hop),
                "README.md:{line}: nothing in the block stamps hop {hop:?}, which the pipeline {:?} expects: every message would end incomplete",
                spec.name
            );
        }
        checked += 1;
    }
    assert!(checked >= 2, "{checked} recipes checked");
}
