#!/usr/bin/env bash
# The fast tier of the test suite: what needs no broker, no store, no root and no network
# namespace, only Rust and Node.js (npm installs the chart libraries the reports inline).
# Formatting, lints, the libraries' API docs (warnings denied), the probe's build on the
# oldest Rust it supports (rustup installs that toolchain once), and every Rust test a plain
# `cargo test` runs; the tests that need services are #[ignore]d, listed as ignored here,
# and run by infra/test.sh after this tier passes. On a laptop:
#
#   infra/test-fast.sh
#
# Builds with the quick profile (Cargo.toml) into ${CARGO_TARGET_DIR:-/var/tmp/hoptrace-target},
# the build infra/test.sh and the demo reuse. Ends with "fast tier: N passed, M failed".
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/hoptrace-target}

step() { printf '\n== %s\n' "$*"; }

step "fast tier: the chart libraries the reports inline (npm ci, once)"
infra/setup.sh --web

step "fast tier: format"
cargo fmt --all -- --check

step "fast tier: lints (clippy, warnings denied)"
cargo clippy --profile quick --workspace --all-targets --all-features --locked -- -D warnings

step "fast tier: API docs of the libraries (warnings denied)"
# The command's own crate is a binary: its /// comments are its --help text, not docs.
RUSTDOCFLAGS="-D warnings" cargo doc --profile quick --workspace --exclude hoptrace --no-deps \
    --all-features --locked

step "fast tier: the embedded crates on the oldest Rust they support (rust-version)"
# hoptrace-probe and what it builds on are compiled into other people's programs, with
# other people's compilers: they must build on the rust-version Cargo.toml states.
msrv=$(sed -nE 's/^rust-version = "([0-9.]+)"/\1/p' Cargo.toml)
[[ $msrv == *.*.* ]] || msrv=$msrv.0 # rustup names the release 1.88.0, not 1.88
rustup toolchain list | grep -qF "$msrv-" || rustup toolchain install "$msrv" --profile minimal
cargo "+$msrv" check --locked --all-features --lib -p hoptrace-probe -p hoptrace-protocol -p hoptrace-clock

step "fast tier: tests (those needing services are listed as ignored)"
log=$(mktemp)
set +e
cargo test --profile quick --workspace --all-features --locked --no-fail-fast 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
read -r passed failed < <(sed -nE 's/^test result: [a-zA-Z]+\. ([0-9]+) passed; ([0-9]+) failed.*/\1 \2/p' "$log" |
    awk '{p += $1; f += $2} END {print p + 0, f + 0}')
ignored=$(sed -nE 's/^test result: .* ([0-9]+) ignored;.*/\1/p' "$log" | awk '{s += $1} END {print s + 0}')
rm -f "$log"
echo
echo "fast tier: $passed passed, $failed failed ($ignored ignored: they need services, infra/test.sh runs them)"
exit "$rc"
