#!/usr/bin/env bash
# Micro-benchmark of the interceptors' cost per record on the client's thread (StampBench):
# builds the test classes and runs the timed loops with -Xmx256m.
#
#   probes/jvm/bench.sh [RUNS] [RUN_MS]     # default 7 runs of 2000 ms each, median printed
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mvn -q -B -f "$HERE/pom.xml" test-compile
cpfile=$(mktemp)
trap 'rm -f "$cpfile"' EXIT
mvn -q -B -f "$HERE/pom.xml" dependency:build-classpath -Dmdep.includeScope=test -Dmdep.outputFile="$cpfile"
cp=$(cat "$cpfile")
java -Xmx256m -cp "$HERE/target/classes:$HERE/target/test-classes:$cp" dev.hoptrace.kafka.StampBench "$@"
