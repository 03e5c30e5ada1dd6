#!/usr/bin/env bash
# Builds the hoptrace Kafka interceptors with Maven and runs their tests (mvn verify).
#
#   probes/jvm/test.sh                     unit tests (trace vectors, frames, settings, exporter,
#                                          interceptors, hostile collectors), then the built jar
#                                          (JarIT: contents, references, a class loader with
#                                          only kafka-clients)
#   HOPTRACE_INTEGRATION=1 HOPTRACE_BIN=/path/to/hoptrace probes/jvm/test.sh
#                                          also the tests against the real collector and Kafka,
#                                          MirrorMaker 2's included (mm2/run.sh --short)
#   probes/jvm/test.sh -Dtest=HostileTest -Dit.test=JarIT
#                                          arguments go to Maven: here one unit test class
#                                          and one integration test class
#
# Maven fetches its plugins and the test dependencies on the first run; later runs work
# offline (HOPTRACE_MAVEN_OFFLINE=1 forces -o). Exits non-zero when a test fails.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
command -v mvn >/dev/null || { echo "jvm test: mvn not found (apt-get install maven)" >&2; exit 1; }
command -v java >/dev/null || { echo "jvm test: java not found (a JDK 17)" >&2; exit 1; }
if [[ ${HOPTRACE_INTEGRATION:-} == 1 && -z ${HOPTRACE_BIN:-} ]]; then
    echo "jvm test: HOPTRACE_INTEGRATION=1 needs HOPTRACE_BIN, the hoptrace binary" >&2
    exit 1
fi
offline=()
[[ ${HOPTRACE_MAVEN_OFFLINE:-} == 1 ]] && offline=(-o)
exec mvn -B "${offline[@]}" -f "$HERE/pom.xml" verify "$@"
