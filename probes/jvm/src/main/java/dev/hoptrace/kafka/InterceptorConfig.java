package dev.hoptrace.kafka;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.kafka.common.config.ConfigException;

/**
 * The {@code hoptrace.*} client properties the interceptors read (Kafka hands every client
 * property to an interceptor's {@code configure}). Missing or invalid required settings throw
 * {@link ConfigException}, so a client that asked for measurement fails to start instead of
 * running unmeasured.
 *
 * <table>
 * <caption>Properties</caption>
 * <tr><td>{@code hoptrace.collector}</td><td>collector address, host:port (required)</td></tr>
 * <tr><td>{@code hoptrace.hop}</td><td>the hop this client stamps (required)</td></tr>
 * <tr><td>{@code hoptrace.hop.id}</td><td>its wire id 0..255, unless {@code hoptrace.hops} maps it</td></tr>
 * <tr><td>{@code hoptrace.hops}</td><td>hop name to id mapping: {@code publish:0,broker:1,...}</td></tr>
 * <tr><td>{@code hoptrace.token}</td><td>collector token (default: $HOPTRACE_TOKEN, else none)</td></tr>
 * <tr><td>{@code hoptrace.tls.ca}</td><td>CA PEM file: speak TLS to the collector</td></tr>
 * <tr><td>{@code hoptrace.tls.name}</td><td>name the collector's certificate carries (default: its host)</td></tr>
 * <tr><td>{@code hoptrace.process}</td><td>process name in Hello (default: the JVM's main class)</td></tr>
 * <tr><td>{@code hoptrace.log.append.time.hop}</td><td>consumer: also report LogAppendTime as this hop</td></tr>
 * <tr><td>{@code hoptrace.log.append.time.hop.id}</td><td>its id, unless {@code hoptrace.hops} maps it</td></tr>
 * <tr><td>{@code hoptrace.in.band}</td><td>append the stamp to the record's header too (default true)</td></tr>
 * <tr><td>{@code hoptrace.queue.capacity}</td><td>records queued before drops (default 65536)</td></tr>
 * <tr><td>{@code hoptrace.close.timeout.ms}</td><td>flush time when the last client closes (default 5000)</td></tr>
 * </table>
 */
public final class InterceptorConfig {
    /** Property names. */
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
    /** Queue capacity. */
    public static final String QUEUE_CAPACITY = "hoptrace.queue.capacity";
    /** Close timeout. */
    public static final String CLOSE_TIMEOUT_MS = "hoptrace.close.timeout.ms";

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
        String collector = required(p, COLLECTOR);
        try {
            ExporterConfig.splitHostPort(collector);
        } catch (IllegalArgumentException e) {
            throw new ConfigException(COLLECTOR, collector, e.getMessage());
        }
        Map<String, Integer> hops = parseHops(get(p, HOPS));
        hop = hopName(required(p, HOP), HOP);
        hopId = hopId(hop, get(p, HOP_ID), HOP_ID, hops);
        String lat = get(p, LAT_HOP);
        if (lat != null && !consumer) {
            throw new ConfigException(LAT_HOP, lat, "only a consumer sees LogAppendTime; remove it from the producer");
        }
        latHop = lat == null ? null : hopName(lat, LAT_HOP);
        latHopId = lat == null ? -1 : hopId(latHop, get(p, LAT_HOP_ID), LAT_HOP_ID, hops);
        if (latHop != null && latHop.equals(hop)) {
            throw new ConfigException(LAT_HOP, lat, "must name another hop than " + HOP);
        }
        String inBandText = get(p, IN_BAND);
        if (inBandText != null && !inBandText.equalsIgnoreCase("true") && !inBandText.equalsIgnoreCase("false")) {
            throw new ConfigException(IN_BAND, inBandText, "true or false");
        }
        inBand = inBandText == null || Boolean.parseBoolean(inBandText);
        String token = get(p, TOKEN);
        if (token == null) {
            token = System.getenv("HOPTRACE_TOKEN");
        }
        String ca = get(p, TLS_CA);
        Path caPath = null;
        if (ca != null) {
            caPath = Path.of(ca);
            if (!Files.isReadable(caPath)) {
                throw new ConfigException(TLS_CA, ca, "not a readable file");
            }
        }
        String process = get(p, PROCESS);
        exporter = new ExporterConfig(collector, token, caPath, get(p, TLS_NAME),
                process != null ? process : defaultProcess());
        exporter.queueCapacity = (int) number(p, QUEUE_CAPACITY, exporter.queueCapacity, 2, 1 << 26);
        exporter.closeTimeoutMs = number(p, CLOSE_TIMEOUT_MS, exporter.closeTimeoutMs, 0, 3_600_000);
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

    private static String get(Map<String, ?> p, String key) {
        Object v = p.get(key);
        if (v == null) {
            return null;
        }
        String s = v.toString().trim();
        return s.isEmpty() ? null : s;
    }

    private static String required(Map<String, ?> p, String key) {
        String v = get(p, key);
        if (v == null) {
            throw new ConfigException(key, null, "required by the hoptrace interceptors");
        }
        return v;
    }

    private static String hopName(String name, String key) {
        if (!name.matches("[a-z0-9_]+")) {
            throw new ConfigException(key, name, "a hop name is lower-case letters, digits and _");
        }
        return name;
    }

    private static int hopId(String hop, String idText, String key, Map<String, Integer> hops) {
        Integer mapped = hops.get(hop);
        if (idText != null) {
            int id = parseId(idText, key);
            if (mapped != null && mapped != id) {
                throw new ConfigException(key, idText, "hop " + hop + " is mapped to " + mapped + " by " + HOPS);
            }
            return id;
        }
        if (mapped == null) {
            throw new ConfigException(key, null, "hop " + hop + " needs an id: set " + key + " or map it in " + HOPS);
        }
        return mapped;
    }

    private static int parseId(String s, String key) {
        try {
            int id = Integer.parseInt(s);
            if (id >= 0 && id <= 255) {
                return id;
            }
        } catch (NumberFormatException e) {
            // below
        }
        throw new ConfigException(key, s, "a hop id is 0 to 255");
    }

    /** {@code name:id} (or {@code name=id}) pairs separated by commas. */
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
            String name = hopName(t.substring(0, sep).trim(), HOPS);
            int id = parseId(t.substring(sep + 1).trim(), HOPS);
            if (m.containsKey(name) || m.containsValue(id)) {
                throw new ConfigException(HOPS, text, "hop " + name + " or id " + id + " appears twice");
            }
            m.put(name, id);
        }
        return m;
    }

    private static long number(Map<String, ?> p, String key, long dflt, long min, long max) {
        String s = get(p, key);
        if (s == null) {
            return dflt;
        }
        try {
            long v = Long.parseLong(s);
            if (v >= min && v <= max) {
                return v;
            }
        } catch (NumberFormatException e) {
            // below
        }
        throw new ConfigException(key, s, "an integer from " + min + " to " + max);
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
}
