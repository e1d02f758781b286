package io.github.kvstore;

import java.util.Arrays;

/**
 * A tiny program that {@link LoaderTest} runs in a fresh JVM: loads the library, prints
 * where from, then pushes three arrays and prints the pulled sum. Exits 3 if loading failed.
 */
public final class LoaderProbe {
    private LoaderProbe() {}

    /**
     * Entry point.
     *
     * @param args {@code hold}: after loading, print {@code holding} and wait (to be killed)
     * @throws InterruptedException if interrupted while holding
     */
    public static void main(String[] args) throws InterruptedException {
        try {
            NativeLibrary.load();
        } catch (UnsatisfiedLinkError e) {
            System.out.println("error: " + e.getMessage().replace('\n', '|'));
            System.exit(3);
        }
        System.out.println("loaded-from: " + NativeLibrary.loadedFrom());
        if (args.length > 0 && args[0].equals("hold")) {
            System.out.println("holding");
            System.out.flush();
            Thread.sleep(120_000);
        }
        try (KVStore kv = KVStore.create();
                NDArray one = NDArray.ones(2);
                NDArray out = NDArray.zeros(2)) {
            kv.init("k", one).push("k", new NDArray[] {one, one, one}).pull("k", out);
            System.out.println("pulled: " + Arrays.toString(out.toFloatArray()));
        }
    }
}
