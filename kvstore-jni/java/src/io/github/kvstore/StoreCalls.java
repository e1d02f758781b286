package io.github.kvstore;

import static io.github.kvstore.Args.one;

import java.util.Objects;

/**
 * The calls of a store in MXNet's argument forms: {@code push}, {@code pull},
 * {@code pushpull} and {@code broadcast}, blocking on a {@link KVStore} (each returns the
 * store once it has taken effect) and non-blocking on its {@link KVStore#async()} view,
 * {@link AsyncKVStore} (each returns a future at once). A store implements the forms with
 * a trailing {@code int priority}; the others, defined here, are those forms at priority 0
 * or with one array.
 *
 * <h2 id="forms">Argument forms</h2>
 *
 * <ul>
 * <li>one key and one array ({@code String, NDArray});
 * <li>one key and many arrays ({@code String, NDArray[]}): pushed arrays are summed, left
 *     to right, into one update, and every out receives the value;
 * <li>parallel arrays of keys and arrays ({@code String[], NDArray[]}), where
 *     {@code arrays[i]} goes with {@code keys[i]} and a repeated key gets the sum of its
 *     arrays in one update ({@code push(new String[] {"3", "3", "3"}, ones)} stores 3, not
 *     1); keys and arrays of different lengths are
 *     {@link KVStoreException.Code#LENGTH_MISMATCH}.
 * </ul>
 * The two forms with an {@code NDArray[]} also come with a trailing {@code int priority}
 * (see {@link KVStore}); the calls without one have priority 0. {@code pushpull} without
 * outs writes the result back into the values (give the values as the outs too for a
 * priority); {@code broadcast} takes one value per key. Push always copies: the store
 * never keeps a caller's array. A null argument is a {@link NullPointerException} naming
 * the parameter, thrown at once; the store's errors are {@link KVStoreException}s, thrown
 * by a blocking call and completing a non-blocking call's future exceptionally; those of
 * a form are those of the form with a priority.
 *
 * @param <R> what a call returns: the store ({@link KVStore}), or the call's future
 *     ({@link AsyncKVStore})
 */
public interface StoreCalls<R> {
    /**
     * Pushes {@code values} to {@code key}, summed left to right into one update
     * (<a href="#forms">one key, many arrays</a>).
     *
     * @param key the key
     * @param values the values, for example one per device
     * @param priority MXNet's priority (see {@link KVStore}): orders queued calls, never
     *     results
     * @return the store, or the call's future
     * @throws KVStoreException as {@link #push(String[], NDArray[], int)}
     */
    R push(String key, NDArray[] values, int priority);

    /**
     * Pushes {@code values[i]} to {@code keys[i]}: for each distinct key, its values are
     * summed left to right, then the updater merges the sum into the stored value. On any
     * error the store keeps the values it had before the call. An interrupt does not stop
     * a blocking call (see {@link KVStore}).
     *
     * @param keys the keys
     * @param values the values, one per key
     * @param priority MXNet's priority (see {@link KVStore}): orders queued calls, never
     *     results
     * @return the store, or the call's future
     * @throws KVStoreException {@code KEY_NOT_INITIALIZED}, {@code SHAPE_MISMATCH},
     *     {@code DTYPE_MISMATCH}, {@code LENGTH_MISMATCH}, {@code BACKEND} (the updater
     *     threw: it is the cause), {@code DISPOSED}
     */
    R push(String[] keys, NDArray[] values, int priority);

    /**
     * Pushes {@code value} to {@code key}: {@link #push(String, NDArray[], int)} of one
     * array at priority 0.
     *
     * @param key the key
     * @param value the value
     * @return the store, or the call's future
     */
    default R push(String key, NDArray value) {
        return push(key, one(value, "value"), 0);
    }

    /**
     * {@link #push(String, NDArray[], int)} at priority 0.
     *
     * @param key the key
     * @param values the values, summed into one update
     * @return the store, or the call's future
     */
    default R push(String key, NDArray[] values) {
        return push(key, values, 0);
    }

