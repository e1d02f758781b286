package io.github.kvstore;

/**
 * A program that {@link LowStackTest} runs in a fresh JVM (small {@code -Xss}, {@code -Xint}
 * so that frame sizes do not change under the JIT): it makes native calls whose error paths
 * run while the thread's stack is nearly exhausted, the first error of the JVM among them.
 * Prints {@code ok <mode>} and exits 0 if the JVM survived and every result was as
 * expected; prints {@code FAIL ...} and exits 2 otherwise. A crash of the native library
 * ends the JVM with SIGSEGV (exit status 139) instead.
 */
public final class LowStackProbe {
    private LowStackProbe() {}

    private static KVStore kv;
    private static KVStore other;
    private static NDArray one;
    private static long errors;

    /** One native call, made at every depth of {@link #descend(Runnable)}. */
    private static void descend(Runnable call) {
        try {
            call.run();
        } catch (KVStoreException e) {
            errors++;
        }
        descend(call);
    }

    /** Runs {@code call} at every depth until the stack overflows, {@code rounds} times. */
    private static void everyLevel(int rounds, Runnable call) {
        for (int i = 0; i < rounds; i++) {
            try {
                descend(call);
            } catch (StackOverflowError expected) {
                // The Java side ran out of stack: the point of the exercise.
            }
        }
    }

    private static int overflow(int depth) {
        return overflow(depth + 1) + 1;
    }

    private static void fail(String why) {
        System.out.println("FAIL " + why);
        System.exit(2);
    }

    /**
     * Entry point.
     *
     * @param args the mode: {@code push} (an updater that copies, at every depth: the first
     *     error is the updater call failing for lack of stack), {@code throwing-updater},
     *     {@code overflowing-updater} (the updater itself overflows the stack, first at a
     *     shallow depth, then at every depth), {@code nested} (an updater that pushes to
     *     another store) or {@code pull-missing} (an error without an updater)
     */
    public static void main(String[] args) {
        String mode = args[0];
        kv = KVStore.create();
        other = KVStore.create();
        one = NDArray.ones(1);
        kv.init("k", one);
        other.init("o", one);
        switch (mode) {
            case "push":
                kv.setUpdater((key, index, merged, stored) -> stored.copyFrom(merged));
                everyLevel(3, () -> kv.push("k", one));
                break;
            case "throwing-updater":
                kv.setUpdater((key, index, merged, stored) -> {
                    throw new IllegalStateException("no");
                });
                everyLevel(1, () -> kv.push("k", one));
                break;
            case "overflowing-updater":
                kv.setUpdater((key, index, merged, stored) -> overflow(0));
                try {
                    kv.push("k", one);
                    fail("a push whose updater overflows the stack returned normally");
                } catch (KVStoreException e) {
                    if (e.code() != KVStoreException.Code.BACKEND || !(e.getCause() instanceof StackOverflowError)
                            || !e.getMessage().endsWith("key \"k\": the updater threw; see the cause")) {
                        fail("expected BACKEND caused by StackOverflowError, got " + e.code() + " \"" + e.getMessage()
                                + "\" caused by " + e.getCause());
                    }
                }
                everyLevel(2, () -> kv.push("k", one));
                break;
            case "nested":
                other.setUpdater((key, index, merged, stored) -> stored.copyFrom(merged));
                kv.setUpdater((key, index, merged, stored) -> other.push("o", merged));
                everyLevel(3, () -> kv.push("k", one));
                break;
            case "pull-missing":
                everyLevel(3, () -> kv.pull("missing", one));
                break;
            default:
                fail("unknown mode " + mode);
        }
        if (errors == 0) {
            fail("no call failed: the low-stack error paths were not reached");
        }
        // The library still works on a healthy stack.
        try (NDArray out = NDArray.zeros(1)) {
            kv.setUpdater(null).push("k", one).pull("k", out);
            if (out.toFloatArray()[0] != 1f) {
                fail("pulled " + out.toFloatArray()[0] + " after the probe, not 1");
            }
        }
        System.out.println("ok " + mode + " (" + errors + " KVStoreExceptions)");
    }
}
