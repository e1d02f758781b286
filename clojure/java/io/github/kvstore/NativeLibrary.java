package io.github.kvstore;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
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
 *       extracted to a temporary file that is deleted when the JVM exits.
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
        try {
            Path extracted = extract(resource);
            if (extracted == null) {
                tried.add("bundled resource " + resource + ": not on the class path (a jar without a library"
                        + " for " + platform() + ")");
            } else {
                try {
                    System.load(extracted.toString());
                    return "bundled: " + resource + " (extracted to " + extracted + ")";
                } catch (UnsatisfiedLinkError | SecurityException e) {
                    tried.add("bundled resource " + resource + " extracted to " + extracted + ": " + e);
                }
            }
        } catch (IOException | SecurityException e) {
            tried.add("bundled resource " + resource + ": cannot extract it to a temporary file: " + e);
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

    /** Copies the resource to a fresh temporary file; {@code null} if there is no such resource. */
    private static Path extract(String resource) throws IOException {
        try (InputStream in = NativeLibrary.class.getResourceAsStream(resource)) {
            if (in == null) {
                return null;
            }
            // A fresh file per load: a library file loaded by one class loader cannot be
            // loaded by another, and a file another JVM is using must not be overwritten.
            Path file = Files.createTempFile("libkvstore_jni-", ".so");
            file.toFile().deleteOnExit();
            Files.copy(in, file, StandardCopyOption.REPLACE_EXISTING);
            return file;
        }
    }
}
