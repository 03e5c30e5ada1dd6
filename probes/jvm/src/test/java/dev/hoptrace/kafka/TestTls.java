package dev.hoptrace.kafka;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.util.concurrent.TimeUnit;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;

/**
 * A self-signed certificate for 127.0.0.1, made with the JDK's keytool, for in-process
 * collectors that speak TLS: {@link #server} for their listening socket, {@link #caPem} for
 * the probe's {@code hoptrace.tls.ca}.
 */
final class TestTls {
    private static final String PASSWORD = "hoptrace-test";

    final Path caPem;
    final SSLContext server;

    TestTls(Path dir) throws IOException, InterruptedException, GeneralSecurityException {
        Path store = dir.resolve("collector.p12");
        caPem = dir.resolve("ca.pem");
        String keytool = Path.of(System.getProperty("java.home"), "bin", "keytool").toString();
        run(keytool, "-genkeypair", "-alias", "collector", "-keyalg", "EC", "-groupname", "secp256r1",
                "-dname", "CN=127.0.0.1", "-ext", "SAN=ip:127.0.0.1", "-validity", "2", "-storetype", "PKCS12",
                "-keystore", store.toString(), "-storepass", PASSWORD, "-keypass", PASSWORD);
        run(keytool, "-exportcert", "-rfc", "-alias", "collector", "-keystore", store.toString(), "-storepass",
                PASSWORD, "-file", caPem.toString());
        KeyStore ks = KeyStore.getInstance("PKCS12");
        try (InputStream in = Files.newInputStream(store)) {
            ks.load(in, PASSWORD.toCharArray());
        }
        KeyManagerFactory kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
        kmf.init(ks, PASSWORD.toCharArray());
        server = SSLContext.getInstance("TLS");
        server.init(kmf.getKeyManagers(), null, null);
    }

    private static void run(String... cmd) throws IOException, InterruptedException {
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes());
        if (!p.waitFor(60, TimeUnit.SECONDS) || p.exitValue() != 0) {
            throw new IOException(String.join(" ", cmd) + " failed: " + out);
        }
    }
}
