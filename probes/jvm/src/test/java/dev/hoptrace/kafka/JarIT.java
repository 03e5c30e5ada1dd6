package dev.hoptrace.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.lang.reflect.Method;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.jar.JarEntry;
import java.util.jar.JarFile;
import java.util.jar.Manifest;
import java.util.spi.ToolProvider;
import org.junit.jupiter.api.Test;

/**
 * The jar as built drops into Kafka Connect, Streams or MirrorMaker 2 unchanged: it holds
 * only the interceptors' own classes (no dependency inside, shaded or not), its classes refer
 * to nothing but the JDK's java.base, kafka-clients and the SLF4J API that kafka-clients
 * itself requires, and the interceptors load and work in a fresh class loader that has
 * nothing but kafka-clients and SLF4J beside the jar. An integration test (Maven's failsafe):
 * it runs after {@code package}, in {@code mvn verify}.
 */
class JarIT {
    /** The jar {@code mvn package} built ({@code hoptrace.jar}, set by the pom). */
    static Path builtJar() {
        String p = System.getProperty("hoptrace.jar");
        assertNotNull(p, "the pom sets hoptrace.jar for failsafe");
        Path jar = Path.of(p);
        assertTrue(Files.isRegularFile(jar), "built: " + jar);
        return jar;
    }

    static Path jarOf(Class<?> c) throws Exception {
        return Path.of(c.getProtectionDomain().getCodeSource().getLocation().toURI());
    }

    @Test
    void theJarHoldsOnlyTheInterceptorsOwnClasses() throws Exception {
        List<String> foreign = new ArrayList<>();
        int classes = 0;
        try (JarFile jar = new JarFile(builtJar().toFile())) {
            for (JarEntry e : Collections.list(jar.entries())) {
                String n = e.getName();
                if (n.endsWith(".class")) {
                    classes++;
                    if (!n.startsWith("dev/hoptrace/kafka/")) {
                        foreign.add(n);
                    }
                } else if (!e.isDirectory() && !n.startsWith("META-INF/")) {
                    foreign.add(n);
                }
            }
            assertTrue(foreign.isEmpty(), "nothing but dev.hoptrace.kafka and META-INF: " + foreign);
            assertTrue(classes > 20, "classes: " + classes);
            assertNotNull(jar.getEntry("META-INF/LICENSE"), "the license travels with the jar");
            Manifest m = jar.getManifest();
            assertEquals(Exporter.VERSION, m.getMainAttributes().getValue("Implementation-Version"),
                    "the version in Hello is the jar's");
            assertEquals("dev.hoptrace.kafka", m.getMainAttributes().getValue("Automatic-Module-Name"));
        }
    }

    @Test
    void itsClassesReferToNothingButJavaBaseKafkaClientsAndSlf4j() throws Exception {
        Path kafka = jarOf(org.apache.kafka.clients.producer.ProducerRecord.class);
        Path slf4j = jarOf(org.slf4j.LoggerFactory.class);
        ToolProvider jdeps = ToolProvider.findFirst("jdeps").orElseThrow();
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        ByteArrayOutputStream err = new ByteArrayOutputStream();
        int rc = jdeps.run(new PrintStream(out, true, StandardCharsets.UTF_8),
                new PrintStream(err, true, StandardCharsets.UTF_8), "-summary", "-cp",
                kafka + java.io.File.pathSeparator + slf4j, builtJar().toString());
        String summary = out.toString(StandardCharsets.UTF_8);
        assertEquals(0, rc, summary + err.toString(StandardCharsets.UTF_8));
        TreeSet<String> targets = new TreeSet<>();
        for (String line : summary.lines().toList()) {
            String[] parts = line.split(" -> ");
            if (parts.length == 2 && parts[0].trim().equals(builtJar().getFileName().toString())) {
                targets.add(parts[1].trim());
            }
        }
        assertEquals(new TreeSet<>(List.of("java.base", kafka.toString(), slf4j.toString())), targets, summary);
    }

    @Test
    void theInterceptorsLoadAndWorkWithOnlyKafkaClientsBesideThem() throws Exception {
        URL[] path = {builtJar().toUri().toURL(), jarOf(org.apache.kafka.clients.producer.ProducerRecord.class)
                .toUri().toURL(), jarOf(org.slf4j.LoggerFactory.class).toUri().toURL()};
        try (FakeCollector fc = new FakeCollector();
             URLClassLoader loader = new URLClassLoader("only-kafka-clients", path,
                     ClassLoader.getPlatformClassLoader())) {
            // Every class of the jar loads and initialises there.
            try (JarFile jar = new JarFile(builtJar().toFile())) {
                for (JarEntry e : Collections.list(jar.entries())) {
                    String n = e.getName();
                    if (n.endsWith(".class") && !n.equals("module-info.class")) {
                        Class<?> c = Class.forName(n.substring(0, n.length() - 6).replace('/', '.'), true, loader);
                        assertEquals(loader, c.getClassLoader(), "from the jar, not the test's class path: " + c);
                    }
                }
            }
            // A producer interceptor as Kafka makes one: by name, no-argument constructor,
            // configure, then onSend of a traced record, then close.
            Class<?> ic = Class.forName("dev.hoptrace.kafka.HoptraceProducerInterceptor", true, loader);
            Object interceptor = ic.getConstructor().newInstance();
            Map<String, Object> props = new HashMap<>();
            props.put("client.id", "jar-it");
            props.put("hoptrace.collector", fc.address());
            props.put("hoptrace.hop", "flow_out");
            props.put("hoptrace.hop.id", "2");
            props.put("hoptrace.process", "jar-it");
            ic.getMethod("configure", Map.class).invoke(interceptor, props);
            Class<?> recordClass = Class.forName("org.apache.kafka.clients.producer.ProducerRecord", true, loader);
            Object record = recordClass.getConstructor(String.class, Object.class).newInstance("out", new byte[1]);
            Object headers = recordClass.getMethod("headers").invoke(record);
            TraceContext ctx = new TraceContext(9, 1, 42, 1, 1000);
            headers.getClass().getMethod("add", String.class, byte[].class).invoke(headers, "hoptrace", ctx.encode());
            Method onSend = ic.getMethod("onSend", recordClass);
            Object sent = onSend.invoke(interceptor, record);
            Object sentHeaders = recordClass.getMethod("headers").invoke(sent);
            Object header = sentHeaders.getClass().getMethod("lastHeader", String.class).invoke(sentHeaders, "hoptrace");
            byte[] value = (byte[]) header.getClass().getMethod("value").invoke(header);
            assertEquals(1, TraceContext.decode(value).stampCount(), "the stamp went in-band");
            ic.getMethod("close").invoke(interceptor);
            FakeCollector.await(() -> fc.records().size() == 1, 5000, "the record at the collector");
            assertEquals(42, fc.records().get(0).sequence());
            assertEquals(2, fc.records().get(0).hop());
        }
    }

    @Test
    void theMirrorMakerRunUsesTheJarTheBuildMakes() throws Exception {
        String script = Files.readString(TestPaths.repo().resolve("probes/jvm/mm2/run.sh"));
        String name = builtJar().getFileName().toString();
        assertTrue(script.contains("$PROBE/target/" + name), "mm2/run.sh names target/" + name);
    }
}
