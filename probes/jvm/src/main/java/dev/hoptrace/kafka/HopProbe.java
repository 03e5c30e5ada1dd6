package dev.hoptrace.kafka;

import org.apache.kafka.common.config.ConfigException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * What both interceptors do with a record's headers: take the trace context (the last
 * {@code hoptrace} header, with the trace id of a valid {@code traceparent} when it has none),
 * count what is not traced or does not decode, stamp the hop and report it. On the client's
 * thread it allocates only the decoded context and its new header value, takes no lock, does
 * no I/O and never waits (the exporter logs what is worth logging).
 */
final class HopProbe implements AutoCloseable {
    private static final Logger LOG = LoggerFactory.getLogger(HopProbe.class);
    /** The header that carries the binary form. */
    static final String HEADER = "hoptrace";
    private static final byte[] EMPTY = new byte[0];

    final InterceptorConfig config;
    final Exporter exporter;
    final Counters counters;
    final int hop;
    private boolean closed;

    HopProbe(InterceptorConfig config, String role) {
        this.config = config;
        this.hop = config.hopId;
        Exporter e = Exporter.acquire(config.exporter);
        try {
            e.registerHop(config.hopId, config.hop);
            if (config.latHop != null) {
                e.registerHop(config.latHopId, config.latHop);
            }
        } catch (IllegalArgumentException ex) {
            e.release();
            throw new ConfigException(ex.getMessage());
        }
        this.exporter = e;
        this.counters = e.counterSet();
        LOG.info("hoptrace: {} {} stamps hop {} (id {}){} and reports to {}", role,
                config.clientId.isEmpty() ? "" : config.clientId, config.hop, config.hopId,
                config.latHop == null ? "" : ", LogAppendTime as hop " + config.latHop + " (id " + config.latHopId + ")",
                config.exporter.collector + (config.exporter.tlsCa != null ? " (TLS)" : ""));
    }

    /**
     * The context of a record's headers, or null (counted as {@code not_traced} or {@code
     * bad_context}).
     */
    TraceContext extract(Headers headers) {
        Header context = null;
        Header traceparent = null;
        for (Header h : headers) {
            String k = h.key();
            if (HEADER.equals(k)) {
                context = h;
            } else if (Traceparent.HEADER.equals(k)) {
                traceparent = h;
            }
        }
        if (context == null) {
            counters.notTraced.increment();
            return null;
        }
        TraceContext ctx;
        try {
            byte[] v = context.value();
            ctx = TraceContext.decode(v == null ? EMPTY : v);
        } catch (DecodeException e) {
            counters.badContext.increment();
            exporter.noteBadContext(e.error().wireName()); // logged by the exporter thread
            return null;
        }
        if (traceparent != null) {
            byte[] id = Traceparent.traceId(traceparent.value());
            if (id == null) {
                counters.badTraceparent.increment();
            } else if (ctx.otelTraceId == null) {
                ctx.otelTraceId = id;
            }
        }
        return ctx;
    }

    /**
     * Stamps {@code ctx} with this hop at {@code nowNs} (in-band) and reports the stamp.
     *
     * @return whether the stamp went into the context (false: it held 16, counted)
     */
    boolean stamp(TraceContext ctx, long nowNs) {
        boolean pushed = ctx.pushStamp(hop, nowNs);
        if (!pushed) {
            counters.stampsFull.increment();
        }
        exporter.report(ctx, hop, nowNs);
        return pushed;
    }

    /** Reports a stamp taken elsewhere (LogAppendTime) as the LogAppendTime hop. */
    void reportLogAppendTime(TraceContext ctx, long ms) {
        exporter.report(ctx, config.latHopId, ms * 1_000_000L);
    }

    @Override
    public synchronized void close() {
        if (!closed) {
            closed = true;
            exporter.release();
        }
    }
}
