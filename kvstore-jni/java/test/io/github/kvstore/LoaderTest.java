package io.github.kvstore;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.net.URISyntaxException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Enumeration;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.jar.JarEntry;
import java.util.jar.JarFile;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The native loader: the bundled copy in this JVM, and in fresh JVMs
 * {@code -Dkvstore.native.path}, {@code java.library.path}, a wrong path, and nothing at all.
 */
class LoaderTest {
    @TempDir
    Path tmp;

    /** Result of a child JVM. */
    private static final class Run {
        final int exit;
        final String out;

        Run(int exit, String out) {
            this.exit = exit;
            this.out = out;
        }

        @Override
        public String toString() {
            return "exit " + exit + ", output:\n" + out;
        }
    }

    private static Path location(Class<?> c) {
        try {
            return Path.of(c.getProtectionDomain().getCodeSource().getLocation().toURI());
        } catch (URISyntaxException e) {
            throw new AssertionError(e);
        }
    }

    /** The jar (or folder) the API classes came from, and the folder of the test classes. */
    private static String classPath(Path apiClasses) {
        return apiClasses + java.io.File.pathSeparator + location(LoaderProbe.class);
    }

    private Run runProbe(String classPath, String... properties) throws IOException, InterruptedException {
        List<String> cmd = new ArrayList<>();
        cmd.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
        // An empty java.library.path unless the caller names one: the child must not find
        // a library this test did not put there.
        boolean libraryPathGiven = false;
        for (String p : properties) {
            libraryPathGiven |= p.startsWith("-Djava.library.path=");
        }
        if (!libraryPathGiven) {
            Path empty = Files.createDirectories(tmp.resolve("empty-library-path"));
            cmd.add("-Djava.library.path=" + empty);
        }
        cmd.addAll(List.of(properties));
        cmd.add("-cp");
        cmd.add(classPath);
        cmd.add(LoaderProbe.class.getName());
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        p.getOutputStream().close();
        byte[] out = p.getInputStream().readAllBytes();
        assertTrue(p.waitFor(60, TimeUnit.SECONDS), "the probe JVM ended");
        return new Run(p.exitValue(), new String(out, StandardCharsets.UTF_8));
    }

    /** The bundled library, copied out of the jar to {@code dir/name}. */
    private static Path copyBundled(Path dir, String name) throws IOException {
        Files.createDirectories(dir);
        Path file = dir.resolve(name);
        try (InputStream in = NativeLibrary.class.getResourceAsStream(NativeLibrary.bundledResource())) {
            assertNotNull(in, "the jar bundles " + NativeLibrary.bundledResource());
            Files.copy(in, file);
        }
        return file;
    }

    /** The API classes only (no bundled library): the class entries of the jar, extracted. */
    private Path apiClassesWithoutLibrary() throws IOException {
        Path api = location(NativeLibrary.class);
        if (Files.isDirectory(api)) {
            assertTrue(Files.notExists(api.resolve(NativeLibrary.bundledResource().substring(1))),
                    "the class folder holds no library");
            return api;
        }
        Path dir = Files.createDirectories(tmp.resolve("api-classes"));
        try (JarFile jar = new JarFile(api.toFile())) {
            for (Enumeration<JarEntry> en = jar.entries(); en.hasMoreElements();) {
                JarEntry e = en.nextElement();
                if (e.getName().endsWith(".class")) {
                    Path target = dir.resolve(e.getName());
                    Files.createDirectories(target.getParent());
                    try (InputStream in = jar.getInputStream(e)) {
                        Files.copy(in, target);
                    }
                }
            }
        }
        return dir;
    }

    @Test
    void thisJvmLoadedTheLibrary() {
        try (NDArray a = NDArray.ones(1)) {
            assertEquals(1, a.size());
        }
        String from = NativeLibrary.loadedFrom();
        assertNotNull(from);
        if (Boolean.getBoolean("kvstore.test.expectBundled")) {
            // scripts/test-java.sh runs with an empty java.library.path and no
            // -Dkvstore.native.path, so the extraction path is the one tested here.
            assertTrue(from.startsWith("bundled: /native/linux-x86_64/libkvstore_jni.so"), from);
        } else {
            assertTrue(from.startsWith("bundled: ") || from.startsWith("java.library.path: ")
                    || from.startsWith("kvstore.native.path: "), from);
        }
        NativeLibrary.load(); // a second call is a no-op
        assertEquals(from, NativeLibrary.loadedFrom());
    }

    @Test
    void aFreshJvmLoadsTheFileNamedByKvstoreNativePath() throws Exception {
        Path lib = copyBundled(tmp.resolve("explicit"), "libkvstore_jni_custom.so");
        Run run = runProbe(classPath(apiClassesWithoutLibrary()), "-Dkvstore.native.path=" + lib);
        assertEquals(0, run.exit, run::toString);
        assertTrue(run.out.contains("loaded-from: kvstore.native.path: " + lib), run::toString);
        assertTrue(run.out.contains("pulled: [3.0, 3.0]"), run::toString);
    }

    @Test
    void aFreshJvmExtractsTheBundledCopyFromTheJar() throws Exception {
        Path api = location(NativeLibrary.class);
        Path cache = tmp.resolve("cache");
        Run run = runProbe(classPath(api), "-Dkvstore.native.cache=" + cache);
        assertEquals(0, run.exit, run::toString);
        assertTrue(run.out.contains("loaded-from: bundled: /native/linux-x86_64/libkvstore_jni.so (extracted to "
                + cache.resolve("libkvstore_jni-")), run::toString);
        assertTrue(run.out.contains("pulled: [3.0, 3.0]"), run::toString);
    }

