package dev.hoptrace.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The clock status source is found as the Rust probe finds it: chronyd, else ptp4l through
 * pmc, else (no kernel source without native code) unknown with every reason. Stub chronyc
 * and pmc scripts stand in for the daemons; pmc's output is the one captured from ptp4l
 * (probe/testdata/clock/). One test asks this host.
 */
class ClockDetectionTest {
    static final String CHRONY_DOWN = "echo '506 Cannot talk to daemon' >&2; exit 1\n";
    static final String PMC_NOBODY = "for r in \"$@\"; do case $r in GET*) echo \"sending: $r\";; esac; done\n";

    static String capture(String name) throws IOException {
        return Files.readString(TestPaths.repo().resolve("probe/testdata/clock/" + name));
    }

    static String stub(Path dir, String name, String body) throws IOException {
        Path p = dir.resolve(name);
        Files.writeString(p, "#!/bin/sh\n" + body);
        Files.setPosixFilePermissions(p, PosixFilePermissions.fromString("rwxr-xr-x"));
        return p.toString();
    }

    static String cat(String name) {
        return "cat '" + TestPaths.repo().resolve("probe/testdata/clock/" + name) + "'\n";
    }

    @Test
    void pmcOfAFreeRunningSlaveAndOfAGrandmaster() throws IOException {
        String slave = capture("pmc-slave-free-running.txt");
        ClockStatusSource.PtpReading r = ClockStatusSource.PtpReading.parse(slave);
        assertEquals(-105, r.masterOffsetNs());
        assertEquals(2899L, r.pathDelayNs());
        assertEquals(105 + 2899, r.errorBoundNs());
        assertFalse(r.synced(), "free_running: measured, never locked");
        Protocol.ClockStatus s = r.toStatus(7);
        assertEquals(Protocol.ClockStatus.PTP, s.source());
        assertEquals(Protocol.ClockStatus.LEAP_UNSYNCHRONISED, s.leap());
        assertTrue(s.detail().startsWith("gm=02c9c1.fffe.736ac7 gm_present=true port=UNCALIBRATED"), s.detail());
        Protocol.ClockStatus locked = ClockStatusSource.PtpReading.parse(slave.replace("UNCALIBRATED", "SLAVE")
                .replace("leap61                0", "leap61                1")).toStatus(0);
        assertTrue(locked.synced());
        assertEquals(Protocol.ClockStatus.LEAP_INSERT, locked.leap());
        Protocol.ClockStatus gm = ClockStatusSource.PtpReading.parse(capture("pmc-grandmaster.txt")).toStatus(0);
        assertFalse(gm.synced());
        assertTrue(gm.detail().contains("this host is the grandmaster"), gm.detail());
        IOException none = assertThrows(IOException.class,
                () -> ClockStatusSource.PtpReading.parse(capture("pmc-no-answer.txt")));
        assertTrue(none.getMessage().contains("no TIME_STATUS_NP answer"), none.getMessage());
        assertThrows(IOException.class, () -> ClockStatusSource.PtpReading.parse(slave.replace("UNCALIBRATED", "DAYDREAMING")));
        assertThrows(IOException.class, () -> ClockStatusSource.PtpReading.parse("\t\tmaster_offset -105\n"));
    }

    @Test
    void chronydComesFirst(@TempDir Path dir) throws IOException {
        ClockStatusSource s = ClockStatusSource.detect(stub(dir, "chronyc", cat("chronyc-tracking-synced.csv")),
                stub(dir, "pmc", cat("pmc-slave-free-running.txt")));
        assertInstanceOf(ClockStatusSource.Chrony.class, s);
        Protocol.ClockStatus st = s.read();
        assertEquals(Protocol.ClockStatus.CHRONY, st.source());
        assertEquals(2004, st.offsetNs());
    }

