#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs and starts what the tests need
# (Mosquitto, a KRaft Kafka, chrony, Python test packages), runs every test with
# HOPTRACE_INTEGRATION=1 (a missing broker is a failure, not a skip) and the Rust tests
# that need brokers or stores (#[ignore]d for a plain `cargo test`), stops the services,
# and ends with one summary line "tests: N passed, M failed".
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# A target directory outside the clone, reused between runs to save build time.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/hoptrace-target}
export HOPTRACE_INTEGRATION=1
LOG=$(mktemp -d /tmp/hoptrace-test.XXXXXX)

infra/setup.sh --browser
# Services already running (someone's shell, another run) are used and left running; the
# ones this run starts, it stops.
stop_at_exit=()
if infra/services.sh status >/dev/null 2>&1; then
    infra/services.sh up
    echo "services were already running: they stay up after the tests"
else
    infra/services.sh up
    stop_at_exit+=("infra/services.sh down")
fi
# The stores and Node-RED: tests start what they need, and what was not running before this
# run is stopped at its end, whichever test left it running.
for store in influxdb postgres clickhouse victoriametrics; do
    infra/stores/$store.sh status >/dev/null 2>&1 || stop_at_exit+=("infra/stores/$store.sh stop")
done
infra/nodered/nodered.sh status >/dev/null 2>&1 || stop_at_exit+=("infra/nodered/nodered.sh stop")
# The 3-node Kafka cluster (the consumer-group tests, MirrorMaker 2) is started once, just
# before the suites that need it, from fresh state when none of its nodes runs (test topics
# of earlier runs would otherwise pile up and slow every start); the suites find it running
# and leave it so. A cluster someone had running stays up.
cluster_started=0
start_cluster() {
    ((cluster_started)) && return 0
    cluster_started=1
    if infra/kafka/kafka.sh status --nodes 3 >/dev/null 2>&1; then
        echo "the 3-node Kafka cluster was already running: it stays up after the tests"
        return 0
    fi
    if ! infra/kafka/kafka.sh status --nodes 3 2>/dev/null | grep -q ': running'; then
        infra/kafka/kafka.sh wipe --nodes 3
    fi
    stop_at_exit+=("infra/kafka/kafka.sh stop --nodes 3")
    infra/kafka/kafka.sh start --nodes 3
}
stop_services() {
    local i
    # In the reverse order of starting.
    for ((i = ${#stop_at_exit[@]} - 1; i >= 0; i--)); do
        ${stop_at_exit[i]} >/dev/null 2>&1 || true
    done
}
trap stop_services EXIT
# shellcheck source=env.sh
source infra/env.sh

step() { printf '\n== %s\n' "$*"; }

step "python test packages (independent Parquet readers)"
python3 -c 'import pyarrow, duckdb, jsonschema' 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check pyarrow duckdb jsonschema

step "rust: the fast tier (format, lints, docs, the tests that need no service)"
set +e
infra/test-fast.sh 2>&1 | tee "$LOG/cargo-fast.txt"
rc=${PIPESTATUS[0]}
set -e

step "rust: the tests that need the brokers, the stores or root"
set +e
# They are #[ignore]d (a plain `cargo test` lists them as ignored); here they run, with the
# services up. The long benchmark harness stays out.
cargo test --profile quick --workspace --all-features --locked --no-fail-fast -- --ignored --skip bench_from_env 2>&1 | tee "$LOG/cargo.txt"
if ((PIPESTATUS[0] != 0)); then rc=1; fi
set -e

step "the 3-node Kafka cluster"
start_cluster || rc=1

step "python: trace format reference implementation; HdrHistogram logs read by Java; reports checked by DuckDB and Chromium; the live view in Chromium"
# The binary cargo test built (the quick profile, as the demo's): the runs these tests make
# are small, and a release build of DataFusion would add a quarter of an hour on 2 cores.
export HOPTRACE_BIN=$CARGO_TARGET_DIR/quick/hoptrace
# Screenshots and other artifacts tests keep.
export HOPTRACE_ARTIFACTS=${HOPTRACE_ARTIFACTS:-$LOG/artifacts}
set +e
python3 -m pytest -q -p no:cacheprovider probe/testdata collector/tests analysis/tests 2>&1 | tee "$LOG/pytest.txt"
pyrc=${PIPESTATUS[0]}
set -e
if ((pyrc != 0)); then rc=1; fi

# suite NAME LOG COMMAND...: runs one more suite, its output also into $LOG/LOG.
suite() {
    local name=$1 log=$2
    shift 2
    step "$name"
    set +e
    "$@" 2>&1 | tee "$LOG/$log"
    local status=${PIPESTATUS[0]}
    set -e
    if ((status != 0)); then rc=1; fi
}
# fuzz_bounded SECONDS: the coverage-guided fuzzers of probe/fuzz for SECONDS each, where a
# nightly toolchain is installed (cargo-fuzz needs it); ends with "fuzz: N passed, M failed".
fuzz_bounded() {
    local secs=$1 target passed=0 failed=0
    if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
        echo "fuzz: no nightly toolchain; the stable corpus test (probe/tests/fuzz_corpus.rs) ran instead"
        return 0
    fi
    if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
        cargo +nightly install --locked --quiet cargo-fuzz || { echo "fuzz: installing cargo-fuzz failed"; return 1; }
    fi
    for target in trace_context collector_frames; do
        if (cd probe && cargo +nightly fuzz run "$target" -- -max_total_time="$secs" -print_final_stats=0 2>&1 | tail -n 3); then
            passed=$((passed + 1))
        else
            failed=$((failed + 1))
        fi
    done
    echo "fuzz: $passed passed, $failed failed"
    ((failed == 0))
}
suite "fuzz (30 s per target)" fuzz.txt fuzz_bounded 30
suite "probes in other languages: Python" pytest-python-probe.txt probes/python/test.sh -q
suite "probes in other languages: JVM Kafka interceptors, MirrorMaker 2" jvm.txt probes/jvm/test.sh
suite "probes in other languages: Node-RED" nodered.txt probes/node-red/test.sh
suite "stores (InfluxDB, PostgreSQL, ClickHouse, VictoriaMetrics) and the Node-RED pipeline" \
    pytest-stores.txt infra/stores/test.sh

passed=0
failed=0
while read -r p f; do
    passed=$((passed + p))
    failed=$((failed + f))
done < <(
    sed -nE 's/^test result: [a-zA-Z]+\. ([0-9]+) passed; ([0-9]+) failed.*/\1 \2/p' "$LOG/cargo-fast.txt" "$LOG/cargo.txt"
    # Each pytest log's last line, e.g. "3 failed, 160 passed, 2 errors in 99.1s": errors
    # (a fixture that failed) count as failures.
    # Maven's summary lines "Tests run: N, Failures: F, Errors: E, Skipped: S" (nothing after
    # them, unlike a test class's line): one of the unit tests, one of the integration tests.
    grep -E '^\[[A-Z]+\] Tests run: [0-9]+, Failures: [0-9]+, Errors: [0-9]+, Skipped: [0-9]+[[:space:]]*$' \
        "$LOG/jvm.txt" 2>/dev/null |
        sed -E 's/.*Tests run: ([0-9]+), Failures: ([0-9]+), Errors: ([0-9]+), Skipped: ([0-9]+).*/\1 \2 \3 \4/' |
        awk '{print $1 - $2 - $3 - $4, $2 + $3}'
    sed -nE 's/^node-red: ([0-9]+) passed, ([0-9]+) failed.*/\1 \2/p' "$LOG/nodered.txt" 2>/dev/null | tail -1
    sed -nE 's/^fuzz: ([0-9]+) passed, ([0-9]+) failed.*/\1 \2/p' "$LOG/fuzz.txt" 2>/dev/null | tail -1
    # A log without that line (a suite whose set-up failed before pytest ran) counts as one
    # failure, and the other logs are still counted.
    for f in "$LOG"/pytest*.txt; do
        line=$(grep -E '[0-9]+ (passed|failed|errors?)\b.* in [0-9.]+s' "$f" | tail -1 || true)
        if [[ -n $line ]]; then
            echo "$line"
        else
            echo "$(basename "$f"): no test summary; counted as 1 failed" >&2
            echo "1 failed in 0s"
        fi
    done |
        awk '{p = 0; f = 0
              for (i = 2; i <= NF; i++) {
                  n = $(i - 1) + 0; w = $i; gsub(/[^a-z]/, "", w)
                  if (w == "passed") p += n
                  else if (w == "failed" || w == "error" || w == "errors") f += n
              }
              print p, f}'
)
echo
echo "artifacts: $HOPTRACE_ARTIFACTS"
echo "tests: $passed passed, $failed failed"
if ((rc != 0 || failed != 0)); then
    exit 1
fi
