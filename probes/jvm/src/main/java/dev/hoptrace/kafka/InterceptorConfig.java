package dev.hoptrace.kafka;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.TreeSet;
import org.apache.kafka.common.config.AbstractConfig;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.common.config.ConfigDef.Importance;
import org.apache.kafka.common.config.ConfigDef.Range;
import org.apache.kafka.common.config.ConfigDef.Type;
import org.apache.kafka.common.config.ConfigException;
import org.apache.kafka.common.config.types.Password;

/**
 * The {@code hoptrace.*} client properties the interceptors read (Kafka hands every client
 * property to an interceptor's {@code configure}), defined in Kafka's own {@link ConfigDef}
 * ({@link #CONFIG}): each with its type, default, validator, importance and documentation.
 *
 * <p>Only the {@code hoptrace.*} properties are parsed; the client's own are left to it. A
 * missing or invalid setting, and a {@code hoptrace.*} key that is not defined here (a typo),
 * throw Kafka's {@link ConfigException} naming the key, so a client that asked for
 * measurement fails to start instead of running unmeasured. A blank value counts as unset.
 * The README's table of settings is generated from {@link #CONFIG} ({@link #markdownTable()}).
 */
public final class InterceptorConfig extends AbstractConfig {
    /** The prefix of every setting. */
    public static final String PREFIX = "hoptrace.";
    /** Collector address. */
    public static final String COLLECTOR = "hoptrace.collector";
    /** The hop name. */
    public static final String HOP = "hoptrace.hop";
    /** The hop id. */
    public static final String HOP_ID = "hoptrace.hop.id";
    /** Hop name to id mapping. */
    public static final String HOPS = "hoptrace.hops";
    /** Collector token. */
    public static final String TOKEN = "hoptrace.token";
    /** CA bundle for TLS. */
    public static final String TLS_CA = "hoptrace.tls.ca";
    /** Certificate name to expect. */
    public static final String TLS_NAME = "hoptrace.tls.name";
    /** Process name. */
    public static final String PROCESS = "hoptrace.process";
    /** LogAppendTime hop name. */
    public static final String LAT_HOP = "hoptrace.log.append.time.hop";
    /** LogAppendTime hop id. */
    public static final String LAT_HOP_ID = "hoptrace.log.append.time.hop.id";
    /** In-band stamping. */
    public static final String IN_BAND = "hoptrace.in.band";
    /** Queue capacity, records. */
    public static final String QUEUE_CAPACITY = "hoptrace.queue.capacity";
    /** Bytes of records frames kept until the collector acknowledges them (version 2). */
    public static final String RETENTION_BYTES = "hoptrace.retention.bytes";
    /** Most records per Records frame. */
    public static final String BATCH_RECORDS = "hoptrace.batch.records";
    /** Total time of a connection attempt. */
    public static final String CONNECT_TIMEOUT_MS = "hoptrace.connect.timeout.ms";
    /** Longest blocked write. */
    public static final String WRITE_TIMEOUT_MS = "hoptrace.write.timeout.ms";
    /** Close timeout. */
    public static final String CLOSE_TIMEOUT_MS = "hoptrace.close.timeout.ms";
    /** First reconnection delay. */
    public static final String BACKOFF_MIN_MS = "hoptrace.backoff.min.ms";
    /** Longest reconnection delay. */
    public static final String BACKOFF_MAX_MS = "hoptrace.backoff.max.ms";
    /** Counters frame period. */
    public static final String COUNTERS_INTERVAL_MS = "hoptrace.counters.interval.ms";
    /** Clock frame period. */
    public static final String CLOCK_INTERVAL_MS = "hoptrace.clock.interval.ms";

    private static final String HOP_NAME = "[a-z0-9_]+";

