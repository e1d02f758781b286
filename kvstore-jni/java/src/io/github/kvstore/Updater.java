package io.github.kvstore;

/**
 * A custom merge of pushed values into a key's stored value (MXNet's
 * {@code kv._set_updater}), installed with {@link KVStore#setUpdater(Updater)}.
 *
 * <p>When it runs: on the thread that called {@code push} (or {@code pushpull}), inside
 * that call, once per distinct key of the push, after the key's values were summed into
 * {@code merged}; the keys of one push are visited in the order they were first
 * initialised, not in the order given. Changes to {@code stored} (for example
 * {@code stored.addInPlace(merged)}) become the key's value only if every update of the
 * push returns normally: if this method throws, the push fails with
 * {@link KVStoreException.Code#BACKEND}, its cause is the exception thrown here, and the
 * store keeps the values it had before the push.
 *
 * <p>{@code merged} and {@code stored} are valid only during the call: afterwards they are
 * closed, and any use of them (their shape included) is
 * {@link KVStoreException.Code#DISPOSED}; copy what must outlive the call
 * ({@code stored.copyTo(ctx)}).
 *
 * <p>Calling stores from an updater: an updater may not call the store that runs it
 * ({@code init}, {@code push}, {@code pull}, {@code pushpull}, {@code setUpdater}, the
 * optimizer calls; for any key, not only the keys of the push): the push holds its keys
 * while its updates run, so such a call fails at once with
 * {@link KVStoreException.Code#INVALID_ARGUMENT} instead of waiting for itself or for a
 * thread that waits for this push. It may call other stores,
 * but those calls never wait: if a key they need is locked by a call on another thread,
 * they fail with {@code INVALID_ARGUMENT} instead, so that two stores whose updaters call
 * each other cannot deadlock. Pushes nested through updaters (an updater pushing to a store whose
 * updater pushes to another, ...) may be at most 8 deep on one thread; a deeper push
 * fails with {@code INVALID_ARGUMENT}. An exception thrown here, a
 * {@link StackOverflowError} included, fails the push with {@code BACKEND} and is its
 * cause.
 *
 * <p>The store keeps its updater reachable for as long as the store is (the native side
 * holds it only weakly), so an updater that captures its own store does not keep the
 * store alive.
 */
@FunctionalInterface
public interface Updater {
    /**
     * Merges the sum of the pushed values into the stored value.
     *
     * @param key the key
     * @param index the key's internal number (0, 1, 2, ... in order of first init), which
     *     clojure-mxnet's updaters received instead of the key
     * @param merged the sum of the values pushed to the key in this push; read-only by intent
     * @param stored a working copy of the key's value: modify it in place
     */
    void update(String key, int index, NDArray merged, NDArray stored);

    /**
     * Runs {@code updater} on the arrays of two native handles; called by the native side
     * ({@code kvstore-jni/src/updater.rs}) for each update, through a method ID cached when
     * the library loads, so that no class has to be looked up during a push.
     */
    private static void invoke(Updater updater, String key, int index, long merged, long stored) {
        NDArray m = NDArray.borrowed(merged);
        NDArray s = NDArray.borrowed(stored);
        // Counted for KVStore.setUpdater, which must not wait for a lock from inside an updater.
        int[] depth = UpdaterDepth.cell();
        depth[0]++;
        try {
            updater.update(key, index, m, s);
        } finally {
            depth[0]--;
            // Their handles end with the call (the native side frees them): so does every use.
            m.release();
            s.release();
        }
    }
}
