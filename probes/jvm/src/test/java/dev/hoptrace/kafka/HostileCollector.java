package dev.hoptrace.kafka;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import javax.net.ssl.SSLContext;

/**
 * A collector that misbehaves, for the tests that the interceptors never hold up their
 * client: it listens on 127.0.0.1 (plain TCP, or TLS) and does one wrong thing to every
 * connection ({@link Mode}). The collector that behaves is {@link FakeCollector}.
 */
final class HostileCollector implements AutoCloseable {
    /** What it does with each connection. */
    enum Mode {
        /** Listens with a backlog of one and never accepts: connections wait in the kernel. */
        NEVER_ACCEPT,
        /** Accepts, never reads, never answers. */
        SILENT,
        /** Reads Hello, answers with bytes that are no frame (a length of 2 GiB, then junk). */
        GARBAGE,
        /** Reads Hello and closes. */
        CLOSE_AFTER_HELLO,
        /** Answers Welcome, then never reads again: the socket buffers fill, writes block. */
        WELCOME_THEN_DEAF,
        /** Answers Welcome, then bytes that are no frame, then reads nothing. */
        WELCOME_THEN_GARBAGE,
        /** Answers Welcome {@code delayMs} after Hello, then reads everything. */
        SLOW_WELCOME,
        /** Sends Welcome one byte every {@code delayMs}: each read's timeout is met, never the whole. */
        TRICKLE_WELCOME,
    }

    /** A frame header that claims a frame of 2 GiB, then junk: no decoder may take it as a frame. */
    static final byte[] GARBAGE_BYTES = garbage();

    final Mode mode;
    final long delayMs;
    final ServerSocket server;
    final AtomicInteger accepted = new AtomicInteger();
    final AtomicInteger hellos = new AtomicInteger();
    /** How long each connection stayed open, ms, as this side saw it (ended ones only). */
    final List<Long> connectionMs = new CopyOnWriteArrayList<>();
    private final List<Socket> sockets = new CopyOnWriteArrayList<>();
    private final CountDownLatch stop = new CountDownLatch(1);
    private final Thread acceptor;

    HostileCollector(Mode mode, long delayMs, int port, SSLContext tls) throws IOException {
        this.mode = mode;
        this.delayMs = delayMs;
        server = tls == null ? new ServerSocket() : tls.getServerSocketFactory().createServerSocket();
        server.setReuseAddress(true);
        // Small kernel buffers fill sooner (a deaf collector blocks writes early).
        server.setReceiveBufferSize(4096);
        server.bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), port), mode == Mode.NEVER_ACCEPT ? 1 : 64);
        acceptor = new Thread(this::accept, "hostile-collector");
        acceptor.setDaemon(true);
        if (mode != Mode.NEVER_ACCEPT) {
            acceptor.start();
        }
    }

    HostileCollector(Mode mode) throws IOException {
        this(mode, 0, 0, null);
    }

    int port() {
        return server.getLocalPort();
    }

    String address() {
        return "127.0.0.1:" + port();
    }

    private static byte[] garbage() {
        byte[] b = new byte[4 + 1024];
        b[0] = (byte) 0xff;
        b[1] = (byte) 0xff;
        b[2] = (byte) 0xff;
        b[3] = (byte) 0x7f;
        for (int i = 4; i < b.length; i++) {
            b[i] = (byte) i;
        }
        return b;
    }

    static byte[] welcome() {
        Protocol.Buffer b = new Protocol.Buffer(64);
        int at = b.begin(Protocol.WELCOME);
        b.u16(1).str("hostile-run");
        b.end(at);
        return b.toByteArray();
    }

    private void accept() {
        while (!server.isClosed()) {
            try {
                Socket s = server.accept();
                accepted.incrementAndGet();
                sockets.add(s);
                Thread t = new Thread(() -> serve(s), "hostile-collector-conn");
                t.setDaemon(true);
                t.start();
            } catch (IOException e) {
                return;
            }
        }
    }

    private boolean stopped(long ms) throws InterruptedException {
        return stop.await(ms, TimeUnit.MILLISECONDS);
    }

    private void serve(Socket s) {
        long t0 = System.nanoTime();
        try (s) {
            if (mode == Mode.SILENT) {
                stop.await();
                return;
            }
            InputStream in = s.getInputStream();
            OutputStream out = s.getOutputStream();
            Protocol.read(in);
            hellos.incrementAndGet();
            switch (mode) {
                case CLOSE_AFTER_HELLO -> {
                    return;
                }
                case GARBAGE -> {
                    out.write(GARBAGE_BYTES);
                    out.flush();
                    stop.await();
                }
                case SLOW_WELCOME -> {
                    if (stopped(delayMs)) {
                        return;
                    }
                    out.write(welcome());
                    out.flush();
                    byte[] sink = new byte[1 << 16];
                    while (in.read(sink) >= 0) {
                        // a collector that reads everything from now on
                    }
                }
                case TRICKLE_WELCOME -> {
                    for (byte x : welcome()) {
                        if (stopped(delayMs)) {
                            return;
                        }
                        out.write(x);
                        out.flush();
                    }
                    stop.await();
                }
                case WELCOME_THEN_GARBAGE -> {
                    out.write(welcome());
                    out.write(GARBAGE_BYTES);
                    out.flush();
                    stop.await();
                }
                default -> {
                    out.write(welcome());
                    out.flush();
                    stop.await();
                }
            }
        } catch (IOException | InterruptedException e) {
            // the probe went away, or the test ends
        } finally {
            connectionMs.add(TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0));
        }
    }

    /** Stops listening and closes every connection: the port is free again. */
    @Override
    public void close() throws IOException {
        stop.countDown();
        server.close();
        try {
            acceptor.join(5000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        for (Socket s : sockets) {
            s.close();
        }
    }
}
