package dev.hoptrace.kafka;

import java.nio.file.Files;
import java.nio.file.Path;

/** Where the repository and the hoptrace binary are. */
final class TestPaths {
    private TestPaths() {}

    /** The repository root ($HOPTRACE_REPO, set by the pom, else two levels up). */
    static Path repo() {
        String env = System.getenv("HOPTRACE_REPO");
        Path p = env != null ? Path.of(env) : Path.of("../..");
        p = p.toAbsolutePath().normalize();
        if (!Files.isRegularFile(p.resolve("docs/trace-format.md"))) {
            throw new IllegalStateException("not the hoptrace repository: " + p);
        }
        return p;
    }
}