    /**
     * {@link #push(String[], NDArray[], int)} at priority 0.
     *
     * @param keys the keys
     * @param values the values, one per key
     * @return the store, or the call's future
     */
    default R push(String[] keys, NDArray[] values) {
        return push(keys, values, 0);
    }

    /**
     * Copies the value of {@code key} into every out (<a href="#forms">one key, many
     * arrays</a>).
     *
     * @param key the key
     * @param outs the outs, each of the key's shape and dtype
     * @param priority MXNet's priority (see {@link KVStore}): orders queued calls, never
     *     results
     * @return the store, or the call's future
     * @throws KVStoreException as {@link #pull(String[], NDArray[], int)}
     */
    R pull(String key, NDArray[] outs, int priority);

    /**
     * Copies the value of {@code keys[i]} into {@code outs[i]}. Pull does not convert: an
     * out of another dtype is an error (use {@link NDArray#asType(DType)}). On error no out
     * is written. An interrupt does not stop a blocking pull: it returns once the outs are
     * written, the thread's interrupt status still set (see {@link KVStore}; the
     * interruptible wait is {@code async().pull(keys, outs, priority).get()}).
     *
     * @param keys the keys
     * @param outs the outs, one per key
     * @param priority MXNet's priority (see {@link KVStore}): orders queued calls, never
     *     results
     * @return the store, or the call's future
     * @throws KVStoreException {@code KEY_NOT_INITIALIZED}, {@code SHAPE_MISMATCH},
     *     {@code DTYPE_MISMATCH}, {@code LENGTH_MISMATCH}, {@code DISPOSED}
     */
    R pull(String[] keys, NDArray[] outs, int priority);

    /**
     * Pulls {@code key}'s value into {@code out}: {@link #pull(String, NDArray[], int)} of
     * one out at priority 0.
     *
     * @param key the key
     * @param out the out
     * @return the store, or the call's future
     */
    default R pull(String key, NDArray out) {
        return pull(key, one(out, "out"), 0);
    }

    /**
     * {@link #pull(String, NDArray[], int)} at priority 0.
     *
     * @param key the key
     * @param outs the outs
     * @return the store, or the call's future
     */
    default R pull(String key, NDArray[] outs) {
        return pull(key, outs, 0);
    }

    /**
     * {@link #pull(String[], NDArray[], int)} at priority 0.
     *
     * @param keys the keys
     * @param outs the outs, one per key
     * @return the store, or the call's future
     */
    default R pull(String[] keys, NDArray[] outs) {
        return pull(keys, outs, 0);
    }

    /**
     * Pushes {@code values} (summed) to {@code key}, then pulls the result into every out,
     * as one step (<a href="#forms">one key, many arrays</a>).
     *
     * @param key the key
     * @param values the values
     * @param outs the outs (the values themselves, to write the result back into them)
     * @param priority MXNet's priority (see {@link KVStore}): orders queued calls, never
     *     results
     * @return the store, or the call's future
     * @throws KVStoreException as {@link #pushpull(String[], NDArray[], NDArray[], int)}
     */
    R pushpull(String key, NDArray[] values, NDArray[] outs, int priority);

    /**
     * Pushes {@code values[i]} to {@code keys[i]}, then pulls {@code keys[i]} into
     * {@code outs[i]}, as one step: no other push to these keys comes in between. On
     * error nothing changes. Passing the values as the outs writes the results back into
     * them.
     *
     * @param keys the keys
     * @param values the values, one per key
     * @param outs the outs, one per key
     * @param priority MXNet's priority (see {@link KVStore}): orders queued calls, never
     *     results
     * @return the store, or the call's future
     * @throws KVStoreException as {@link #push(String[], NDArray[], int)} and
     *     {@link #pull(String[], NDArray[], int)}
     */
    R pushpull(String[] keys, NDArray[] values, NDArray[] outs, int priority);

    /**
     * {@link #pushpull(String, NDArray[], NDArray[], int)} of one value and one out at
     * priority 0.
     *
     * @param key the key
     * @param value the value
     * @param out the out
     * @return the store, or the call's future
     */
    default R pushpull(String key, NDArray value, NDArray out) {
        Objects.requireNonNull(key, "key");
        return pushpull(key, one(value, "value"), one(out, "out"), 0);
    }

