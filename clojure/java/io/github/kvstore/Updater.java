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
 * <p>{@code merged} and {@code stored} are valid only during the call: afterwards any use
 * of them is {@link KVStoreException.Code#DISPOSED}; copy what must outlive the call
 * ({@code stored.copyTo(ctx)}). Do not call the store itself from an updater: the keys of
 * the push are locked while it runs.
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
}