    /** Every setting, in the order the README lists them. */
    public static final ConfigDef CONFIG = new ConfigDef()
            .define(COLLECTOR, Type.STRING, ConfigDef.NO_DEFAULT_VALUE, new HostPort(), Importance.HIGH,
                    "The collector, host:port (`hoptrace collect --listen`). Required.")
            .define(HOP, Type.STRING, ConfigDef.NO_DEFAULT_VALUE, new HopName(), Importance.HIGH,
                    "The hop this client stamps, as named in the pipeline spec. Required.")
            .define(HOP_ID, Type.INT, null, optional(Range.between(0, 255)), Importance.HIGH,
                    "The hop's wire id from the pipeline spec; or map it in `" + HOPS + "`.")
            .define(HOPS, Type.STRING, null, new HopMap(), Importance.MEDIUM,
                    "The spec's hop ids as name:id pairs, e.g. `publish:0,source_append:1,mm2_consume:2`; "
                    + "the ids of `" + HOP + "` and `" + LAT_HOP + "` are looked up there.")
            .define(TOKEN, Type.PASSWORD, null, Importance.MEDIUM,
                    "The collector's token (`hoptrace collect --token`). Unset: `$HOPTRACE_TOKEN`, else none.")
            .define(TLS_CA, Type.STRING, null, new ReadableFile(), Importance.MEDIUM,
                    "A PEM file of CA certificates: speak TLS 1.2/1.3 to the collector (`hoptrace collect "
                    + "--tls-cert/--tls-key`; `infra/tls/make-certs.sh` makes both) and verify its certificate "
                    + "against these.")
            .define(TLS_NAME, Type.STRING, null, Importance.LOW,
                    "The name the collector's certificate must carry. Unset: the host of `" + COLLECTOR + "`.")
            .define(PROCESS, Type.STRING, null, Importance.LOW,
                    "The process name the collector records. Unset: the JVM's main class.")
            .define(LAT_HOP, Type.STRING, null, new HopName(), Importance.MEDIUM,
                    "Consumer only: for records of topics with `message.timestamp.type=LogAppendTime`, also "
                    + "report the broker's append time as this hop.")
            .define(LAT_HOP_ID, Type.INT, null, optional(Range.between(0, 255)), Importance.MEDIUM,
                    "The id of `" + LAT_HOP + "`, unless `" + HOPS + "` maps it.")
            .define(IN_BAND, Type.BOOLEAN, true, Importance.MEDIUM,
                    "Also append the stamp to the record's `hoptrace` header (false: report only).")
            .define(QUEUE_CAPACITY, Type.INT, 1 << 16, Range.between(2, 1 << 26), Importance.MEDIUM,
                    "Records waiting for the exporter thread (rounded up to a power of two; 72 bytes each, "
                    + "allocated at start). Beyond it a record is dropped and counted as `queue_full`.")
            .define(RETENTION_BYTES, Type.LONG, null, optional(Range.between(0, 1L << 40)), Importance.MEDIUM,
                    "Bytes of records frames kept until the collector acknowledges them as durable (protocol "
                    + "version 2), sent again after a collector restart, and filled while the collector is "
                    + "away. When full the oldest are dropped and counted as `evicted` (`lost_unacked` "
                    + "for those the collector never stored). Unset: 64 MiB, at most an eighth of the JVM's "
                    + "maximum heap. 0: protocol version 1, nothing kept once written.")
            .define(BATCH_RECORDS, Type.INT, 8192, Range.between(1, Protocol.MAX_RECORDS_PER_FRAME),
                    Importance.LOW,
                    "Most records per Records frame. The exporter's write buffer holds one such frame "
                    + "(52 bytes a record at most) and one Clock and one Counters frame: at most "
                    + "batch × 52 bytes + 2 KiB.")
            .define(CONNECT_TIMEOUT_MS, Type.LONG, 2000L, Range.between(1, 600_000), Importance.LOW,
                    "A whole connection attempt, in total: name resolution, TCP connect, TLS handshake, "
                    + "Hello and Welcome, however slowly the collector answers.")
            .define(WRITE_TIMEOUT_MS, Type.LONG, 10_000L, Range.between(1, 3_600_000), Importance.LOW,
                    "A write the collector does not take within this long drops the connection (its "
                    + "records are counted as `send_failed`).")
            .define(CLOSE_TIMEOUT_MS, Type.LONG, 5000L, Range.between(0, 3_600_000), Importance.MEDIUM,
                    "How long closing the last client waits to deliver what is queued; what is left then "
                    + "is `send_failed`. close() returns within this + 0.5 s, a blocked write included.")
            .define(BACKOFF_MIN_MS, Type.LONG, 50L, Range.between(1, 3_600_000), Importance.LOW,
                    "First delay before connecting again after a failure; doubles up to `" + BACKOFF_MAX_MS
                    + "`.")
            .define(BACKOFF_MAX_MS, Type.LONG, 5000L, Range.between(1, 3_600_000), Importance.LOW,
                    "Longest delay between connection attempts.")
            .define(COUNTERS_INTERVAL_MS, Type.LONG, 1000L, Range.between(10, 3_600_000), Importance.LOW,
                    "Period of the Counters frame.")
            .define(CLOCK_INTERVAL_MS, Type.LONG, 5000L, Range.between(10, 3_600_000), Importance.LOW,
                    "Period of the Clock frame (the host's clock status).");

    /** The exporter settings. */
    public final ExporterConfig exporter;
    /** The hop's name. */
    public final String hop;
    /** The hop's id. */
    public final int hopId;
    /** The LogAppendTime hop's name, or null. */
    public final String latHop;
    /** Its id, or -1. */
    public final int latHopId;
    /** Whether stamps are appended to the header. */
    public final boolean inBand;
    /** The client's client.id, for log lines. */
    public final String clientId;

