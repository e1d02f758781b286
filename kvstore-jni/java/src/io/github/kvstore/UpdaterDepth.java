package io.github.kvstore;

/**
 * How many {@link Updater} calls are running on each thread: {@code Updater.invoke} counts
 * them, and {@link KVStore#setUpdater(Updater)} and {@link KVStore#setOptimizer(Optimizer)}
 * read the count, since they must not wait for a lock from inside an updater.
 */
final class UpdaterDepth {
    /**
     * A plain ThreadLocal, filled on first use, so that no lambda or extra class has to be
     * linked during an updater call on a thread short of stack.
     */
    private static final ThreadLocal<int[]> DEPTH = new ThreadLocal<>();

    private UpdaterDepth() {}

    /** This thread's count, as a mutable cell. */
    static int[] cell() {
        int[] depth = DEPTH.get();
        if (depth == null) {
            depth = new int[1];
            DEPTH.set(depth);
        }
        return depth;
    }
}
