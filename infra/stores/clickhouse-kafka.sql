-- Kafka -> ClickHouse 18.16 with no code: a Kafka engine table consumes the topic, a
-- materialized view moves every consumed block into a MergeTree table, where the rows become
-- queryable. Applied by `clickhouse.sh kafka-pipeline TOPIC [GROUP]`, which replaces
-- @TOPIC@, @GROUP@, @KAFKA@ (the bootstrap address), @MAX_BLOCK@ (kafka_max_block_size,
-- $HOPTRACE_CH_KAFKA_MAX_BLOCK) and @NAME@ (the topic name with every character other than a
-- letter, digit or underscore turned into "_").
--
-- Messages are JSON objects, one per Kafka record, e.g.
--     {"hoptrace": "<trace key, text form>", "value": 1.5}
-- Unknown fields are skipped (the Kafka engine always sets input_format_skip_unknown_fields);
-- a missing field gets its type's default ('' or 0).
--
-- Latency knobs: kafka_max_block_size here (rows per block; small = flush sooner) and
-- stream_flush_interval_ms in clickhouse-users.xml (500 ms instead of 7500 ms). ClickHouse
-- 18.16 has no sub-second DateTime type and no sub-second now(), so the store's own time of
-- insertion, "inserted", has one-second resolution.

CREATE TABLE IF NOT EXISTS hoptrace.@NAME@_queue
(
    hoptrace String,
    value Float64
)
ENGINE = Kafka
SETTINGS kafka_broker_list = '@KAFKA@',
         kafka_topic_list = '@TOPIC@',
         kafka_group_name = '@GROUP@',
         kafka_format = 'JSONEachRow',
         kafka_num_consumers = 1,
         kafka_max_block_size = @MAX_BLOCK@;

CREATE TABLE IF NOT EXISTS hoptrace.@NAME@
(
    hoptrace String,
    value Float64,
    inserted DateTime
)
ENGINE = MergeTree
PARTITION BY toDate(inserted)
ORDER BY (inserted, hoptrace);

CREATE MATERIALIZED VIEW IF NOT EXISTS hoptrace.@NAME@_mv TO hoptrace.@NAME@
AS SELECT hoptrace, value, now() AS inserted FROM hoptrace.@NAME@_queue;
