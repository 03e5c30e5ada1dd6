package dev.hoptrace.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import org.apache.kafka.common.config.ConfigDef;
import org.junit.jupiter.api.Test;

/**
 * probes/jvm/README.md says what the code does: its table of settings is the one generated
 * from {@link InterceptorConfig#CONFIG}, and every default its tables of bounds and times
 * give for a setting is that setting's default. {@code HOPTRACE_UPDATE_README=1} rewrites
 * the generated table instead of failing.
 */
class ReadmeTest {
    static final String BEGIN = "<!-- settings: begin (generated, see ReadmeTest) -->\n";
    static final String END = "<!-- settings: end -->\n";

    static Path readme() {
        return TestPaths.repo().resolve("probes/jvm/README.md");
    }

    @Test
    void theSettingsTableIsTheOneConfigDefGenerates() throws Exception {
        String text = Files.readString(readme());
        int b = text.indexOf(BEGIN);
        int e = text.indexOf(END);
        assertTrue(b >= 0 && e > b, "the README marks its generated table");
        String table = text.substring(b + BEGIN.length(), e);
        String generated = InterceptorConfig.markdownTable();
        if (!table.equals(generated) && "1".equals(System.getenv("HOPTRACE_UPDATE_README"))) {
            Files.writeString(readme(), text.substring(0, b + BEGIN.length()) + generated + text.substring(e));
            return;
        }
        assertEquals(generated, table, "regenerate with HOPTRACE_UPDATE_README=1 probes/jvm/test.sh");
    }

    @Test
    void theDefaultsOfTheBoundsAndTimesTablesAreTheSettingsDefaults() throws Exception {
        String text = Files.readString(readme());
        String rest = text.substring(0, text.indexOf(BEGIN)) + text.substring(text.indexOf(END));
        List<String> checked = new ArrayList<>();
        for (String line : rest.lines().toList()) {
            if (!line.startsWith("| ")) {
                continue;
            }
            String[] cells = line.split("\\|");
            // cells[0] is empty: "| a | b | c |" -> "", " a ", " b ", " c "
            if (cells.length < 4) {
                continue;
            }
            String bound = cells[2].trim();
            if (!bound.matches("`hoptrace\\.[a-z.]+`")) {
                continue;
            }
            String key = bound.substring(1, bound.length() - 1);
            ConfigDef.ConfigKey k = InterceptorConfig.CONFIG.configKeys().get(key);
            assertTrue(k != null, "the README names a setting that does not exist: " + key);
            // A setting without a fixed default documents it after "Unset: ".
            String doc = k.documentation;
            String expected = k.defaultValue != null ? "`" + k.defaultValue + "`"
                    : doc.substring(doc.indexOf("Unset: ") + 7, doc.indexOf('.', doc.indexOf("Unset: ")));
            assertTrue(cells[3].trim().startsWith(expected), line + ": the default of " + key + " is " + expected);
            checked.add(key);
        }
        assertTrue(checked.containsAll(List.of(InterceptorConfig.QUEUE_CAPACITY, InterceptorConfig.BATCH_RECORDS,
                InterceptorConfig.CONNECT_TIMEOUT_MS, InterceptorConfig.WRITE_TIMEOUT_MS,
                InterceptorConfig.CLOSE_TIMEOUT_MS, InterceptorConfig.RETENTION_BYTES)), "checked: " + checked);
    }
}
