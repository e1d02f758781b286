package io.github.kvstore;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.net.URISyntaxException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * Native calls whose error paths run on a thread that is nearly out of stack must end in a
 * Java exception, never in a crash of the JVM: each mode of {@link LowStackProbe} runs in a
 * fresh JVM (so that its first native error is the low-stack one) with a small stack and
 * the interpreter only, and must exit normally.
 */
class LowStackTest {
    private static Path location(Class<?> c) {
        try {
            return Path.of(c.getProtectionDomain().getCodeSource().getLocation().toURI());
        } catch (URISyntaxException e) {
            throw new AssertionError(e);
        }
    }

    @ParameterizedTest
    @ValueSource(strings = {"push", "throwing-updater", "overflowing-updater", "nested", "pull-missing"})
    void errorsOnAnExhaustedStackAreExceptionsNotCrashes(String mode) throws IOException, InterruptedException {
        List<String> cmd = new ArrayList<>();
        cmd.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
        cmd.add("-Xint");
        cmd.add("-Xss512k");
        // The child loads the library as this JVM did (the bundled copy, or a path given).
        String nativePath = System.getProperty(NativeLibrary.PATH_PROPERTY);
        if (nativePath != null) {
            cmd.add("-D" + NativeLibrary.PATH_PROPERTY + "=" + nativePath);
        }
        cmd.add("-cp");
        cmd.add(location(NativeLibrary.class) + java.io.File.pathSeparator + location(LowStackProbe.class));
        cmd.add(LowStackProbe.class.getName());
        cmd.add(mode);
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        p.getOutputStream().close();
        byte[] out = p.getInputStream().readAllBytes();
        assertTrue(p.waitFor(120, TimeUnit.SECONDS), "the probe JVM ended");
        String output = new String(out, StandardCharsets.UTF_8);
        assertNotEquals(139, p.exitValue(), () -> "the JVM crashed with SIGSEGV:\n" + output);
        assertEquals(0, p.exitValue(), () -> "exit status " + p.exitValue() + ", output:\n" + output);
        assertTrue(output.contains("ok " + mode), output);
    }
}
