package io.github.kvstore;

/**
 * A tiny program that {@link ChildJvmTest} runs in a fresh JVM: makes the native library
 * panic ({@link Native#nDebugPanic()}) and prints, on stdout, the code and message of the
 * exception that came back. Exits 2 if no {@link KVStoreException} came back.
 */
public final class PanicProbe {
    private PanicProbe() {}

    /**
     * Entry point.
     *
     * @param args ignored
     */
    public static void main(String[] args) {
        try {
            Native.nDebugPanic();
        } catch (KVStoreException e) {
            System.out.println("code: " + e.code());
            System.out.println("message: " + e.getMessage());
            // The library goes on working after a panic.
            try (NDArray a = NDArray.ones(2)) {
                System.out.println("size after the panic: " + a.size());
            }
            return;
        }
        System.out.println("no exception");
        System.exit(2);
    }
}
