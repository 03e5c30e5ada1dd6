//! The commented pipeline spec `hoptrace` starts from: publisher → broker → stream
//! processor → store, with the five stages of the reference report.

/// A commented pipeline spec for publisher → broker → stream processor → store, with the
/// five stages of the reference report. [`PipelineSpec::default_pipeline`](super::PipelineSpec::default_pipeline) parses it.
pub const DEFAULT_PIPELINE_TOML: &str = r#"# hoptrace pipeline spec.
#
# A hop is a named point where a message is stamped with the hop's clock (CLOCK_REALTIME).
# A stage is the difference of two hops' stamps (`to` minus `from`); the report prints
# percentiles of every stage. Times are named by unit: `_ms` milliseconds.

# Pipeline name, printed at the top of every report.
name = "mqtt-flow-store"

# Hops that every message must pass. A trace is complete once all of them have stamped it;
# a trace that misses one is reported as incomplete, with the missing hops named. Hops
# not listed here are optional (a sampled tap, for example): recorded when they stamp,
# never counted as missing. Leave this out to expect every declared hop.
# expected = ["publish", "flow_in", "flow_out", "store_in", "query_start", "queryable"]

# The hops, in pipeline order. Up to 16.
[[hops]]
# Hop name: lower-case letters, digits and `_`; it names the hop's column in the results
# (`publish_ns`) and must match the name the probe at this hop announces.
name = "publish"
# Wire id (0..=255) that the probe at this hop puts in its records; unique per pipeline.
# Leave it out to use the hop's position in this list (0 for the first hop).
id = 0
# What the hop is, in one line, for people reading the spec and the report.
description = "Publisher egress: the publisher hands the message to its MQTT or Kafka client."

[[hops]]
name = "flow_in"
id = 1
description = "Processor ingress: the stream processor receives the message from the broker."

[[hops]]
name = "flow_out"
id = 2
description = "Processor egress: the processor sends the processed data towards the store."

[[hops]]
name = "store_in"
id = 3
description = "Store ingress: the store receives the data from the processor."

[[hops]]
name = "query_start"
id = 4
description = "The visibility query that first found the data started."

[[hops]]
name = "queryable"
id = 5
description = "That query returned the data: from here on it is queryable."
# A hop stamped by polling (a store tap: `hoptrace tap --from influxdb://...`) knows only
# that its event happened between two instants: declare a hop for the earliest one and
# name it here. The tap reports it for every message, and every stage that starts or ends
# at this hop is reported with bounds. The reference store stamps this hop itself, so
# here it is exact.
# earliest = "queryable_earliest"

# The stages the report measures, in report order.
[[stages]]
# Stage name, as the report prints it; unique per pipeline.
name = "Broker Time"
# The hop whose stamp the stage starts at.
from = "publish"
# The hop whose stamp the stage ends at (the stage is `to - from`).
to = "flow_in"
# One-line definition printed under "Latency Stage Definitions" in the report.
definition = "Time from message publish, through the broker, to arrival in the processor."
# Whether the stage appears in the report's highlights table at the top.
headline = false

[[stages]]
name = "Flow Internal"
from = "flow_in"
to = "flow_out"
definition = "Processing time inside the stream processor, from ingress to egress."

[[stages]]
name = "Transmission"
from = "flow_out"
to = "store_in"
definition = "Time for the network call carrying the data from the processor to the store."

[[stages]]
name = "Total Ingestion"
from = "publish"
to = "queryable"
definition = "Total time from message publish to the data becoming queryable in the store."
headline = true

[[stages]]
name = "Query Duration"
from = "query_start"
to = "queryable"
definition = "Time the store took to execute the visibility query that first returned the data."
headline = true

# How the collector joins the records of one message.
[join]
# How long to wait for the rest of a message's stamps, counted from the arrival of its
# first record at the collector (the collector's monotonic clock). A message still missing
# expected hops after this long is written out as incomplete.
window_ms = 10000
# Most messages waiting for stamps at once. When reached, the collector stops reading
# from probes until messages complete or expire (back-pressure, nothing is dropped).
max_pending = 2000000
# Stamps more than this many seconds before the collector started or after the current
# time are implausible (a broken clock, a corrupt record): they are counted and dropped,
# and a message whose intended send time is that far off is flagged and kept out of the
# run's span and throughput.
plausible_window_s = 3600

