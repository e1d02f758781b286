package io.github.kvstore;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.AtomicMoveNotSupportedException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Locale;

/**
 * Finds and loads the native library {@code libkvstore_jni.so} once per class loader.
 * {@link KVStore}, {@link NDArray} and the package's other native-backed classes call
 * {@link #load()} from their static initialisers, so users never need to.
 *
 * <p>Places tried, in order:
 * <ol>
 *   <li>the file named by the system property {@value #PATH_PROPERTY}
 *       ({@code -Dkvstore.native.path=/opt/kvstore/libkvstore_jni.so});
 *   <li>{@code System.loadLibrary("kvstore_jni")}, that is {@code java.library.path}
 *       (on Linux it includes {@code LD_LIBRARY_PATH});
 *   <li>the copy bundled in the jar ({@value #RESOURCE_DIR}{@code <os>-<arch>/libkvstore_jni.so}),
 *       extracted once into a cache folder as
 *       {@code libkvstore_jni-<version>-<content hash>.so} and loaded from there by every
 *       later JVM (the way netty and opendal load their natives): nothing is left behind
 *       per run, not even by a JVM killed with {@code kill -9}. The folder is
 *       {@code -Dkvstore.native.cache=DIR} if set, else {@code $XDG_CACHE_HOME/kvstore},
 *       else {@code ~/.cache/kvstore}, else (when that cannot be written)
 *       {@code <java.io.tmpdir>/kvstore-<user>}.
 * </ol>
 * If all fail, {@link #load()} throws an {@link UnsatisfiedLinkError} whose message lists
 * every place and why it failed.
 */
public final class NativeLibrary {
    /** The system property naming the library file to load first. */
    public static final String PATH_PROPERTY = "kvstore.native.path";
    /** The library's name for {@link System#loadLibrary(String)}. */
    public static final String LIBRARY_NAME = "kvstore_jni";
    /** The folder of the jar that holds the bundled libraries, one subfolder per platform. */
    public static final String RESOURCE_DIR = "/native/";
    /** The system property naming the folder the bundled library is extracted into. */
    public static final String CACHE_PROPERTY = "kvstore.native.cache";
    /**
     * How many copies of one library the cache may hold: a JVM whose class loaders each
     * load the library needs one file per class loader (the JVM refuses to load one file
     * into two).
     */
    private static final int CACHE_SLOTS = 8;

    private static final Object LOCK = new Object();
    private static volatile String loadedFrom;

    private NativeLibrary() {}

    /**
     * Loads the native library unless it is loaded already. Thread-safe; cheap after the
     * first call.
     *
     * @throws UnsatisfiedLinkError if no place had a loadable library; the message lists
     *     every place tried and why each failed
     */
    public static void load() {
        if (loadedFrom != null) {
            return;
        }
        synchronized (LOCK) {
            if (loadedFrom == null) {
                loadedFrom = loadOnce();
            }
        }
    }

    /**
     * Where the library was loaded from, or {@code null} before a successful
     * {@link #load()}. The text starts with {@code "kvstore.native.path: "},
     * {@code "java.library.path: "} or {@code "bundled: "}, followed by the file or the
     * resource.
     *
     * @return a description of the loaded library's origin, or {@code null}
     */
    public static String loadedFrom() {
        return loadedFrom;
    }

    /**
     * The resource path of the library bundled for this platform, for example
     * {@code /native/linux-x86_64/libkvstore_jni.so}.
     *
     * @return the resource path
     */
    public static String bundledResource() {
        return RESOURCE_DIR + platform() + "/" + System.mapLibraryName(LIBRARY_NAME);
    }

    private static String platform() {
        String os = System.getProperty("os.name", "unknown").toLowerCase(Locale.ROOT);
        String arch = System.getProperty("os.arch", "unknown").toLowerCase(Locale.ROOT);
        if (os.startsWith("linux")) {
            os = "linux";
        } else if (os.startsWith("mac") || os.startsWith("darwin")) {
            os = "macos";
        } else if (os.startsWith("windows")) {
            os = "windows";
        }
        if (arch.equals("amd64") || arch.equals("x86_64")) {
            arch = "x86_64";
        } else if (arch.equals("arm64")) {
            arch = "aarch64";
        }
        return os + "-" + arch;
    }

    private static String loadOnce() {
        List<String> tried = new ArrayList<>();

        String path = System.getProperty(PATH_PROPERTY);
        if (path == null || path.isEmpty()) {
            tried.add("-D" + PATH_PROPERTY + ": not set");
        } else {
            Path file = Path.of(path).toAbsolutePath();
            try {
                System.load(file.toString());
                return "kvstore.native.path: " + file;
            } catch (UnsatisfiedLinkError | SecurityException e) {
                tried.add("-D" + PATH_PROPERTY + "=" + path + ": " + e);
                // Falling through to the other places would silently use another build
                // than the one asked for: say so.
                System.getLogger(NativeLibrary.class.getName()).log(System.Logger.Level.WARNING,
                        "cannot load " + file + " (from -D" + PATH_PROPERTY + "): " + e
                                + "; trying java.library.path and the bundled copy");
            }
        }

        try {
            System.loadLibrary(LIBRARY_NAME);
            return "java.library.path: " + System.mapLibraryName(LIBRARY_NAME);
        } catch (UnsatisfiedLinkError | SecurityException e) {
            tried.add("System.loadLibrary(\"" + LIBRARY_NAME + "\") with java.library.path="
                    + System.getProperty("java.library.path") + ": " + e);
        }

        String resource = bundledResource();
        byte[] library = null;
        try (InputStream in = NativeLibrary.class.getResourceAsStream(resource)) {
            if (in == null) {
                tried.add("bundled resource " + resource + ": not on the class path (a jar without a library"
                        + " for " + platform() + ")");
            } else {
                library = in.readAllBytes();
            }
        } catch (IOException | SecurityException e) {
            tried.add("bundled resource " + resource + ": cannot read it: " + e);
        }
        if (library != null) {
            String name = cacheName(library);
            for (Path dir : cacheDirs()) {
                String loaded = loadCached(resource, library, dir, name, tried);
                if (loaded != null) {
                    return loaded;
                }
            }
        }

        StringBuilder message = new StringBuilder("cannot load the kvstore native library ("
                + System.mapLibraryName(LIBRARY_NAME) + "); tried:");
        for (int i = 0; i < tried.size(); i++) {
            message.append("\n  ").append(i + 1).append(". ").append(tried.get(i));
        }
        message.append("\nBuild it with `cargo build -p kvstore-jni --release` and pass -D")
                .append(PATH_PROPERTY).append("=target/release/").append(System.mapLibraryName(LIBRARY_NAME))
                .append(", or use a jar built by scripts/jar.sh (it bundles the library).");
        throw new UnsatisfiedLinkError(message.toString());
    }

