package dev.hoptrace.kafka;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.TimeUnit;

/**
 * This host's clock status for the Clock frame: chronyd's tracking report read with
 * {@code chronyc -n -c tracking} when chronyc answers, else source {@code unknown}.
 *
 * <p>As the Rust probe does: offset is the negation of chronyc's "System time" (positive
 * when the clock is ahead), the error bound is {@code |system time| + root dispersion +
 * root delay / 2}, and the clock counts as synchronised when the leap status is not "Not
 * synchronised", the stratum is below 16 and a reference is selected.
 */
public interface ClockStatusSource {
    /** The status now. */
    Protocol.ClockStatus read();

    /** chronyc if it answers once now, else a source that always says {@code unknown}. */
    static ClockStatusSource detect() {
        Chrony chrony = new Chrony(Chrony.findChronyc());
        try {
            chrony.query();
            return chrony;
        } catch (IOException e) {
            String why = "chronyc -c tracking: " + e.getMessage();
            return () -> new Protocol.ClockStatus(Clocks.realtimeNs(), Protocol.ClockStatus.UNKNOWN, false,
                    Protocol.ClockStatus.LEAP_UNSYNCHRONISED, 0, 0, "no clock status source: " + why);
        }
    }

    /** chronyd, through chronyc. */
    final class Chrony implements ClockStatusSource {
        private final String chronyc;

        Chrony(String chronyc) {
            this.chronyc = chronyc;
        }

        static String findChronyc() {
            List<String> dirs = new ArrayList<>();
            String path = System.getenv("PATH");
            if (path != null) {
                dirs.addAll(List.of(path.split(File.pathSeparator)));
            }
            dirs.addAll(List.of("/usr/bin", "/usr/sbin", "/sbin", "/usr/local/sbin"));
            for (String d : dirs) {
                File f = new File(d, "chronyc");
                if (f.canExecute()) {
                    return f.getPath();
                }
            }
            return "chronyc";
        }

        /** One tracking report. */
        Tracking query() throws IOException {
            Process p = new ProcessBuilder(chronyc, "-n", "-c", "tracking")
                    .redirectErrorStream(true).start();
            try (InputStream in = p.getInputStream()) {
                byte[] out = in.readNBytes(64 * 1024);
                if (!p.waitFor(2, TimeUnit.SECONDS)) {
                    p.destroyForcibly();
                    throw new IOException("no answer within 2 s");
                }
                String text = new String(out, StandardCharsets.UTF_8);
                if (p.exitValue() != 0) {
                    throw new IOException("exit " + p.exitValue() + ": " + text.trim());
                }
                return Tracking.parse(text);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                p.destroyForcibly();
                throw new IOException("interrupted");
            }
        }

        @Override
        public Protocol.ClockStatus read() {
            try {
                return query().toStatus(Clocks.realtimeNs());
            } catch (IOException e) {
                return new Protocol.ClockStatus(Clocks.realtimeNs(), Protocol.ClockStatus.CHRONY, false,
                        Protocol.ClockStatus.LEAP_UNSYNCHRONISED, 0, 0, "chronyc -c tracking: " + e.getMessage());
            }
        }
    }