# How the collector writes Parquet. A Parquet file is readable only once closed (its
# footer is written last), so a crash loses the open file: by default every file holds
# one row group, and a killed collector loses at most that one.
[output]
# Start a new Parquet file after this many rows.
roll_rows = 1000000
# Start a new Parquet file after this many seconds, even if it has fewer rows.
roll_seconds = 60
# Rows per Parquet row group.
row_group_rows = 1000000
# zstd compression level, 1 (fastest) to 22 (smallest files).
zstd_level = 1
"#;

/// A commented pipeline spec whose hops past the publisher are stamped by OpenTelemetry
/// spans a collector receives over OTLP (`hoptrace collect --otlp`): `hoptrace publish
/// --traceparent` → Kafka → MirrorMaker 2 under the OpenTelemetry Java agent → Kafka → a
/// consumer under OpenTelemetry instrumentation. `hoptrace generate-config --otel` prints it.
pub const OTEL_PIPELINE_TOML: &str = r#"# hoptrace pipeline spec whose hops are stamped by OpenTelemetry spans.
#
# The publisher (`hoptrace publish --traceparent`) gives every message a W3C trace id that
# names it and sends it as a `traceparent` header. OpenTelemetry instrumentation further
# on (the Java agent, the Python or Node instrumentations) continues that trace, and its
# spans, exported over OTLP/HTTP to `hoptrace collect --otlp HOST:PORT`, stamp the hops
# below: a span stamps a message when its trace id, or the trace id of one of its links
# (a batch), is one the publisher gave. Spans that match no hop are counted and ignored.
#
# OTLP carries no clock quality: a host's clock is unknown to hoptrace unless a hoptrace
# probe or `hoptrace clock` reports for it.

name = "kafka-mirrormaker2-otel"

[[hops]]
name = "publish"
id = 0
description = "Publisher egress: hoptrace publish --traceparent hands the message to its Kafka client."

[[hops]]
name = "mirror_in"
id = 1
description = "MirrorMaker 2 takes the record from the source cluster (the agent's consumer process span starts)."
# Which spans stamp this hop. Every criterion given must hold:
#   service     the resource's service.name (OTEL_SERVICE_NAME);
#   kind        internal, server, client, producer or consumer;
#   name        the span name, `*` standing for any run of characters;
#   attributes  span attributes that must have these values (as text);
#   stamp       "start" (default) or "end": which of the span's times is the stamp.
span = { service = "mirrormaker2", kind = "consumer", name = "* process", attributes = { "messaging.destination.name" = "orders" } }

[[hops]]
name = "mirror_out"
id = 2
description = "MirrorMaker 2 sends the record to the target cluster (the agent's producer publish span starts)."
span = { service = "mirrormaker2", kind = "producer", name = "* publish" }

[[hops]]
name = "consume"
id = 3
description = "The consumer on the target cluster starts processing the record."
span = { service = "orders-consumer", kind = "consumer", stamp = "start" }

[[hops]]
name = "consumed"
id = 4
description = "The consumer finished processing the record (the same span's end)."
span = { service = "orders-consumer", kind = "consumer", stamp = "end" }

[[stages]]
name = "Source Broker Time"
from = "publish"
to = "mirror_in"
definition = "From publish, through the source cluster, to MirrorMaker 2's consumer."
headline = false

[[stages]]
name = "Mirror Internal"
from = "mirror_in"
to = "mirror_out"
definition = "Inside MirrorMaker 2, from taking the record to sending it on."
headline = false

[[stages]]
name = "Target Broker Time"
from = "mirror_out"
to = "consume"
definition = "From MirrorMaker 2's send, through the target cluster, to the consumer."
headline = false

[[stages]]
name = "Processing"
from = "consume"
to = "consumed"
definition = "The consumer's processing of the record."
headline = false

[[stages]]
name = "End to End"
from = "publish"
to = "consumed"
definition = "From publish to the end of the consumer's processing."
headline = true
"#;
