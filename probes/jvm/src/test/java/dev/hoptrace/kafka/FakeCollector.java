package dev.hoptrace.kafka;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.BooleanSupplier;

/**
 * An in-process collector for unit tests: accepts connections on 127.0.0.1, answers Hello
 * with Welcome (or Reject when told to), and keeps every frame it decodes per connection.
 * It speaks version 1 unless {@link #version} is 2: then it holds, per exporter instance, the
 * SeqRecords frames it received (as if each were durable at once), acknowledges each (unless
 * {@link #acks} is off), answers a Hello with the highest number it holds ({@code
 * resume_seq}), and drops a frame numbered at or below that as already held. The end-to-end
 * tests use the real `hoptrace collect`.
 */
final class FakeCollector implements AutoCloseable {
    /** One probe connection and what it sent. */
    static final class Connection {
        final List<Protocol.Frame> frames = new CopyOnWriteArrayList<>();
        volatile boolean closed;
        final Socket socket;

        Connection(Socket socket) {
            this.socket = socket;
        }

        Protocol.Hello hello() {
            return ((Protocol.HelloFrame) frames.get(0)).hello();
        }

        boolean saidGoodbye() {
            return !frames.isEmpty() && frames.get(frames.size() - 1) instanceof Protocol.GoodbyeFrame;
        }
    }

    final ServerSocket server;
    final List<Connection> connections = new CopyOnWriteArrayList<>();
    volatile int rejectCode;
    /** The highest version it answers (a probe that asks for less gets what it asks). */
    volatile int version = 1;
    /** Version 2: refuse a version 2 Hello with Reject code 1 (a version 1 collector). */
    volatile boolean refuseVersion2;
    /** Version 2: acknowledge every SeqRecords frame as it arrives. */
    volatile boolean acks = true;
    /** Version 2: per exporter instance, the highest SeqRecords number held. */
    final Map<Long, Long> held = new ConcurrentHashMap<>();
    /** Version 2: records of frames dropped as already held. */
    final AtomicLong resentDropped = new AtomicLong();
    /** Version 2: records of the SeqRecords frames held, whether kept or not. */
    final AtomicLong heldRecords = new AtomicLong();
    /**
     * Version 2: keep the SeqRecords frames held ({@link #records()}); off, only {@link
     * #heldRecords} counts them (a test of many thousands of frames).
     */
    volatile boolean keepFrames = true;
    /** When set, connections are accepted but never read (a stalled collector). */
    volatile boolean stalled;
    private final Thread acceptor;
    private volatile boolean closing;

    FakeCollector() throws IOException {
        this(0);
    }

    FakeCollector(int port) throws IOException {
        this(port, null);
    }