    /** One line of {@code chronyc -c tracking}: 14 comma-separated fields, times in ns. */
    record Tracking(long refId, String refName, int stratum, long refTimeNs, long systemTimeNs,
                    long lastOffsetNs, long rmsOffsetNs, double frequencyPpm, double residualFreqPpm,
                    double skewPpm, long rootDelayNs, long rootDispersionNs, long updateIntervalNs,
                    String leap) {

        /** Parses the first non-empty line; IOException names the field that is wrong. */
        static Tracking parse(String output) throws IOException {
            String line = output.lines().map(String::trim).filter(l -> !l.isEmpty()).findFirst()
                    .orElseThrow(() -> new IOException("chronyc printed nothing"));
            String[] f = line.split(",", -1);
            if (f.length != 14) {
                throw new IOException("expected 14 comma-separated fields, found " + f.length + " in " + line);
            }
            if (f[0].length() != 8) {
                throw new IOException("Reference ID " + f[0] + " is not 8 hex digits");
            }
            long refId;
            int stratum;
            try {
                refId = Long.parseLong(f[0], 16);
                stratum = Integer.parseInt(f[2]);
            } catch (NumberFormatException e) {
                throw new IOException("Reference ID or Stratum is not a number: " + line);
            }
            if (stratum < 0 || stratum > 255) {
                throw new IOException("Stratum " + f[2] + " is not 0..255");
            }
            String leap = f[13];
            if (!List.of("Normal", "Insert second", "Delete second", "Not synchronised").contains(leap)) {
                throw new IOException("Leap status " + leap + " is unknown");
            }
            return new Tracking(refId, f[1], stratum, ns(f[3], "Ref time"), ns(f[4], "System time"),
                    ns(f[5], "Last offset"), unsignedNs(f[6], "RMS offset"), ppm(f[7], "Frequency"),
                    ppm(f[8], "Residual freq"), ppm(f[9], "Skew"), unsignedNs(f[10], "Root delay"),
                    unsignedNs(f[11], "Root dispersion"), unsignedNs(f[12], "Update interval"), leap);
        }

        private static long ns(String s, String field) throws IOException {
            if (!s.matches("[-+]?(\\d+\\.?\\d*|\\.\\d+)")) {
                throw new IOException(field + " is " + s + ", expected seconds such as -0.000001625");
            }
            try {
                return new BigDecimal(s).movePointRight(9).setScale(0, java.math.RoundingMode.DOWN)
                        .longValueExact();
            } catch (ArithmeticException e) {
                throw new IOException(field + " " + s + " does not fit 64-bit ns");
            }
        }

        private static long unsignedNs(String s, String field) throws IOException {
            long v = ns(s, field);
            if (v < 0) {
                throw new IOException(field + " is negative: " + s);
            }
            return v;
        }

        private static double ppm(String s, String field) throws IOException {
            try {
                double v = Double.parseDouble(s);
                if (!Double.isFinite(v)) {
                    throw new NumberFormatException();
                }
                return v;
            } catch (NumberFormatException e) {
                throw new IOException(field + " is " + s + ", expected ppm");
            }
        }

        boolean synced() {
            return !leap.equals("Not synchronised") && stratum < 16 && refId != 0;
        }

        long offsetNs() {
            return systemTimeNs == Long.MIN_VALUE ? Long.MAX_VALUE : -systemTimeNs;
        }

        long errorBoundNs() {
            return Math.abs(systemTimeNs) + rootDispersionNs + rootDelayNs / 2;
        }

        Protocol.ClockStatus toStatus(long atNs) {
            boolean synced = synced();
            int leapCode = !synced ? Protocol.ClockStatus.LEAP_UNSYNCHRONISED : switch (leap) {
                case "Insert second" -> Protocol.ClockStatus.LEAP_INSERT;
                case "Delete second" -> Protocol.ClockStatus.LEAP_DELETE;
                default -> Protocol.ClockStatus.LEAP_NONE;
            };
            String name = !refName.isEmpty() ? refName : refId == 0x7F7F0101L ? "local clock" : "-";
            String detail = String.format(Locale.ROOT,
                    "ref=%08X (%s) stratum=%d root_delay_ns=%d root_dispersion_ns=%d rms_offset_ns=%d "
                            + "freq_ppm=%.3f skew_ppm=%.3f update_interval_ns=%d leap=\"%s\"",
                    refId, name, stratum, rootDelayNs, rootDispersionNs, rmsOffsetNs, frequencyPpm, skewPpm,
                    updateIntervalNs, leap);
            return new Protocol.ClockStatus(atNs, Protocol.ClockStatus.CHRONY, synced, leapCode, offsetNs(),
                    errorBoundNs(), detail);
        }
    }
}
