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
     * The handles of {@code arrays} for a store call; 0 for a closed one. The natives
     * take a handle that is no array (0, or one closed since) as the call's refused
     * form: the call is made all the same and fails with {@code DISPOSED}, as the
     * store's own refusals do. On a store shared with other workers ({@code dist_sync}
     * under {@code mpirun}) it so takes its step as this worker's refusal and fails on
     * every worker (on the others with the store's message naming this worker's
     * refusal), leaving the workers' next calls matched; refused here alone, the call
     * would be missing on this worker, whose next call would meet the others' this one.
     * Nulls were checked.
     */
    static long[] handles(NDArray[] arrays) {
        long[] hs = new long[arrays.length];
        for (int i = 0; i < arrays.length; i++) {
            hs[i] = arrays[i].handleOrZero();
        }
        return hs;
    }

    /** Whether {@code handles} (of {@link #handles}) hold a closed array's. */
    static boolean anyClosed(long[] handles) {
        for (long h : handles) {
            if (h == 0) {
                return true;
            }
        }
        return false;
    }

    static NDArray[] one(NDArray array, String name) {
        return new NDArray[] {Objects.requireNonNull(array, name)};
    }

    static String[] one(String key, String name) {
        return new String[] {Objects.requireNonNull(key, name)};
    }
}
