#!/usr/bin/env bash
# The main job from a fresh machine: build hoptrace and run a measurement that ends in a
# report. Until `hoptrace demo` exists this runs `hoptrace roundtrip`: traced messages
# through five in-process hops, every stamp exported over loopback TCP with the
# collector protocol, joined and reported per stage with exact accounting.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/hoptrace-target}
cargo build --release --locked --bin hoptrace
exec "$CARGO_TARGET_DIR/release/hoptrace" roundtrip "$@"
