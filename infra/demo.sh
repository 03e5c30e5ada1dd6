#!/usr/bin/env bash
# The main job from a fresh machine: install what is missing, build hoptrace, and run
# `hoptrace demo`: a publisher sends traced metrics through an MQTT broker in the same
# process to the reference pipeline's processor and store, every hop reports its stamps to
# the collector, and the report (report.md, report.html, summary.json, charts/) is
# written to reports/demo/. Options go to `hoptrace demo` (see `hoptrace demo --help`),
# e.g. `infra/demo.sh --rate 200k --duration 60s`, or `--broker kafka://127.0.0.1:19092/hoptrace-demo`
# after `infra/services.sh up`.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/hoptrace-target}
infra/setup.sh --demo
# The quick profile (Cargo.toml): probe, collector, broker and pipeline optimised as in a
# release build, DataFusion and Arrow not; a few minutes on 2 cores instead of ~22.
cargo build --profile quick --locked --bin hoptrace
exec "$CARGO_TARGET_DIR/quick/hoptrace" demo --runs "$ROOT/runs" --out "$ROOT/reports/demo" "$@"
