package dev.hoptrace.kafka;

import java.time.Clock;
import java.time.Instant;

/**
 * The stamp clock: CLOCK_REALTIME in nanoseconds since the Unix epoch, read through
 * {@code Clock.systemUTC().instant()}. On Linux, Java 15 and later read it with
 * {@code clock_gettime(CLOCK_REALTIME)} and keep the nanoseconds ({@code Instant.getNano()});
 * {@link #resolutionNs()} checks that at run time rather than assuming it.
 */
public final class Clocks {
    private Clocks() {}

    private static final Clock UTC = Clock.systemUTC();

    /** CLOCK_REALTIME now, ns since 1970-01-01T00:00:00Z (leap seconds not counted). */
    public static long realtimeNs() {
        Instant now = UTC.instant();
        return now.getEpochSecond() * 1_000_000_000L + now.getNano();
    }

    /**
     * The finest step seen in the nanosecond part of {@link #realtimeNs()} over some
     * readings: 1 when the JVM gives nanoseconds, 1000 for microseconds.
     */
    public static long resolutionNs() {
        long step = 1_000_000_000L;
        for (int i = 0; i < 2000 && step > 1; i++) {
            long ns = realtimeNs() % 1_000_000_000L;
            // The largest power of ten (up to the step so far) that divides this reading.
            long p = 1;
            while (p < step && ns % (p * 10) == 0) {
                p *= 10;
            }
            step = p;
        }
        return step;
    }
}
