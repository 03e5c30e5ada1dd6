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
 * This host's clock status for the Clock frame, found as the Rust probe finds it
 * ({@code hoptrace_clock::this_host}): chronyd if {@code chronyc -n -c tracking}
 * answers, else ptp4l if {@code pmc} gets an answer on its default socket, else nothing the
 * JVM can read: the Rust probe's last resort, the kernel's NTP state ({@code adjtimex}),
 * needs native code (JNI, or the foreign function API that is not final in Java 17), which
 * this library does not use; the source is then {@code unknown}, its detail naming why each
 * candidate was not used.
 *
 * <p>As the Rust probe does: chrony's offset is the negation of chronyc's "System time"
 * (positive when the clock is ahead), its error bound {@code |system time| + root
 * dispersion + root delay / 2}, and the clock counts as synchronised when the leap status
 * is not "Not synchronised", the stratum is below 16 and a reference is selected. ptp4l's
 * offset is {@code master_offset}, its bound {@code |master_offset| + mean path delay}, and
 * it is synchronised when a grandmaster is present and a port is {@code SLAVE}.
 */
public interface ClockStatusSource {
    /** The status now. */
    Protocol.ClockStatus read();

    /** Why the kernel is not a source here. */
    String KERNEL_WHY = "kernel: adjtimex needs native code, which this library does not use";

    /** What {@link #detect(String, String)} found once for this process. */
    static ClockStatusSource detect() {
        return Detected.THIS_HOST;
    }

    /**
     * Asks chronyc, then pmc (each once); the first that answers is the source. Without
     * either, a source that always says {@code unknown}, naming every reason.
     */
    static ClockStatusSource detect(String chronyc, String pmc) {
        List<String> why = new ArrayList<>();
        Chrony chrony = new Chrony(chronyc);
        try {
            chrony.query();
            return chrony;
        } catch (IOException e) {
            why.add("chronyc -c tracking: " + e.getMessage());
        }
        Ptp ptp = new Ptp(pmc, "/var/run/ptp4l", 0);
        try {
            ptp.query();
            return ptp;
        } catch (IOException e) {
            why.add("pmc: " + e.getMessage());
        }
        why.add(KERNEL_WHY);
        String detail = "no clock status source: " + String.join("; ", why);
        return new Unknown(detail);
    }

    /** The process's detection, done once. */
    final class Detected {
        private Detected() {}

        static final ClockStatusSource THIS_HOST = detect(findProgram("chronyc"), findProgram("pmc"));
    }

    /** Nothing known; {@code detail} says why. */
    record Unknown(String detail) implements ClockStatusSource {
        @Override
        public Protocol.ClockStatus read() {
            return new Protocol.ClockStatus(Clocks.realtimeNs(), Protocol.ClockStatus.UNKNOWN, false,
                    Protocol.ClockStatus.LEAP_UNSYNCHRONISED, 0, 0, detail);
        }
    }

    /** {@code name} on PATH or in the sbin directories; {@code name} itself when not found. */
    static String findProgram(String name) {
        List<String> dirs = new ArrayList<>();
        String path = System.getenv("PATH");
        if (path != null) {
            dirs.addAll(List.of(path.split(File.pathSeparator)));
        }
        dirs.addAll(List.of("/usr/sbin", "/sbin", "/usr/local/sbin"));
        for (String d : dirs) {
            if (d.isEmpty()) {
                continue;
            }
            File f = new File(d, name);
            if (f.isFile() && f.canExecute()) {
                return f.getPath();
            }
        }
        return name;
    }

    /** Runs a program for at most 2 s; its output on exit 0, else an IOException saying why. */
    static String run(List<String> command) throws IOException {
        Process p;
        try {
            p = new ProcessBuilder(command).redirectErrorStream(true).start();
        } catch (IOException e) {
            throw new IOException("not installed (" + command.get(0) + ")");
        }
        try (InputStream in = p.getInputStream()) {
            p.getOutputStream().close();
            byte[] out = in.readNBytes(256 * 1024);
            if (!p.waitFor(2, TimeUnit.SECONDS)) {
                p.destroyForcibly();
                throw new IOException("no answer within 2 s");
            }
            String text = new String(out, StandardCharsets.UTF_8);
            if (p.exitValue() != 0) {
                String first = text.strip().lines().findFirst().orElse("no output");
                throw new IOException("exit " + p.exitValue() + ": " + first);
            }
            return text;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            p.destroyForcibly();
            throw new IOException("interrupted");
        }
    }

    /** chronyd, through chronyc. */
    final class Chrony implements ClockStatusSource {
        private final String chronyc;

        Chrony(String chronyc) {
            this.chronyc = chronyc;
        }

