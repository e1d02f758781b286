package io.github.kvstore;

import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.net.URISyntaxException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * Runs a probe's {@code main} in a fresh JVM, with the API classes (the jar, with its
 * bundled library) and the test classes on the class path, and the library found as this
 * JVM found it; stdout and stderr are kept apart.
 */
final class ChildJvm {
    /** How a child JVM ended. */
    static final class Result {
        final int exit;
        final String out;
        final String err;

        Result(int exit, String out, String err) {
            this.exit = exit;
            this.out = out;
            this.err = err;
        }

        @Override
        public String toString() {
            return "exit " + exit + "\n--- stdout:\n" + out + "--- stderr:\n" + err;
        }
    }

    private ChildJvm() {}

    private static Path location(Class<?> c) {
        try {
            return Path.of(c.getProtectionDomain().getCodeSource().getLocation().toURI());
        } catch (URISyntaxException e) {
            throw new AssertionError(e);
        }
    }

    /**
     * Runs {@code main} of {@code probe} with {@code jvmOptions} and {@code args}; {@code env}
     * entries with a null value are removed from the child's environment.
     */
    static Result run(Class<?> probe, List<String> jvmOptions, Map<String, String> env, long timeoutSeconds,
            String... args) throws IOException, InterruptedException {
        List<String> cmd = new ArrayList<>();
        cmd.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
        cmd.addAll(jvmOptions);
        String nativePath = System.getProperty(NativeLibrary.PATH_PROPERTY);
        if (nativePath != null) {
            cmd.add("-D" + NativeLibrary.PATH_PROPERTY + "=" + nativePath);
        }
        String libraryPath = System.getProperty("java.library.path");
        if (libraryPath != null) {
            cmd.add("-Djava.library.path=" + libraryPath);
        }
        cmd.add("-cp");
        cmd.add(location(NativeLibrary.class) + java.io.File.pathSeparator + location(probe));
        cmd.add(probe.getName());
        cmd.addAll(List.of(args));
        ProcessBuilder pb = new ProcessBuilder(cmd);
        for (Map.Entry<String, String> e : env.entrySet()) {
            if (e.getValue() == null) {
                pb.environment().remove(e.getKey());
            } else {
                pb.environment().put(e.getKey(), e.getValue());
            }
        }
        Process p = pb.start();
        p.getOutputStream().close();
        // Both streams are read on their own threads, so that a child that hangs is
        // stopped at the timeout (reading its stdout here would wait for it to end).
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        ByteArrayOutputStream err = new ByteArrayOutputStream();
        Thread outReader = new Thread(() -> copy(p.getInputStream(), out), "child-stdout");
        Thread errReader = new Thread(() -> copy(p.getErrorStream(), err), "child-stderr");
        outReader.start();
        errReader.start();
        boolean ended = p.waitFor(timeoutSeconds, TimeUnit.SECONDS);
        if (!ended) {
            p.destroyForcibly().waitFor(10, TimeUnit.SECONDS);
        }
        outReader.join(10_000);
        errReader.join(10_000);
        Result result = new Result(p.isAlive() ? -1 : p.exitValue(), text(out), text(err));
        assertTrue(ended, () -> "the child JVM ended within " + timeoutSeconds + " s: " + result);
        return result;
    }

    private static String text(ByteArrayOutputStream bytes) {
        return new String(bytes.toByteArray(), StandardCharsets.UTF_8);
    }

    private static void copy(InputStream in, ByteArrayOutputStream out) {
        try {
            in.transferTo(out);
        } catch (IOException e) {
            // The stream of a child stopped at the timeout: what was read is kept.
        }
    }
}
