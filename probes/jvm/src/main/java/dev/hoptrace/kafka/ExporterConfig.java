package dev.hoptrace.kafka;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Objects;

/**
 * How an {@link Exporter} reaches the collector and paces itself. Interceptors build it from
 * the {@code hoptrace.*} client properties ({@link InterceptorConfig}); the fields that name
 * the collector connection ({@link #key()}) decide which exporter of the JVM is shared.
 */
public final class ExporterConfig {
    /** Collector address, {@code host:port}. */
    public final String collector;
    /** Token the collector requires, empty for none. */
    public final String token;
    /** PEM file of the CA certificates to trust; null for plain TCP. */
    public final Path tlsCa;
    /** The name the collector's certificate must carry; null: the host of {@link #collector}. */
    public final String tlsName;
    /** Process or component name sent in Hello. */
    public final String process;
    /** Host name sent in Hello. */
    public final String host;
    /** Records the queue holds before reports are dropped (and counted). */
    public int queueCapacity = 1 << 16;
    /**
     * Bytes of records frames kept until the collector acknowledges them (protocol version 2);
     * 0 speaks version 1 and keeps nothing. Default {@link #defaultRetentionBytes()}.
     */
    public long retentionBytes = defaultRetentionBytes();
    /** Most records per Records frame. */
    public int maxBatch = 8192;
    /** Sleep of the exporter thread when the queue is empty, ms. */
    public long idleWaitMs = 5;
    /** Clock frame period, ms. */
    public long clockIntervalMs = 5000;
    /** Counters frame period, ms. */
    public long countersIntervalMs = 1000;
    /**
     * A whole connection attempt, ms: name resolution, TCP connect, TLS handshake, Hello and
     * Welcome, in total.
     */
    public long connectTimeoutMs = 2000;
    /** A write blocked longer than this (collector stalled) drops the connection, ms. */
    public long writeTimeoutMs = 10_000;
    /** First retry delay after a failed connection, ms; doubles up to {@link #backoffMaxMs}. */
    public long backoffMinMs = 50;
    /** Longest retry delay, ms. */
    public long backoffMaxMs = 5000;
    /** How long closing the last interceptor waits to deliver what is queued, ms. */
    public long closeTimeoutMs = 5000;
    /**
     * The first connection waits until no new hop was registered for this long, ms, so that
     * the interceptors a JVM creates together are announced in one Hello.
     */
    public long settleMs = 300;
    /** The clock status source (default: chronyc, else unknown). */
    public ClockStatusSource clockStatus;

    /**
     * A configuration for the collector at {@code collector}.
     *
     * @param collector {@code host:port}
     * @param token token, or null
     * @param tlsCa CA PEM file for TLS, or null
     * @param tlsName certificate name to expect, or null
     * @param process process name for Hello
     */
    public ExporterConfig(String collector, String token, Path tlsCa, String tlsName, String process) {
        this.collector = Objects.requireNonNull(collector, "collector");
        this.token = token == null ? "" : token;
        this.tlsCa = tlsCa;
        this.tlsName = tlsName;
        this.process = process;
        this.host = hostName();
    }

    /**
     * The default retention: 64 MiB, as the other hoptrace probes keep, but at most an eighth
     * of the JVM's maximum heap, so that a client with a small heap is not crowded.
     */
    public static long defaultRetentionBytes() {
        long max = Runtime.getRuntime().maxMemory();
        long cap = max == Long.MAX_VALUE ? Long.MAX_VALUE : max / 8;
        return Math.min(64L << 20, cap);
    }

    /**
     * The settings that do not name the connection (bounds, timeouts, periods), for the
     * warning when clients sharing one exporter ask for different ones.
     */
    String tuning() {
        return "queue.capacity=" + queueCapacity + " retention.bytes=" + retentionBytes + " batch.records="
                + maxBatch + " connect.timeout.ms=" + connectTimeoutMs + " write.timeout.ms=" + writeTimeoutMs + " close.timeout.ms=" + closeTimeoutMs
                + " backoff.min.ms=" + backoffMinMs + " backoff.max.ms=" + backoffMaxMs
                + " counters.interval.ms=" + countersIntervalMs + " clock.interval.ms=" + clockIntervalMs;
    }

    /** What identifies the collector connection: exporters with equal keys are one. */
    public String key() {
        return String.join("\u0000", collector, token, String.valueOf(tlsCa), String.valueOf(tlsName),
                process);
    }

    /** This host's name, from the kernel, else $HOSTNAME, else "unknown". */
    static String hostName() {
        try {
            String h = Files.readString(Path.of("/proc/sys/kernel/hostname")).trim();
            if (!h.isEmpty()) {
                return h;
            }
        } catch (Exception e) {
            // not Linux: fall through
        }
        String env = System.getenv("HOSTNAME");
        return env != null && !env.isBlank() ? env.trim() : "unknown";
    }

    /** The host part of {@code host:port} (IPv6 in brackets allowed). */
    String collectorHost() {
        return splitHostPort(collector)[0];
    }

    /** The port of {@code host:port}. */
    int collectorPort() {
        return Integer.parseInt(splitHostPort(collector)[1]);
    }

    static String[] splitHostPort(String addr) {
        int colon = addr.lastIndexOf(':');
        if (colon <= 0 || colon == addr.length() - 1) {
            throw new IllegalArgumentException("collector address " + addr + " is not host:port");
        }
        String host = addr.substring(0, colon);
        if (host.startsWith("[") && host.endsWith("]")) {
            host = host.substring(1, host.length() - 1);
        }
        String port = addr.substring(colon + 1);
        int p;
        try {
            p = Integer.parseInt(port);
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("collector address " + addr + " has no numeric port");
        }
        if (p < 1 || p > 65535) {
            throw new IllegalArgumentException("collector port " + p + " out of range");
        }
        return new String[] {host, port};
    }
}