    /**
     * {@link #pushpull(String, NDArray[], NDArray[], int)} at priority 0.
     *
     * @param key the key
     * @param values the values
     * @param outs the outs
     * @return the store, or the call's future
     */
    default R pushpull(String key, NDArray[] values, NDArray[] outs) {
        return pushpull(key, values, outs, 0);
    }

    /**
     * {@link #pushpull(String[], NDArray[], NDArray[], int)} at priority 0.
     *
     * @param keys the keys
     * @param values the values, one per key
     * @param outs the outs, one per key
     * @return the store, or the call's future
     */
    default R pushpull(String[] keys, NDArray[] values, NDArray[] outs) {
        return pushpull(keys, values, outs, 0);
    }

    /**
     * Pushes {@code value} to {@code key} and writes the result back into it.
     *
     * @param key the key
     * @param value the value, and the out
     * @return the store, or the call's future
     */
    default R pushpull(String key, NDArray value) {
        return pushpull(key, value, value);
    }

    /**
     * Pushes {@code values} to {@code key} and writes the result back into each of them.
     *
     * @param key the key
     * @param values the values, and the outs
     * @return the store, or the call's future
     */
    default R pushpull(String key, NDArray[] values) {
        return pushpull(key, values, values, 0);
    }

    /**
     * Pushes {@code values[i]} to {@code keys[i]} and writes each key's result back into
     * its values.
     *
     * @param keys the keys
     * @param values the values, one per key, and the outs
     * @return the store, or the call's future
     */
    default R pushpull(String[] keys, NDArray[] values) {
        return pushpull(keys, values, values, 0);
    }

    /**
     * Initialises {@code key} with {@code value}, then pulls it into every out
     * (<a href="#forms">one key, many arrays</a>: many outs, one value).
     *
     * @param key the key
     * @param value the initial value
     * @param outs the outs
     * @param priority MXNet's priority (see {@link KVStore}): orders queued calls, never
     *     results
     * @return the store, or the call's future
     * @throws KVStoreException as {@link #broadcast(String[], NDArray[], NDArray[], int)}
     */
    R broadcast(String key, NDArray value, NDArray[] outs, int priority);

    /**
     * Initialises {@code keys[i]} with {@code values[i]}, then pulls {@code keys[i]} into
     * {@code outs[i]}. Outs are checked against their values before anything is stored.
     *
     * @param keys the keys
     * @param values the initial values, one per key
     * @param outs the outs, one per key
     * @param priority MXNet's priority (see {@link KVStore}): orders queued calls, never
     *     results
     * @return the store, or the call's future
     * @throws KVStoreException {@code ALREADY_INITIALIZED}, {@code SHAPE_MISMATCH},
     *     {@code DTYPE_MISMATCH}, {@code LENGTH_MISMATCH}, {@code DISPOSED}
     */
    R broadcast(String[] keys, NDArray[] values, NDArray[] outs, int priority);

    /**
     * {@link #broadcast(String, NDArray, NDArray[], int)} of one out at priority 0.
     *
     * @param key the key
     * @param value the initial value
     * @param out the out
     * @return the store, or the call's future
     */
    default R broadcast(String key, NDArray value, NDArray out) {
        Objects.requireNonNull(key, "key");
        Objects.requireNonNull(value, "value");
        return broadcast(key, value, one(out, "out"), 0);
    }

    /**
     * {@link #broadcast(String, NDArray, NDArray[], int)} at priority 0.
     *
     * @param key the key
     * @param value the initial value
     * @param outs the outs
     * @return the store, or the call's future
     */
    default R broadcast(String key, NDArray value, NDArray[] outs) {
        return broadcast(key, value, outs, 0);
    }

    /**
     * {@link #broadcast(String[], NDArray[], NDArray[], int)} at priority 0.
     *
     * @param keys the keys
     * @param values the initial values, one per key
     * @param outs the outs, one per key
     * @return the store, or the call's future
     */
    default R broadcast(String[] keys, NDArray[] values, NDArray[] outs) {
        return broadcast(keys, values, outs, 0);
    }
}