        /** One tracking report. */
        Tracking query() throws IOException {
            return Tracking.parse(ClockStatusSource.run(List.of(chronyc, "-n", "-c", "tracking")));
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

    /** ptp4l, through pmc over its Unix management socket. */
    final class Ptp implements ClockStatusSource {
        private static final java.util.concurrent.atomic.AtomicLong QUERIES = new java.util.concurrent.atomic.AtomicLong();
        private final String pmc;
        private final String socket;
        private final int domain;

        Ptp(String pmc, String socket, int domain) {
            this.pmc = pmc;
            this.socket = socket;
            this.domain = domain;
        }

        /** One reading; pmc's own socket in the temporary directory. */
        PtpReading query() throws IOException {
            File client = new File(System.getProperty("java.io.tmpdir"),
                    "hoptrace-pmc." + ProcessHandle.current().pid() + "." + QUERIES.getAndIncrement());
            try {
                return PtpReading.parse(ClockStatusSource.run(List.of(pmc, "-u", "-b", "0", "-d",
                        String.valueOf(domain), "-s", socket, "-i", client.getPath(), "GET TIME_STATUS_NP",
                        "GET PORT_DATA_SET", "GET CURRENT_DATA_SET", "GET TIME_PROPERTIES_DATA_SET")));
            } finally {
                // pmc removes its socket on exit; not when killed on a timeout.
                client.delete();
            }
        }

        @Override
        public Protocol.ClockStatus read() {
            String where = " uds=" + socket + " domain=" + domain;
            try {
                Protocol.ClockStatus s = query().toStatus(Clocks.realtimeNs());
                return new Protocol.ClockStatus(s.atNs(), s.source(), s.synced(), s.leap(), s.offsetNs(),
                        s.errorBoundNs(), s.detail() + where);
            } catch (IOException e) {
                return new Protocol.ClockStatus(Clocks.realtimeNs(), Protocol.ClockStatus.PTP, false,
                        Protocol.ClockStatus.LEAP_UNSYNCHRONISED, 0, 0, "pmc: " + e.getMessage() + " (" + where.strip() + ")");
            }
        }
    }

    /** What pmc printed for the four requests (as the Rust probe's {@code PtpReading}). */
    record PtpReading(long masterOffsetNs, boolean gmPresent, String gmIdentity, List<String> portStates,
                      List<Long> peerDelaysNs, Long meanPathDelayNs, Long stepsRemoved, boolean leap61,
                      boolean leap59, Integer timeSource, Boolean traceable) {
        private static final java.util.Set<String> STATES = java.util.Set.of("INITIALIZING", "FAULTY", "DISABLED",
                "LISTENING", "PRE_MASTER", "MASTER", "PASSIVE", "UNCALIBRATED", "SLAVE", "GRAND_MASTER");

        private record Answer(String kind, String id, List<String[]> fields) {
            String field(String name) throws IOException {
                for (String[] f : fields) {
                    if (f[0].equals(name)) {
                        return f[1];
                    }
                }
                throw new IOException("pmc: " + id + " has no field " + name);
            }

            long integer(String name) throws IOException {
                String v = field(name);
                try {
                    return Long.parseLong(v.startsWith("+") ? v.substring(1) : v);
                } catch (NumberFormatException e) {
                    throw new IOException("pmc: field " + name + " is " + v + ", expected an integer");
                }
            }

            boolean flag(String name) throws IOException {
                String v = field(name);
                if (!v.equals("0") && !v.equals("1")) {
                    throw new IOException("pmc: field " + name + " is " + v + ", expected 0 or 1");
                }
                return v.equals("1");
            }
        }

        /** Parses pmc's output; an IOException when there is no TIME_STATUS_NP answer or a field is malformed. */
        static PtpReading parse(String output) throws IOException {
            List<Answer> answers = new ArrayList<>();
            for (String raw : output.split("\n", -1)) {
                if (raw.isBlank()) {
                    continue;
                }
                if (raw.startsWith("\t\t")) {
                    if (answers.isEmpty()) {
                        throw new IOException("pmc: field before any answer: " + raw.strip());
                    }
                    String[] nv = raw.strip().split("\\s+", 2);
                    answers.get(answers.size() - 1).fields().add(new String[] {nv[0], nv.length > 1 ? nv[1].strip() : ""});
                } else if (raw.startsWith("\t")) {
                    String[] t = raw.strip().split("\\s+");
                    if (t.length < 5 || !t[1].equals("seq") || !t[2].matches("\\d+")) {
                        throw new IOException("pmc: cannot read line " + raw.strip());
                    }
                    answers.add(new Answer(t[4], t.length > 5 ? t[5] : "", new ArrayList<>()));
                }
            }
            Answer ts = null;
            Answer cur = null;
            Answer tp = null;
            List<String> states = new ArrayList<>();
            List<Long> peer = new ArrayList<>();
            for (Answer a : answers) {
                if (!a.kind().equals("MANAGEMENT")) {
                    continue;
                }
                switch (a.id()) {
                    case "TIME_STATUS_NP" -> ts = ts == null ? a : ts;
                    case "CURRENT_DATA_SET" -> cur = cur == null ? a : cur;
                    case "TIME_PROPERTIES_DATA_SET" -> tp = tp == null ? a : tp;
                    case "PORT_DATA_SET" -> {
                        String state = a.field("portState");
                        if (!STATES.contains(state)) {
                            throw new IOException("pmc: field portState is " + state + ", expected a port state such as SLAVE");
                        }
                        states.add(state);
                        peer.add(a.integer("peerMeanPathDelay"));
                    }
                    default -> { }
                }
            }
            if (ts == null) {
                throw new IOException("pmc printed no TIME_STATUS_NP answer (is ptp4l running on that socket and domain?)");
            }
            String gm = ts.field("gmPresent");
            if (!gm.equals("true") && !gm.equals("false")) {
                throw new IOException("pmc: field gmPresent is " + gm + ", expected true or false");
            }
            Long meanPathDelay = null;
            Long steps = null;
            if (cur != null) {
                String v = cur.field("meanPathDelay");
                if (!v.matches("[-+]?\\d+(\\.\\d*)?")) {
                    throw new IOException("pmc: field meanPathDelay is " + v + ", expected nanoseconds");
                }
                meanPathDelay = Long.parseLong(v.replaceFirst("^\\+", "").replaceFirst("\\..*$", ""));
                steps = cur.integer("stepsRemoved");
            }
            boolean leap61 = false;
            boolean leap59 = false;
            Integer source = null;
            Boolean traceable = null;
            if (tp != null) {
                leap61 = tp.flag("leap61");
                leap59 = tp.flag("leap59");
                traceable = tp.flag("timeTraceable");
                String src = tp.field("timeSource");
                if (!src.matches("0x[0-9a-fA-F]{1,2}")) {
                    throw new IOException("pmc: field timeSource is " + src + ", expected a hex byte such as 0xa0");
                }
                source = Integer.parseInt(src.substring(2), 16);
            }
            return new PtpReading(ts.integer("master_offset"), gm.equals("true"), ts.field("gmIdentity"), states,
                    peer, meanPathDelay, steps, leap61, leap59, source, traceable);
        }

        /** CURRENT_DATA_SET's meanPathDelay, else a SLAVE port's peerMeanPathDelay; null when neither is known. */
        Long pathDelayNs() {
            if (meanPathDelayNs != null && meanPathDelayNs != 0) {
                return meanPathDelayNs;
            }
            for (int i = 0; i < portStates.size(); i++) {
                if (portStates.get(i).equals("SLAVE") && peerDelaysNs.get(i) != 0) {
                    return peerDelaysNs.get(i);
                }
            }
            return null;
        }

        long errorBoundNs() {
            Long d = pathDelayNs();
            return Math.abs(masterOffsetNs) + (d == null ? 0 : Math.abs(d));
        }

        String portState() {
            for (String s : portStates) {
                if (s.equals("SLAVE") || s.equals("UNCALIBRATED")) {
                    return s;
                }
            }
            return portStates.isEmpty() ? null : portStates.get(0);
        }

        boolean synced() {
            return gmPresent && (portStates.isEmpty() || portStates.contains("SLAVE"));
        }

        Protocol.ClockStatus toStatus(long atNs) {
            boolean synced = synced();
            int leap = !synced ? Protocol.ClockStatus.LEAP_UNSYNCHRONISED
                    : leap61 ? Protocol.ClockStatus.LEAP_INSERT
                    : leap59 ? Protocol.ClockStatus.LEAP_DELETE : Protocol.ClockStatus.LEAP_NONE;
            Long d = pathDelayNs();
            String port = portState();
            StringBuilder detail = new StringBuilder("gm=" + gmIdentity + " gm_present=" + gmPresent + " port="
                    + (port == null ? "unknown" : port) + " master_offset_ns=" + masterOffsetNs
                    + " mean_path_delay_ns=" + (d == null ? "unknown" : d.toString()));
            if (stepsRemoved != null) {
                detail.append(" steps_removed=").append(stepsRemoved);
            }
            if (timeSource != null) {
                detail.append(String.format(Locale.ROOT, " time_source=0x%02x traceable=%s", timeSource, traceable));
            }
            if (!gmPresent && "MASTER".equals(port)) {
                detail.append(" (this host is the grandmaster)");
            }
            return new Protocol.ClockStatus(atNs, Protocol.ClockStatus.PTP, synced, leap, masterOffsetNs,
                    errorBoundNs(), detail.toString());
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
