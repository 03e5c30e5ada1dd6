package dev.hoptrace.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import org.junit.jupiter.api.Test;

/** chronyc -c tracking output captured from real chronyd (probe/testdata/clock/). */
class ChronyTest {
    static String capture(String name) throws IOException {
        return Files.readString(TestPaths.repo().resolve("probe/testdata/clock/" + name));
    }

    @Test
    void aSynchronisedClient() throws IOException {
        ClockStatusSource.Tracking t = ClockStatusSource.Tracking.parse(capture("chronyc-tracking-synced.csv"));
        assertEquals(0x7F000001L, t.refId());
        assertEquals(9, t.stratum());
        assertEquals(1_795_335_480_242_007_074L, t.refTimeNs());
        assertEquals(-2004, t.systemTimeNs());
        assertEquals(2004, t.offsetNs(), "chronyc says the clock is fast: ahead, positive");
        assertEquals(6488, t.rootDelayNs());
        assertEquals(1670, t.rootDispersionNs());
        assertTrue(t.synced());
        Protocol.ClockStatus s = t.toStatus(42);
        assertEquals(Protocol.ClockStatus.CHRONY, s.source());
        assertEquals(Protocol.ClockStatus.LEAP_NONE, s.leap());
        assertEquals(2004 + 1670 + 6488 / 2, s.errorBoundNs());
        assertTrue(s.detail().contains("ref=7F000001 (127.0.0.1) stratum=9"), s.detail());
    }

    @Test
    void aServerOfItsOwnClock() throws IOException {
        ClockStatusSource.Tracking t = ClockStatusSource.Tracking.parse(capture("chronyc-tracking-local-stratum8.csv"));
        assertTrue(t.synced());
        assertEquals(0, t.errorBoundNs());
        assertTrue(t.toStatus(0).detail().contains("(local clock)"));
    }

    @Test
    void anUnsynchronisedClient() throws IOException {
        ClockStatusSource.Tracking t = ClockStatusSource.Tracking.parse(capture("chronyc-tracking-unsynchronised.csv"));
        assertFalse(t.synced());
        assertEquals(1_500_000_000L, t.errorBoundNs());
        assertEquals(Protocol.ClockStatus.LEAP_UNSYNCHRONISED, t.toStatus(0).leap());
    }

    @Test
    void errorsNameTheField() throws IOException {
        String synced = capture("chronyc-tracking-synced.csv");
        assertThrows(IOException.class, () -> ClockStatusSource.Tracking.parse("\n \n"));
        assertThrows(IOException.class, () -> ClockStatusSource.Tracking.parse("506 Cannot talk to daemon"));
        IOException e = assertThrows(IOException.class,
                () -> ClockStatusSource.Tracking.parse(synced.replace("-0.000002004", "-2.004e-6")));
        assertTrue(e.getMessage().contains("System time"), e.getMessage());
        e = assertThrows(IOException.class,
                () -> ClockStatusSource.Tracking.parse(synced.replace("0.000006488", "-0.000006488")));
        assertTrue(e.getMessage().contains("Root delay"), e.getMessage());
    }

    @Test
    void theStampClockHasNanosecondResolutionOnThisJvm() {
        long res = Clocks.resolutionNs();
        assertTrue(res <= 1000, "resolution " + res + " ns");
        long a = Clocks.realtimeNs();
        long b = System.currentTimeMillis() * 1_000_000L;
        assertTrue(Math.abs(a - b) < 50_000_000L, "CLOCK_REALTIME agrees with currentTimeMillis");
    }
}