    private InterceptorConfig(Map<String, ?> p, boolean consumer) {
        super(CONFIG, ours(p), false);
        Map<String, Integer> hops = parseHops(getString(HOPS));
        hop = getString(HOP);
        hopId = hopId(hop, getInt(HOP_ID), HOP_ID, hops);
        String lat = getString(LAT_HOP);
        if (lat != null && !consumer) {
            throw new ConfigException(LAT_HOP, lat, "only a consumer sees LogAppendTime; remove it from the producer");
        }
        latHop = lat;
        latHopId = lat == null ? -1 : hopId(latHop, getInt(LAT_HOP_ID), LAT_HOP_ID, hops);
        if (latHop != null && latHop.equals(hop)) {
            throw new ConfigException(LAT_HOP, lat, "must name another hop than " + HOP);
        }
        inBand = getBoolean(IN_BAND);
        Password tokenValue = getPassword(TOKEN);
        String token = tokenValue == null ? System.getenv("HOPTRACE_TOKEN") : tokenValue.value();
        String ca = getString(TLS_CA);
        String process = getString(PROCESS);
        exporter = new ExporterConfig(getString(COLLECTOR), token, ca == null ? null : Path.of(ca), getString(TLS_NAME),
                process != null ? process : defaultProcess());
        exporter.queueCapacity = getInt(QUEUE_CAPACITY);
        Long retention = getLong(RETENTION_BYTES);
        if (retention != null) {
            exporter.retentionBytes = retention;
        }
        exporter.maxBatch = getInt(BATCH_RECORDS);
        exporter.connectTimeoutMs = getLong(CONNECT_TIMEOUT_MS);
        exporter.writeTimeoutMs = getLong(WRITE_TIMEOUT_MS);
        exporter.closeTimeoutMs = getLong(CLOSE_TIMEOUT_MS);
        exporter.backoffMinMs = getLong(BACKOFF_MIN_MS);
        exporter.backoffMaxMs = getLong(BACKOFF_MAX_MS);
        if (exporter.backoffMaxMs < exporter.backoffMinMs) {
            throw new ConfigException(BACKOFF_MAX_MS, exporter.backoffMaxMs, "must be at least " + BACKOFF_MIN_MS
                    + " (" + exporter.backoffMinMs + ")");
        }
        exporter.countersIntervalMs = getLong(COUNTERS_INTERVAL_MS);
        exporter.clockIntervalMs = getLong(CLOCK_INTERVAL_MS);
        Object cid = p.get("client.id");
        clientId = cid == null ? "" : cid.toString();
    }

    /** Reads a consumer's settings. */
    public static InterceptorConfig consumer(Map<String, ?> p) {
        return new InterceptorConfig(p, true);
    }

    /** Reads a producer's settings. */
    public static InterceptorConfig producer(Map<String, ?> p) {
        return new InterceptorConfig(p, false);
    }

    /**
     * The {@code hoptrace.*} entries of a client's properties, blank ones left out; an
     * undefined {@code hoptrace.*} key is refused.
     */
    private static Map<String, Object> ours(Map<String, ?> p) {
        Map<String, Object> out = new HashMap<>();
        for (Map.Entry<String, ?> e : p.entrySet()) {
            String k = e.getKey();
            if (k == null || !k.startsWith(PREFIX)) {
                continue;
            }
            if (!CONFIG.configKeys().containsKey(k)) {
                throw new ConfigException(k, e.getValue(), "not a hoptrace interceptor setting; they are "
                        + new TreeSet<>(CONFIG.names()));
            }
            Object v = e.getValue();
            if (v == null || v instanceof String s && s.isBlank()) {
                continue;
            }
            out.put(k, v);
        }
        return out;
    }

    private static int hopId(String hop, Integer id, String key, Map<String, Integer> hops) {
        Integer mapped = hops.get(hop);
        if (id != null) {
            if (mapped != null && !mapped.equals(id)) {
                throw new ConfigException(key, id, "hop " + hop + " is mapped to " + mapped + " by " + HOPS);
            }
            return id;
        }
        if (mapped == null) {
            throw new ConfigException(key, null, "hop " + hop + " needs an id: set " + key + " or map it in " + HOPS);
        }
        return mapped;
    }