    /**
     * The folders the bundled library may be extracted into, in order: the one named by
     * {@value #CACHE_PROPERTY}, or the user's cache folder, then a folder of the user's
     * under {@code java.io.tmpdir}.
     */
    static List<Path> cacheDirs() {
        List<Path> dirs = new ArrayList<>();
        String named = System.getProperty(CACHE_PROPERTY);
        if (named != null && !named.isEmpty()) {
            dirs.add(Path.of(named).toAbsolutePath());
            return dirs;
        }
        String xdg = System.getenv("XDG_CACHE_HOME");
        if (xdg != null && !xdg.isEmpty() && Path.of(xdg).isAbsolute()) {
            dirs.add(Path.of(xdg, "kvstore"));
        } else {
            dirs.add(Path.of(System.getProperty("user.home", ""), ".cache", "kvstore").toAbsolutePath());
        }
        dirs.add(Path.of(System.getProperty("java.io.tmpdir"), "kvstore-" + System.getProperty("user.name", "user")));
        return dirs;
    }

    /**
     * The library's file name in the cache: {@code libkvstore_jni-<version>-<hash>}, the
     * version from the jar's manifest and the first 16 hex digits of the SHA-256 of its
     * bytes, so that two builds never share a file and one build always reuses its own.
     */
    static String cacheName(byte[] library) {
        String version = NativeLibrary.class.getPackage().getImplementationVersion();
        try {
            byte[] digest = MessageDigest.getInstance("SHA-256").digest(library);
            return "libkvstore_jni-" + (version == null ? "dev" : version) + "-"
                    + HexFormat.of().formatHex(digest, 0, 8);
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("SHA-256 is missing from this JVM", e);
        }
    }

    /**
     * Loads the library from its file in {@code dir}, writing the file first when it is
     * missing or not whole. Returns where it was loaded from, or {@code null} (with the
     * reason added to {@code tried}) when this folder cannot be used.
     */
    private static String loadCached(String resource, byte[] library, Path dir, String name, List<String> tried) {
        for (int slot = 0; slot < CACHE_SLOTS; slot++) {
            Path file = dir.resolve(name + (slot == 0 ? "" : "-" + slot) + ".so");
            try {
                if (!Files.isRegularFile(file) || Files.size(file) != library.length) {
                    write(dir, file, library);
                }
            } catch (IOException | SecurityException e) {
                tried.add("bundled resource " + resource + ": cannot extract it into " + dir + ": " + e);
                return null;
            }
            try {
                System.load(file.toString());
                return "bundled: " + resource + " (extracted to " + file + ")";
            } catch (UnsatisfiedLinkError e) {
                // Loaded already by another class loader of this JVM: the next slot.
                if (String.valueOf(e.getMessage()).contains("another classloader")) {
                    continue;
                }
                tried.add("bundled resource " + resource + " extracted to " + file + ": " + e);
                return null;
            } catch (SecurityException e) {
                tried.add("bundled resource " + resource + " extracted to " + file + ": " + e);
                return null;
            }
        }
        tried.add("bundled resource " + resource + ": already loaded by " + CACHE_SLOTS
                + " class loaders of this JVM");
        return null;
    }

    /**
     * Removes the temporary files of writers that died mid-write (older than a minute: a
     * write takes milliseconds), so that even those do not accumulate.
     */
    private static void removeStaleTemporaries(Path dir) {
        long before = System.currentTimeMillis() - 60_000;
        try (var stale = Files.newDirectoryStream(dir, ".libkvstore_jni-*.tmp")) {
            for (Path p : stale) {
                if (Files.getLastModifiedTime(p).toMillis() < before) {
                    Files.deleteIfExists(p);
                }
            }
        } catch (IOException | SecurityException e) {
            // Best effort: a file that cannot be removed now is tried again next time.
        }
    }

    /**
     * Writes {@code library} to {@code file} through a temporary file in the same folder
     * and an atomic rename: a reader (another JVM) sees the whole file or none, and a
     * file already mapped by a running JVM is replaced, never changed.
     */
    private static void write(Path dir, Path file, byte[] library) throws IOException {
        Files.createDirectories(dir);
        removeStaleTemporaries(dir);
        Path tmp = Files.createTempFile(dir, "." + file.getFileName(), ".tmp");
        try {
            Files.write(tmp, library);
            try {
                Files.move(tmp, file, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
            } catch (AtomicMoveNotSupportedException e) {
                Files.move(tmp, file, StandardCopyOption.REPLACE_EXISTING);
            }
        } finally {
            Files.deleteIfExists(tmp);
        }
    }
}
