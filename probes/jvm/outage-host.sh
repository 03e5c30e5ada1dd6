#!/usr/bin/env bash
# The host process of the JVM probe's outage soak (OutageHost, in the test sources): a Kafka
# producer sending traced records open-loop, with the hoptrace producer interceptor when
# --collector is given, printing one JSON line a second on stdout (logs on stderr).
#
#   probes/jvm/outage-host.sh --prepare      # compile and write target/outage-host.classpath, then exit
#   probes/jvm/outage-host.sh --topic T [--bootstrap 127.0.0.1:19092] [--rate 10000]
#       [--streams 3000] [--duration 60] [--collector HOST:PORT [--hop publish] [--hop-id 0]]
#       [--publisher 1] [--client-id NAME]
#
# Without --prepare it compiles only when the classpath file is missing or a source is newer
# (run --prepare first when starting several hosts at once). It then execs the JVM
# (-Xmx256m, then the words of $HOPTRACE_HOST_JAVA_OPTS, e.g. -XX:+AlwaysPreTouch), so this
# script's PID is the JVM's.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CPFILE="$HERE/target/outage-host.classpath"

prepare() {
    # Maven's output goes to stderr: stdout belongs to the host's JSON lines.
    mvn -q -B -f "$HERE/pom.xml" test-compile >&2
    mvn -q -B -f "$HERE/pom.xml" dependency:build-classpath -Dmdep.includeScope=test \
        -Dmdep.outputFile="$CPFILE.tmp" >&2
    mv "$CPFILE.tmp" "$CPFILE"
}

if [[ ${1:-} == --prepare ]]; then
    prepare
    exit 0
fi
if [[ ! -s $CPFILE || ! -f $HERE/target/test-classes/dev/hoptrace/kafka/OutageHost.class ]] \
    || [[ -n $(find "$HERE/src" "$HERE/pom.xml" -newer "$CPFILE" -name '*.java' -o -newer "$CPFILE" -name pom.xml | head -1) ]]; then
    prepare
fi
read -ra extra <<<"${HOPTRACE_HOST_JAVA_OPTS:-}"
exec java -Xmx256m "${extra[@]}" -cp "$HERE/target/classes:$HERE/target/test-classes:$(cat "$CPFILE")" \
    dev.hoptrace.kafka.OutageHost "$@"
