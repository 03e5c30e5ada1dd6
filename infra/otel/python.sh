#!/usr/bin/env bash
# A Python environment with OpenTelemetry's auto-instrumentation and its Kafka client
# instrumentation (PyPI), for the tests that measure a pipeline traced with OpenTelemetry
# and no hoptrace code. Creates it once (or again when the pinned versions change) and
# prints the path of its bin/ directory.
#
#   infra/otel/python.sh            # -> /var/tmp/hoptrace-otel-py/bin
#
# HOPTRACE_OTEL_PY overrides where the environment lives.
set -euo pipefail

DIR=${HOPTRACE_OTEL_PY:-/var/tmp/hoptrace-otel-py}
PACKAGES=(
    opentelemetry-distro==0.66b1
    opentelemetry-instrumentation==0.66b1
    opentelemetry-instrumentation-confluent-kafka==0.66b1
    opentelemetry-sdk==1.45.1
    opentelemetry-exporter-otlp-proto-http==1.45.1
    confluent-kafka==2.16.1
)
want="${PACKAGES[*]}"
if [[ ! -x $DIR/bin/opentelemetry-instrument || $(cat "$DIR/.pinned" 2>/dev/null) != "$want" ]]; then
    echo "otel-python: installing ${PACKAGES[*]} into $DIR" >&2
    rm -rf "$DIR"
    python3 -m venv "$DIR"
    "$DIR/bin/pip" install --quiet --disable-pip-version-check "${PACKAGES[@]}" >&2
    printf '%s' "$want" > "$DIR/.pinned"
fi
echo "$DIR/bin"
