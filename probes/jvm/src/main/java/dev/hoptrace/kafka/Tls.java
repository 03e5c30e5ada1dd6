package dev.hoptrace.kafka;

import java.io.IOException;
import java.io.InputStream;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.util.Collection;
import java.util.List;
import javax.net.ssl.SNIHostName;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;
import javax.net.ssl.TrustManagerFactory;

/**
 * TLS 1.2/1.3 to a collector started with {@code --tls-cert/--tls-key}: the collector's
 * certificate is verified against the CA certificates of a PEM file and against the
 * collector's name (an IP address or DNS name in its subjectAltName), as HTTPS does.
 */
final class Tls {
    private final SSLContext context;

    /** Trusts the certificates of {@code caPem}; IllegalArgumentException when it has none. */
    Tls(Path caPem) {
        try (InputStream in = Files.newInputStream(caPem)) {
            Collection<? extends Certificate> certs = CertificateFactory.getInstance("X.509").generateCertificates(in);
            if (certs.isEmpty()) {
                throw new IllegalArgumentException("no certificate in " + caPem);
            }
            KeyStore trust = KeyStore.getInstance(KeyStore.getDefaultType());
            trust.load(null, null);
            int i = 0;
            for (Certificate c : certs) {
                trust.setCertificateEntry("hoptrace-ca-" + i++, c);
            }
            TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
            tmf.init(trust);
            context = SSLContext.getInstance("TLS");
            context.init(null, tmf.getTrustManagers(), null);
        } catch (IOException | GeneralSecurityException e) {
            throw new IllegalArgumentException("cannot use " + caPem + " as the collector's CA bundle: " + e, e);
        }
    }

    /** TLS over the connected {@code tcp}, verifying the certificate against {@code name}. */
    SSLSocket wrap(Socket tcp, String name, int port) throws IOException {
        SSLSocket s = (SSLSocket) context.getSocketFactory().createSocket(tcp, name, port, true);
        SSLParameters p = s.getSSLParameters();
        p.setEndpointIdentificationAlgorithm("HTTPS");
        p.setProtocols(new String[] {"TLSv1.3", "TLSv1.2"});
        if (!isIpLiteral(name)) {
            p.setServerNames(List.of(new SNIHostName(name)));
        }
        s.setSSLParameters(p);
        return s;
    }

    private static boolean isIpLiteral(String name) {
        return name.contains(":") || name.matches("[0-9.]+");
    }
}
