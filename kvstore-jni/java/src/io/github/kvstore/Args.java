package io.github.kvstore;

import java.util.Arrays;
import java.util.Objects;

/**
 * The argument checks and conversions of {@link KVStore} and {@link AsyncKVStore}: every
 * null is found, and named, before any native call.
 */
final class Args {
    private Args() {
    }

    static String[] checkKeys(String[] keys, String name) {
        Objects.requireNonNull(keys, name);
        for (int i = 0; i < keys.length; i++) {
            Objects.requireNonNull(keys[i], name + "[" + i + "]");
        }
        return keys;
    }

    static String[] repeat(String key, String keyName, NDArray[] arrays, String arraysName) {
        Objects.requireNonNull(key, keyName);
        Objects.requireNonNull(arrays, arraysName);
        String[] keys = new String[arrays.length];
        Arrays.fill(keys, key);
        return keys;
    }

    static void checkArrays(NDArray[] arrays, String name) {
        Objects.requireNonNull(arrays, name);
        for (int i = 0; i < arrays.length; i++) {
            Objects.requireNonNull(arrays[i], name + "[" + i + "]");
        }
    }

    /**
     * The handles of {@code arrays} for a call {@code op} of {@code store}; {@code DISPOSED}
     * for a closed one. When the store is shared with other workers ({@code dist_sync}
     * under {@code mpirun}), the call is first refused in the store
     * ({@link KVStore#refuse}): it takes its step as this worker's refusal, so that it
     * fails on every worker (on the others with the store's message naming this worker's
     * refusal) and the workers' next calls stay matched. Refused here alone, the call
     * would be missing on this worker, whose next call would meet the others' this call
     * (a desync that fails it everywhere too, or, for two pushes of the same key, sums
     * the wrong calls together). Nulls were checked.
     */
    static long[] handles(KVStore store, String op, NDArray[] arrays, String name) {
        try {
            return handles(arrays, name);
        } catch (KVStoreException e) {
            throw refused(store, op, e);
        }
    }

    /**
     * {@code e}, the reason a call {@code op} of {@code store} was refused before it was
     * made, once the call took its step as this worker's refusal where the store is
     * shared with other workers (see {@link #handles(KVStore, String, NDArray[], String)}).
     */
    static KVStoreException refused(KVStore store, String op, KVStoreException e) {
        if (store.sharedWithOtherWorkers()) {
            store.refuse(op);
        }
        return e;
    }

    /** The handles of {@code arrays}; {@code DISPOSED} for a closed one. Nulls were checked. */
    static long[] handles(NDArray[] arrays, String name) {
        long[] hs = new long[arrays.length];
        for (int i = 0; i < arrays.length; i++) {
            try {
                hs[i] = arrays[i].handle();
            } catch (KVStoreException e) {
                throw new KVStoreException(KVStoreException.Code.DISPOSED,
                        name + "[" + i + "] is an NDArray that was closed", e);
            }
        }
        return hs;
    }

    static NDArray[] one(NDArray array, String name) {
        return new NDArray[] {Objects.requireNonNull(array, name)};
    }

    static String[] one(String key, String name) {
        return new String[] {Objects.requireNonNull(key, name)};
    }
}
