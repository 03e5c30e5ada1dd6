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
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.BooleanSupplier;

/**
 * An in-process collector for unit tests: accepts connections on 127.0.0.1, answers Hello
 * with Welcome (or Reject when told to), and keeps every frame it decodes per connection.
 * The end-to-end tests use the real `hoptrace collect`.
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
            Protocol.Frame hello = Protocol.read(in);
            c.frames.add(hello);
            Protocol.Buffer b = new Protocol.Buffer(64);
            int at;
            if (rejectCode != 0) {
                at = b.begin(Protocol.REJECT);
                b.u16(rejectCode).str("rejected by the test");
            } else {
                at = b.begin(Protocol.WELCOME);
                b.u16(1).str("run-test");
            }
            b.end(at);
            out.write(b.toByteArray());
            out.flush();
            if (rejectCode != 0) {
                return;
            }
            for (;;) {
                Protocol.Frame f = Protocol.read(in);
                c.frames.add(f);
                if (f instanceof Protocol.GoodbyeFrame) {
                    return;
                }
            }
        } catch (IOException | InterruptedException e) {
            // closed
        } finally {
            c.closed = true;
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