    /** {@code name:id} (or {@code name=id}) pairs separated by commas; an empty map for null. */
    static Map<String, Integer> parseHops(String text) {
        Map<String, Integer> m = new LinkedHashMap<>();
        if (text == null) {
            return m;
        }
        for (String part : text.split(",")) {
            String t = part.trim();
            if (t.isEmpty()) {
                continue;
            }
            int sep = Math.max(t.indexOf(':'), t.indexOf('='));
            if (sep <= 0) {
                throw new ConfigException(HOPS, text, "expected name:id pairs separated by commas");
            }
            String name = t.substring(0, sep).trim();
            if (!name.matches(HOP_NAME)) {
                throw new ConfigException(HOPS, text, "hop name " + name + " is not lower-case letters, digits and _");
            }
            int id;
            try {
                id = Integer.parseInt(t.substring(sep + 1).trim());
            } catch (NumberFormatException e) {
                id = -1;
            }
            if (id < 0 || id > 255) {
                throw new ConfigException(HOPS, text, "the id of hop " + name + " is not 0 to 255");
            }
            if (m.containsKey(name) || m.containsValue(id)) {
                throw new ConfigException(HOPS, text, "hop " + name + " or id " + id + " appears twice");
            }
            m.put(name, id);
        }
        return m;
    }

    /** The JVM's main class (simple name), from {@code sun.java.command}, else "jvm". */
    static String defaultProcess() {
        String cmd = System.getProperty("sun.java.command", "").trim();
        if (cmd.isEmpty()) {
            return "jvm";
        }
        String main = cmd.split("\\s+")[0];
        if (main.endsWith(".jar")) {
            return Path.of(main).getFileName().toString();
        }
        return main.substring(main.lastIndexOf('.') + 1);
    }

    // ------------------------------------------------------------------------------------
    // The README's table

    /**
     * The settings as a Markdown table (setting, type, default, valid values, importance,
     * meaning), in {@link #CONFIG}'s order: the table of {@code probes/jvm/README.md}.
     */
    public static String markdownTable() {
        StringBuilder sb = new StringBuilder();
        sb.append("| setting | type | default | valid values | importance | meaning |\n");
        sb.append("| --- | --- | --- | --- | --- | --- |\n");
        for (ConfigDef.ConfigKey k : CONFIG.configKeys().values()) {
            String dflt;
            if (!k.hasDefault()) {
                dflt = "required";
            } else if (k.defaultValue == null) {
                dflt = "unset";
            } else {
                dflt = "`" + k.defaultValue + "`";
            }
            String valid = k.validator == null ? "" : "`" + k.validator + "`";
            sb.append("| `").append(k.name).append("` | ").append(k.type.name().toLowerCase(java.util.Locale.ROOT))
                    .append(" | ").append(dflt).append(" | ").append(valid.replace("|", "\\|")).append(" | ")
                    .append(k.importance.name().toLowerCase(java.util.Locale.ROOT)).append(" | ")
                    .append(k.documentation.replace("|", "\\|")).append(" |\n");
        }
        return sb.toString();
    }

    // ------------------------------------------------------------------------------------
    // Validators

    /** {@code v}, or nothing (an optional setting). */
    static ConfigDef.Validator optional(ConfigDef.Validator v) {
        return new ConfigDef.Validator() {
            @Override
            public void ensureValid(String name, Object value) {
                if (value != null) {
                    v.ensureValid(name, value);
                }
            }

            @Override
            public String toString() {
                return v.toString();
            }
        };
    }

    /** host:port, the port 1 to 65535 (an IPv6 host in brackets). */
    static final class HostPort implements ConfigDef.Validator {
        @Override
        public void ensureValid(String name, Object value) {
            try {
                ExporterConfig.splitHostPort((String) value);
            } catch (IllegalArgumentException e) {
                throw new ConfigException(name, value, e.getMessage());
            }
        }

        @Override
        public String toString() {
            return "host:port";
        }
    }

    /** A hop name. */
    static final class HopName implements ConfigDef.Validator {
        @Override
        public void ensureValid(String name, Object value) {
            if (value != null && !((String) value).matches(HOP_NAME)) {
                throw new ConfigException(name, value, "a hop name is lower-case letters, digits and _");
            }
        }

        @Override
        public String toString() {
            return HOP_NAME;
        }
    }

    /** name:id pairs. */
    static final class HopMap implements ConfigDef.Validator {
        @Override
        public void ensureValid(String name, Object value) {
            parseHops((String) value);
        }

        @Override
        public String toString() {
            return "name:id,...";
        }
    }

    /** A readable file. */
    static final class ReadableFile implements ConfigDef.Validator {
        @Override
        public void ensureValid(String name, Object value) {
            if (value != null && !Files.isReadable(Path.of((String) value))) {
                throw new ConfigException(name, value, "not a readable file");
            }
        }

        @Override
        public String toString() {
            return "a readable file";
        }
    }
}