    @Test
    void thenPtp4lAskedAsTheRustProbeAsksIt(@TempDir Path dir) throws IOException {
        Path argv = dir.resolve("argv");
        ClockStatusSource s = ClockStatusSource.detect(stub(dir, "chronyc", CHRONY_DOWN),
                stub(dir, "pmc", "printf '%s\\n' \"$@\" > '" + argv + "'\n" + cat("pmc-slave-free-running.txt")));
        assertInstanceOf(ClockStatusSource.Ptp.class, s);
        Protocol.ClockStatus st = s.read();
        assertEquals(Protocol.ClockStatus.PTP, st.source());
        assertEquals(-105, st.offsetNs());
        assertEquals(3004, st.errorBoundNs());
        assertTrue(st.detail().endsWith("uds=/var/run/ptp4l domain=0"), st.detail());
        List<String> args = Files.readAllLines(argv);
        assertEquals(List.of("-u", "-b", "0", "-d", "0", "-s", "/var/run/ptp4l", "-i"), args.subList(0, 8));
        assertEquals(List.of("GET TIME_STATUS_NP", "GET PORT_DATA_SET", "GET CURRENT_DATA_SET",
                "GET TIME_PROPERTIES_DATA_SET"), args.subList(9, 13));
    }

    @Test
    void elseUnknownNamingEveryReasonTheKernelsIncluded(@TempDir Path dir) throws IOException {
        ClockStatusSource s = ClockStatusSource.detect(stub(dir, "chronyc", CHRONY_DOWN), stub(dir, "pmc", PMC_NOBODY));
        Protocol.ClockStatus st = s.read();
        assertEquals(Protocol.ClockStatus.UNKNOWN, st.source());
        assertFalse(st.synced());
        assertEquals(Protocol.ClockStatus.LEAP_UNSYNCHRONISED, st.leap());
        assertEquals(0, st.errorBoundNs());
        assertTrue(st.detail().startsWith("no clock status source: chronyc -c tracking: exit 1: 506 Cannot talk to daemon; "
                + "pmc: pmc printed no TIME_STATUS_NP answer"), st.detail());
        assertTrue(st.detail().endsWith(ClockStatusSource.KERNEL_WHY), st.detail());
        Protocol.ClockStatus missing = ClockStatusSource.detect(dir.resolve("none").toString(),
                dir.resolve("none").toString()).read();
        assertTrue(missing.detail().contains("chronyc -c tracking: not installed"), missing.detail());
    }

    @Test
    void aChronydThatStopsAfterDetectionIsReportedUnsynchronised(@TempDir Path dir) throws IOException {
        String chronyc = stub(dir, "chronyc", cat("chronyc-tracking-synced.csv"));
        ClockStatusSource s = ClockStatusSource.detect(chronyc, stub(dir, "pmc", PMC_NOBODY));
        assertTrue(s.read().synced());
        Files.writeString(Path.of(chronyc), "#!/bin/sh\n" + CHRONY_DOWN);
        Protocol.ClockStatus st = s.read();
        assertEquals(Protocol.ClockStatus.CHRONY, st.source());
        assertFalse(st.synced());
        assertTrue(st.detail().contains("Cannot talk to daemon"), st.detail());
    }

    /** chronyc is installed here (infra/setup.sh); whether chronyd answers is asked independently. */
    @Test
    void thisHostAsDocumented() throws Exception {
        String chronyc = ClockStatusSource.findProgram("chronyc");
        assertTrue(new File(chronyc).isAbsolute(), "chronyc is not installed (infra/setup.sh installs chrony)");
        Process p = new ProcessBuilder(chronyc, "-n", "-c", "tracking").redirectErrorStream(true).start();
        p.getInputStream().readAllBytes();
        assertTrue(p.waitFor(5, TimeUnit.SECONDS));
        Protocol.ClockStatus st = ClockStatusSource.detect().read();
        if (p.exitValue() == 0) {
            assertEquals(Protocol.ClockStatus.CHRONY, st.source(), st.detail());
            return;
        }
        String pmc = ClockStatusSource.findProgram("pmc");
        String pmcOut = "";
        if (new File(pmc).isAbsolute()) {
            Process q = new ProcessBuilder(pmc, "-u", "-b", "0", "GET TIME_STATUS_NP").redirectErrorStream(true).start();
            pmcOut = new String(q.getInputStream().readAllBytes());
            q.waitFor(5, TimeUnit.SECONDS);
        }
        if (pmcOut.contains("RESPONSE MANAGEMENT TIME_STATUS_NP")) {
            assertEquals(Protocol.ClockStatus.PTP, st.source(), st.detail());
            return;
        }
        assertEquals(Protocol.ClockStatus.UNKNOWN, st.source(), st.detail());
        assertTrue(st.detail().startsWith("no clock status source: chronyc -c tracking: "), st.detail());
        assertTrue(st.detail().endsWith(ClockStatusSource.KERNEL_WHY), st.detail());
    }
}