    /** The files of {@code dir}, by name. */
    private static List<String> files(Path dir) throws IOException {
        try (var s = Files.list(dir)) {
            return s.map(p -> p.getFileName().toString()).sorted().toList();
        }
    }

    @Test
    void theExtractedLibraryIsReusedSoNoRunLeavesAFileBehindNotEvenAKilledOne() throws Exception {
        Path api = location(NativeLibrary.class);
        Path cache = tmp.resolve("reused-cache");
        String cacheProperty = "-Dkvstore.native.cache=" + cache;
        Run first = runProbe(classPath(api), cacheProperty);
        assertEquals(0, first.exit, first::toString);
        List<String> after = files(cache);
        assertEquals(1, after.size(), () -> "one library file: " + after);
        String name = after.get(0);
        assertTrue(name.matches("libkvstore_jni-[0-9A-Za-z.+-]+-[0-9a-f]{16}\\.so"), name);
        Path lib = cache.resolve(name);
        Object inode = Files.readAttributes(lib, java.nio.file.attribute.BasicFileAttributes.class).fileKey();
        long modified = Files.getLastModifiedTime(lib).toMillis();

        Run second = runProbe(classPath(api), cacheProperty);
        assertEquals(0, second.exit, second::toString);
        assertTrue(second.out.contains("(extracted to " + lib + ")"), second::toString);

        // A JVM killed with SIGKILL while it uses the library.
        Process held = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                "-Djava.library.path=" + Files.createDirectories(tmp.resolve("empty-library-path")), cacheProperty,
                "-cp", classPath(api), LoaderProbe.class.getName(), "hold")
                .redirectErrorStream(true).start();
        try (var out = new java.io.BufferedReader(
                new java.io.InputStreamReader(held.getInputStream(), StandardCharsets.UTF_8))) {
            String line;
            StringBuilder seen = new StringBuilder();
            while ((line = out.readLine()) != null && !line.equals("holding")) {
                seen.append(line).append('\n');
            }
            assertEquals("holding", line, () -> "the probe loaded the library and waits: " + seen);
            held.destroyForcibly();
            assertTrue(held.waitFor(60, TimeUnit.SECONDS), "the killed probe ended");
        }

        assertEquals(List.of(name), files(cache), "still exactly the one library file");
        assertEquals(inode, Files.readAttributes(lib, java.nio.file.attribute.BasicFileAttributes.class).fileKey(),
                "the file was reused, not written again");
        assertEquals(modified, Files.getLastModifiedTime(lib).toMillis(), "the file was not rewritten");
    }

    @Test
    void aTruncatedCachedLibraryIsWrittenAgain() throws Exception {
        Path api = location(NativeLibrary.class);
        Path cache = tmp.resolve("truncated-cache");
        String cacheProperty = "-Dkvstore.native.cache=" + cache;
        assertEquals(0, runProbe(classPath(api), cacheProperty).exit);
        Path lib = cache.resolve(files(cache).get(0));
        long size = Files.size(lib);
        Files.write(lib, new byte[100]); // a cut-short copy, as a full disk leaves one
        Run run = runProbe(classPath(api), cacheProperty);
        assertEquals(0, run.exit, run::toString);
        assertTrue(run.out.contains("pulled: [3.0, 3.0]"), run::toString);
        assertEquals(size, Files.size(lib), "the whole library again");
        assertEquals(List.of(lib.getFileName().toString()), files(cache));
    }

    @Test
    void aFreshJvmFindsTheLibraryOnJavaLibraryPath() throws Exception {
        Path dir = tmp.resolve("libpath");
        copyBundled(dir, System.mapLibraryName("kvstore_jni"));
        Run run = runProbe(classPath(apiClassesWithoutLibrary()), "-Djava.library.path=" + dir);
        assertEquals(0, run.exit, run::toString);
        assertTrue(run.out.contains("loaded-from: java.library.path: "), run::toString);
        assertTrue(run.out.contains("pulled: [3.0, 3.0]"), run::toString);
    }

    @Test
    void aWrongKvstoreNativePathFallsBackToTheBundledCopy() throws Exception {
        Path missing = tmp.resolve("no-such-dir").resolve("libkvstore_jni.so");
        Run run = runProbe(classPath(location(NativeLibrary.class)), "-Dkvstore.native.path=" + missing);
        assertEquals(0, run.exit, run::toString);
        assertTrue(run.out.contains("loaded-from: bundled: "), run::toString);
        assertTrue(run.out.contains(missing.toString()), "the warning names the wrong path: " + run);
    }

    @Test
    void withNoLibraryAnywhereTheErrorListsEveryPlaceTried() throws Exception {
        Path missing = tmp.resolve("nowhere").resolve("libkvstore_jni.so");
        Run run = runProbe(classPath(apiClassesWithoutLibrary()), "-Dkvstore.native.path=" + missing);
        assertEquals(3, run.exit, run::toString);
        assertTrue(run.out.contains("error: cannot load the kvstore native library"), run::toString);
        assertTrue(run.out.contains("1. -Dkvstore.native.path=" + missing), run::toString);
        assertTrue(run.out.contains("2. System.loadLibrary(\"kvstore_jni\") with java.library.path="), run::toString);
        assertTrue(run.out.contains("3. bundled resource /native/linux-x86_64/libkvstore_jni.so: not on the class path"),
                run::toString);
    }
}