    /** A collector on {@code port} (0: any) that speaks TLS when {@code tls} is given. */
    FakeCollector(int port, javax.net.ssl.SSLContext tls) throws IOException {
        server = tls == null ? new ServerSocket() : tls.getServerSocketFactory().createServerSocket();
        server.setReuseAddress(true);
        server.bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), port));
        acceptor = new Thread(this::accept, "fake-collector");
        acceptor.setDaemon(true);
        acceptor.start();
    }

    String address() {
        return "127.0.0.1:" + server.getLocalPort();
    }

    private void accept() {
        while (!server.isClosed()) {
            try {
                Socket s = server.accept();
                if (closing) {
                    // Accepted while close() was under way: the listening socket lives on
                    // until accept() returns, so a probe reconnecting at once can still get in.
                    s.close();
                    return;
                }
                Connection c = new Connection(s);
                connections.add(c);
                Thread t = new Thread(() -> serve(c), "fake-collector-conn");
                t.setDaemon(true);
                t.start();
            } catch (IOException e) {
                return;
            }
        }
    }

    private void serve(Connection c) {
        try (Socket s = c.socket) {
            if (stalled) {
                while (!s.isClosed() && !server.isClosed()) {
                    Thread.sleep(10);
                }
                return;
            }
            InputStream in = s.getInputStream();
            OutputStream out = s.getOutputStream();
            Protocol.HelloFrame hello = (Protocol.HelloFrame) Protocol.read(in);
            c.frames.add(hello);
            long instance = hello.hello().instanceId();
            int v = Math.min(version, hello.version());
            if (v >= 2) {
                // What it holds counts the frames of an earlier connection of this instance
                // still being read: wait (a little) for that one to end.
                long until = System.nanoTime() + 1_000_000_000L;
                for (Connection other : connections) {
                    while (other != c && !other.closed && !other.frames.isEmpty()
                            && other.hello().instanceId() == instance && System.nanoTime() < until) {
                        Thread.sleep(1);
                    }
                }
            }
            int reject = rejectCode != 0 ? rejectCode : refuseVersion2 && hello.version() >= 2 ? 1 : 0;
            Protocol.Buffer b = new Protocol.Buffer(64);
            int at;
            if (reject != 0) {
                at = b.begin(Protocol.REJECT);
                b.u16(reject).str(reject == 1 ? "unsupported_version: version 2" : "rejected by the test");
            } else {
                at = b.begin(Protocol.WELCOME);
                b.u16(v).str("run-test");
                if (v >= 2) {
                    b.i64(held.getOrDefault(instance, 0L));
                }
            }
            b.end(at);
            out.write(b.toByteArray());
            out.flush();
            if (reject != 0) {
                return;
            }
            for (;;) {
                Protocol.Frame f = Protocol.read(in);
                if (f instanceof Protocol.SeqRecordsFrame sr && v >= 2) {
                    synchronized (held) {
                        if (sr.seq() <= held.getOrDefault(instance, 0L)) {
                            resentDropped.addAndGet(sr.records().size());
                            continue;
                        }
                        held.put(instance, sr.seq());
                        heldRecords.addAndGet(sr.records().size());
                        if (keepFrames) {
                            c.frames.add(f);
                        }
                    }
                    if (acks) {
                        ack(out, sr.seq());
                    }
                    continue;
                }
                c.frames.add(f);
                if (f instanceof Protocol.GoodbyeFrame) {
                    if (v >= 2 && acks) {
                        ack(out, held.getOrDefault(instance, 0L));
                    }
                    return;
                }
            }
        } catch (IOException | InterruptedException e) {
            // closed
        } finally {
            c.closed = true;
        }
    }

    private static void ack(OutputStream out, long seq) throws IOException {
        Protocol.Buffer b = new Protocol.Buffer(16);
        int at = b.begin(Protocol.ACK);
        b.i64(seq);
        b.end(at);
        out.write(b.toByteArray());
        out.flush();
    }

    /**
     * Version 2: forgets every frame of {@code instance} numbered above {@code seq}, as a
     * collector killed after making only those up to {@code seq} durable and started again.
     * Call with the connections dropped.
     */
    void forgetAbove(long instance, long seq) {
        synchronized (held) {
            for (Connection c : connections) {
                if (!c.frames.isEmpty() && c.hello().instanceId() == instance) {
                    c.frames.removeIf(f -> f instanceof Protocol.SeqRecordsFrame sr && sr.seq() > seq);
                }
            }
            held.put(instance, Math.min(seq, held.getOrDefault(instance, 0L)));
        }
    }

    /**
     * Closes every connection open now, as a collector that restarts does; the listening
     * socket stays. Returns how many were closed.
     */
    int dropConnections() throws IOException {
        int n = 0;
        for (Connection c : connections) {
            if (!c.closed && !c.socket.isClosed()) {
                c.socket.close();
                n++;
            }
        }
        return n;
    }

    /** Every record received, over all connections. */
    List<Protocol.Record> records() {
        List<Protocol.Record> out = new ArrayList<>();
        for (Connection c : connections) {
            for (Protocol.Frame f : c.frames) {
                if (f instanceof Protocol.RecordsFrame r) {
                    out.addAll(r.records());
                } else if (f instanceof Protocol.SeqRecordsFrame r) {
                    out.addAll(r.records());
                }
            }
        }
        return out;
    }

    /** The last Counters frame received, over all connections, or null. */
    Protocol.CountersFrame lastCounters() {
        Protocol.CountersFrame last = null;
        for (Connection c : connections) {
            for (Protocol.Frame f : c.frames) {
                if (f instanceof Protocol.CountersFrame cf && (last == null || cf.atNs() >= last.atNs())) {
                    last = cf;
                }
            }
        }
        return last;
    }

    static void await(BooleanSupplier cond, long timeoutMs, String what) throws InterruptedException {
        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        while (!cond.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("timed out waiting for " + what);
            }
            Thread.sleep(5);
        }
    }

    @Override
    public void close() throws IOException {
        closing = true;
        server.close();
        try {
            // Only once the acceptor has left accept() does the port stop taking connections.
            acceptor.join(5000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        for (Connection c : connections) {
            c.socket.close();
        }
    }
}
