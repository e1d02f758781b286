package io.github.kvstore;

import java.lang.ref.Cleaner;
import java.lang.ref.Reference;
import java.util.Arrays;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.locks.ReentrantLock;

/**
 * A key-value store of arrays, as MXNet's {@code KVStore}: {@link #init(String, NDArray)}
 * keys, {@link #push(String, NDArray)} values (summed, then merged into the stored value by
 * the {@link Updater} or the {@link Optimizer}; by default the sum replaces it),
 * {@link #pull(String, NDArray)} the stored values into outs.
 *
 * <p>Every operation comes in MXNet's list forms: one key and one array; one key and many
 * arrays (pushed arrays are summed, pulled outs all receive the value); and parallel
 * arrays of keys and arrays, where a repeated key gets the sum of its arrays in one update
 * ({@code push(new String[] {"3", "3", "3"}, ones)} stores 3, not 1). Keys and arrays of
 * different lengths are {@link KVStoreException.Code#LENGTH_MISMATCH}. {@code priority} is
 * accepted as in MXNet: every call completes before it returns, so it changes no result.
 * Push always copies: the store never keeps a caller's array.
 *
 * <p>Mutating methods return {@code this} for chaining. A store is safe to use from many
 * threads (calls on one key are serialised, calls on different keys run in parallel). It
 * holds native memory until {@link #close()}; a {@link Cleaner} frees stores that become
 * unreachable unclosed. After {@code close()} every call throws {@link KVStoreException}
 * with code {@link KVStoreException.Code#DISPOSED}; calls already running finish.
 *
 * <p>A null argument is a {@link NullPointerException} naming the parameter
 * ({@code "keys"}, or {@code "keys[2]"} for an element), thrown before any native call;
 * the one exception is {@link #setUpdater(Updater)}, where {@code null} means "back to
 * the default". Errors of the store itself are {@link KVStoreException}s: catch one and
 * switch on its {@link KVStoreException#code()}.
 *
 * <p>{@link Thread#interrupt()} does not stop a blocking call (nor {@link #waitAll()}):
 * one that waits for earlier calls on its keys returns when it is done, with the thread's
 * interrupt status still set, as {@link CompletableFuture#join()} and the streams of
 * {@code java.io} do. It could not give up honestly: the native store either runs the
 * call at once on the calling thread or queues it and waits inside the native call, where
 * no interrupt reaches, and a queued call always runs. For a wait that an interrupt ends,
 * make the non-blocking call and wait for its future: {@code pullAsync(keys, outs).get()}
 * throws {@link InterruptedException}, and the call still takes effect (its outs stay
 * pending until it wrote them).
 *
 * <pre>{@code
 * try (KVStore kv = KVStore.create("local");
 *      NDArray two = NDArray.full(new int[] {2, 3}, 2.0);
 *      NDArray out = NDArray.zeros(2, 3)) {
 *     kv.init("3", two).push("3", two).pull("3", out);   // out == 2
 * }
 * }</pre>
 */
public final class KVStore extends NativeObject implements AutoCloseable {
    static {
        NativeLibrary.load();
    }

    /** How stores are freed, and how many were (for tests). */
    private static final Kind KIND = new Kind("KVStore", KVStore::nFree);
    /** What {@link #toString()} says once the store is closed. */
    private static final String CLOSED_FORM = "#kvstore/store {:closed true}";

    /**
     * How many {@link Updater} calls are running on each thread (see {@link #updaterDepth()});
     * a plain ThreadLocal, filled on first use, so that no lambda or extra class has to be
     * linked during an updater call on a thread short of stack.
     */
    private static final ThreadLocal<int[]> UPDATER_DEPTH = new ThreadLocal<>();

    /**
     * The installed updater. The native store holds it only weakly, so this field is what
     * keeps it alive, for as long as the store is reachable: an updater that captures the
     * store forms a cycle the garbage collector can free, not a GC root. Written only under
     * {@link #updaterLock}, after the native store installed the same updater.
     */
    private volatile Updater updater;
    /**
     * Serialises {@link #setUpdater}, {@link #setOptimizer}: each installs natively and then
     * writes {@link #updater}, so the field always ends up holding what the native store has.
     */
    private final ReentrantLock updaterLock = new ReentrantLock();

    private KVStore(long handle) {
        super(KIND, handle, 0, true);
    }

    /**
     * Same as {@link #create(String)} with kind {@code "local"}.
     *
     * @return the store
     */
    public static KVStore create() {
        return create("local");
    }

    /**
     * A store of the given kind: {@code "local"} or {@code "device"} (case-insensitive; also
     * MXNet's {@code local_update_cpu}, {@code local_allreduce_cpu},
     * {@code local_allreduce_device}); with MPI support ({@link #mpiSupported()}), also
     * {@code "dist_sync"} (and {@code "dist"}, {@code "dist_sync_device"}): a store shared by
     * every process of the MPI job ({@code mpirun -np 2 java ...}). A program that creates
     * one must call {@link #finalizeMpi()} on every rank at its end.
     *
     * @param kind the kind
     * @return the store
     * @throws KVStoreException {@code UNSUPPORTED} for {@code dist_async}, {@code nccl}, and
     *     {@code dist_sync} in a build without MPI support; {@code UNKNOWN_STORE_KIND} for any
     *     other name; {@code BACKEND} if MPI cannot be initialised
     */
    public static KVStore create(String kind) {
        Objects.requireNonNull(kind, "kind");
        return new KVStore(nCreate(kind));
    }

    /**
     * The version of the library: the native library's, which is the jar's and the Rust
     * crates' (one workspace version for all), for example {@code "0.1.0"}.
     *
     * @return the version
     */
    public static String version() {
        return nVersion();
    }

    /**
     * Whether this build of the native library supports {@code dist_sync} over MPI: true in
     * {@code target/kvstore-mpi.jar} ({@code make jar FEATURES=mpi}), false in the default
     * jar, which needs no MPI installed.
     *
     * @return whether {@code create("dist_sync")} can work
     */
    public static boolean mpiSupported() {
        return nMpiSupported();
    }

    /**
     * Ends MPI at the end of a {@code dist_sync} program: call it once on every rank, after
     * the last store call (a {@code dist_sync} store fails with {@code BACKEND} after it).
     *
     * <p>Fail-stop: a process that created a {@code dist_sync} store and exits without this
     * call, normally or through an exception, aborts the whole MPI job, so that the other
     * ranks never wait forever in a push for a worker that is gone. There is deliberately
     * no shutdown hook that finalises: a JVM cannot tell a failing exit from a clean one.
     *
     * @throws KVStoreException {@code BACKEND} if no {@code dist_sync} store initialised MPI
     *     in this process, or MPI is already finalised; does nothing in a build without MPI
     *     support
     */
    public static void finalizeMpi() {
        nFinalizeMpi();
    }

    /** Native stores freed so far, explicitly or by the Cleaner. */
    static long freedCount() {
        return KIND.freedCount();
    }

    /**
     * The count of {@link Updater} calls running on this thread, as a mutable cell that
     * {@code Updater.invoke} increments around each call.
     */
    static int[] updaterDepth() {
        int[] depth = UPDATER_DEPTH.get();
        if (depth == null) {
            depth = new int[1];
            UPDATER_DEPTH.set(depth);
        }
        return depth;
    }

    // ----- argument conversion: every null is found before any native call -----

    private static String[] keys(String[] keys, String name) {
        Objects.requireNonNull(keys, name);
        for (int i = 0; i < keys.length; i++) {
            Objects.requireNonNull(keys[i], name + "[" + i + "]");
        }
        return keys;
    }

    private static String[] repeat(String key, String keyName, NDArray[] arrays, String arraysName) {
        Objects.requireNonNull(key, keyName);
        Objects.requireNonNull(arrays, arraysName);
        String[] keys = new String[arrays.length];
        Arrays.fill(keys, key);
        return keys;
    }

    private static void checkArrays(NDArray[] arrays, String name) {
        Objects.requireNonNull(arrays, name);
        for (int i = 0; i < arrays.length; i++) {
            Objects.requireNonNull(arrays[i], name + "[" + i + "]");
        }
    }

    /** The handles of {@code arrays}; {@code DISPOSED} for a closed one. Nulls were checked. */
    private static long[] handles(NDArray[] arrays, String name) {
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

    private static NDArray[] one(NDArray array, String name) {
        return new NDArray[] {Objects.requireNonNull(array, name)};
    }

    private static String[] one(String key, String name) {
        return new String[] {Objects.requireNonNull(key, name)};
    }

    // ----- the store's kind and place -----

    /**
     * The kind, lower-cased (MXNet's {@code type}).
     *
     * @return for example {@code "local"}
     * @throws KVStoreException {@code DISPOSED}
     */
    public String type() {
        try {
            return nType(handle());
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * This worker's rank: 0 for a local store.
     *
     * @return the rank
     * @throws KVStoreException {@code DISPOSED}
     */
    public int rank() {
        try {
            return nRank(handle());
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * The number of workers: 1 for a local store.
     *
     * @return the number of workers
     * @throws KVStoreException {@code DISPOSED}
     */
    public int numWorkers() {
        try {
            return nNumWorkers(handle());
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * The keys of the store, in the order they were first initialised.
     *
     * @return a new array of the keys (empty for a new store)
     * @throws KVStoreException {@code DISPOSED}
     */
    public String[] keys() {
        try {
            return nKeys(handle());
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    // ----- init -----

    /**
     * Initialises {@code key} with a copy of {@code value}.
     *
     * @param key the key
     * @param value the initial value
     * @return this store
     * @throws KVStoreException {@code ALREADY_INITIALIZED}, {@code DEVICE_UNAVAILABLE},
     *     {@code DISPOSED}
     */
    public KVStore init(String key, NDArray value) {
        return init(one(key, "key"), one(value, "value"));
    }

    /**
     * Initialises each key with a copy of its value. All or nothing: on error no key of the
     * call is added.
     *
     * @param keys the keys, each at most once
     * @param values the values, one per key
     * @return this store
     * @throws KVStoreException {@code ALREADY_INITIALIZED} (also for a key twice in
     *     {@code keys}), {@code LENGTH_MISMATCH}, {@code DISPOSED}
     */
    public KVStore init(String[] keys, NDArray[] values) {
        keys(keys, "keys");
        checkArrays(values, "values");
        long[] vs = handles(values, "values");
        try {
            nInit(handle(), keys, vs);
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(values);
        }
        return this;
    }

    // ----- push -----

    /**
     * Same as {@link #push(String, NDArray, int)} with priority 0.
     *
     * @param key the key
     * @param value the value
     * @return this store
     */
    public KVStore push(String key, NDArray value) {
        return push(key, value, 0);
    }

    /**
     * Pushes one value to {@code key}.
     *
     * @param key the key
     * @param value the value
     * @param priority MXNet's priority: orders queued calls (higher first), never results
     * @return this store
     * @throws KVStoreException as {@link #push(String[], NDArray[], int)}
     */
    public KVStore push(String key, NDArray value, int priority) {
        return push(key, one(value, "value"), priority);
    }

    /**
     * Same as {@link #push(String, NDArray[], int)} with priority 0.
     *
     * @param key the key
     * @param values the values, for example one per device
     * @return this store
     */
    public KVStore push(String key, NDArray[] values) {
        return push(key, values, 0);
    }

    /**
     * Pushes many values to {@code key}: they are summed, left to right, into one update.
     *
     * @param key the key
     * @param values the values, for example one per device
     * @param priority MXNet's priority: orders queued calls (higher first), never results
     * @return this store
     * @throws KVStoreException as {@link #push(String[], NDArray[], int)}
     */
    public KVStore push(String key, NDArray[] values, int priority) {
        Objects.requireNonNull(key, "key");
        checkArrays(values, "values");
        long[] vs = handles(values, "values");
        try {
            nPushKey(handle(), key, vs, priority);
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(values);
        }
        return this;
    }

    /**
     * Same as {@link #push(String[], NDArray[], int)} with priority 0.
     *
     * @param keys the keys
     * @param values the values, one per key
     * @return this store
     */
    public KVStore push(String[] keys, NDArray[] values) {
        return push(keys, values, 0);
    }

    /**
     * Pushes {@code values[i]} to {@code keys[i]}: for each distinct key, its values are
     * summed left to right, then the updater merges the sum into the stored value. On any
     * error the store keeps the values it had before the call. An interrupt does not stop
     * it (see the class doc).
     *
     * @param keys the keys
     * @param values the values, one per key
     * @param priority MXNet's priority: orders queued calls (higher first), never results
     * @return this store
     * @throws KVStoreException {@code KEY_NOT_INITIALIZED}, {@code SHAPE_MISMATCH},
     *     {@code DTYPE_MISMATCH}, {@code LENGTH_MISMATCH}, {@code BACKEND} (the updater
     *     threw: it is the cause), {@code DISPOSED}
     */
    public KVStore push(String[] keys, NDArray[] values, int priority) {
        keys(keys, "keys");
        checkArrays(values, "values");
        long[] vs = handles(values, "values");
        try {
            nPush(handle(), keys, vs, priority);
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(values);
        }
        return this;
    }

    // ----- pull -----

    /**
     * The value of {@code key}, as a new array on {@code cpu(0)} of the value's shape and
     * dtype (the other forms of pull write into arrays the caller made). The caller owns
     * the array: close it when done.
     *
     * @param key the key
     * @return a new array holding the value
     * @throws KVStoreException {@code KEY_NOT_INITIALIZED}, {@code DISPOSED}
     */
    public NDArray pull(String key) {
        Objects.requireNonNull(key, "key");
        try {
            return new NDArray(nPullNew(handle(), key, 0));
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * Same as {@link #pull(String, NDArray, int)} with priority 0.
     *
     * @param key the key
     * @param out an array of the key's shape and dtype
     * @return this store
     */
    public KVStore pull(String key, NDArray out) {
        return pull(key, out, 0);
    }

    /**
     * Copies the value of {@code key} into {@code out}.
     *
     * @param key the key
     * @param out an array of the key's shape and dtype
     * @param priority MXNet's priority: orders queued calls (higher first), never results
     * @return this store
     * @throws KVStoreException as {@link #pull(String[], NDArray[], int)}
     */
    public KVStore pull(String key, NDArray out, int priority) {
        return pull(key, one(out, "out"), priority);
    }

    /**
     * Same as {@link #pull(String, NDArray[], int)} with priority 0.
     *
     * @param key the key
     * @param outs the outs
     * @return this store
     */
    public KVStore pull(String key, NDArray[] outs) {
        return pull(key, outs, 0);
    }

    /**
     * Copies the value of {@code key} into every out.
     *
     * @param key the key
     * @param outs the outs
     * @param priority MXNet's priority: orders queued calls (higher first), never results
     * @return this store
     * @throws KVStoreException as {@link #pull(String[], NDArray[], int)}
     */
    public KVStore pull(String key, NDArray[] outs, int priority) {
        Objects.requireNonNull(key, "key");
        checkArrays(outs, "outs");
        long[] os = handles(outs, "outs");
        try {
            nPullKey(handle(), key, os, priority);
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(outs);
        }
        return this;
    }

    /**
     * Same as {@link #pull(String[], NDArray[], int)} with priority 0.
     *
     * @param keys the keys
     * @param outs the outs, one per key
     * @return this store
     */
    public KVStore pull(String[] keys, NDArray[] outs) {
        return pull(keys, outs, 0);
    }

    /**
     * Copies the value of {@code keys[i]} into {@code outs[i]}. Pull does not convert: an
     * out of another dtype is an error (use {@link NDArray#asType(DType)}). On error no out
     * is written. An interrupt does not stop it: it returns once the outs are written,
     * the thread's interrupt status still set (see the class doc; the interruptible wait
     * is {@code pullAsync(keys, outs).get()}).
     *
     * @param keys the keys
     * @param outs the outs, one per key
     * @param priority MXNet's priority: orders queued calls (higher first), never results
     * @return this store
     * @throws KVStoreException {@code KEY_NOT_INITIALIZED}, {@code SHAPE_MISMATCH},
     *     {@code DTYPE_MISMATCH}, {@code LENGTH_MISMATCH}, {@code DISPOSED}
     */
    public KVStore pull(String[] keys, NDArray[] outs, int priority) {
        keys(keys, "keys");
        checkArrays(outs, "outs");
        long[] os = handles(outs, "outs");
        try {
            nPull(handle(), keys, os, priority);
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(outs);
        }
        return this;
    }

    // ----- pushpull -----

    private KVStore pushpull0(String[] keys, NDArray[] values, String[] outKeys, NDArray[] outs, int priority) {
        long[] vs = handles(values, "values");
        long[] os = handles(outs, "outs");
        try {
            nPushPull(handle(), keys, vs, outKeys, os, priority);
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(values);
            Reference.reachabilityFence(outs);
        }
        return this;
    }

    /**
     * Same as {@link #pushpull(String, NDArray, NDArray, int)} with priority 0.
     *
     * @param key the key
     * @param value the value
     * @param out the out
     * @return this store
     */
    public KVStore pushpull(String key, NDArray value, NDArray out) {
        return pushpull(key, value, out, 0);
    }

    /**
     * Pushes {@code value} to {@code key}, then pulls the result into {@code out}, as one
     * step (no other push to the key can come in between).
     *
     * @param key the key
     * @param value the value
     * @param out the out
     * @param priority MXNet's priority: orders queued calls (higher first), never results
     * @return this store
     * @throws KVStoreException as {@link #push(String[], NDArray[], int)} and
     *     {@link #pull(String[], NDArray[], int)}; on error nothing changes
     */
    public KVStore pushpull(String key, NDArray value, NDArray out, int priority) {
        String[] k = one(key, "key");
        NDArray[] v = one(value, "value");
        NDArray[] o = one(out, "out");
        return pushpull0(k, v, k, o, priority);
    }

    /**
     * Same as {@link #pushpull(String, NDArray[], NDArray[], int)} with priority 0.
     *
     * @param key the key
     * @param values the values
     * @param outs the outs
     * @return this store
     */
    public KVStore pushpull(String key, NDArray[] values, NDArray[] outs) {
        return pushpull(key, values, outs, 0);
    }

    /**
     * Pushes {@code values} (summed) to {@code key}, then pulls the result into every out.
     *
     * @param key the key
     * @param values the values
     * @param outs the outs
     * @param priority MXNet's priority: orders queued calls (higher first), never results
     * @return this store
     * @throws KVStoreException as {@link #pushpull(String, NDArray, NDArray, int)}
     */
    public KVStore pushpull(String key, NDArray[] values, NDArray[] outs, int priority) {
        String[] valueKeys = repeat(key, "key", values, "values");
        String[] outKeys = repeat(key, "key", outs, "outs");
        checkArrays(values, "values");
        checkArrays(outs, "outs");
        return pushpull0(valueKeys, values, outKeys, outs, priority);
    }

    /**
     * Same as {@link #pushpull(String[], NDArray[], NDArray[], int)} with priority 0.
     *
     * @param keys the keys
     * @param values the values, one per key
     * @param outs the outs, one per key
     * @return this store
     */
    public KVStore pushpull(String[] keys, NDArray[] values, NDArray[] outs) {
        return pushpull(keys, values, outs, 0);
    }

    /**
     * Pushes {@code values[i]} to {@code keys[i]}, then pulls {@code keys[i]} into
     * {@code outs[i]}.
     *
     * @param keys the keys
     * @param values the values, one per key
     * @param outs the outs, one per key
     * @param priority MXNet's priority: orders queued calls (higher first), never results
     * @return this store
     * @throws KVStoreException as {@link #pushpull(String, NDArray, NDArray, int)}
     */
    public KVStore pushpull(String[] keys, NDArray[] values, NDArray[] outs, int priority) {
        keys(keys, "keys");
        checkArrays(values, "values");
        checkArrays(outs, "outs");
        return pushpull0(keys, values, keys, outs, priority);
    }

    /**
     * Same as {@link #pushpull(String, NDArray, int)} with priority 0.
     *
     * @param key the key
     * @param value the value, overwritten with the result
     * @return this store
     */
    public KVStore pushpull(String key, NDArray value) {
        return pushpull(key, value, value, 0);
    }

    /**
     * Pushes {@code value} to {@code key}, then writes the result back into {@code value}
     * (MXNet's {@code pushpull} without {@code out}).
     *
     * @param key the key
     * @param value the value, overwritten with the result
     * @param priority MXNet's priority: orders queued calls (higher first), never results
     * @return this store
     * @throws KVStoreException as {@link #pushpull(String, NDArray, NDArray, int)}
     */
    public KVStore pushpull(String key, NDArray value, int priority) {
        return pushpull(key, value, value, priority);
    }

    /**
     * Same as {@link #pushpull(String, NDArray[], int)} with priority 0.
     *
     * @param key the key
     * @param values the values, overwritten with the result
     * @return this store
     */
    public KVStore pushpull(String key, NDArray[] values) {
        return pushpull(key, values, values, 0);
    }

    /**
     * Pushes {@code values} (summed) to {@code key}, then writes the result back into every
     * one of them.
     *
     * @param key the key
     * @param values the values, overwritten with the result
     * @param priority MXNet's priority: orders queued calls (higher first), never results
     * @return this store
     * @throws KVStoreException as {@link #pushpull(String, NDArray, NDArray, int)}
     */
    public KVStore pushpull(String key, NDArray[] values, int priority) {
        return pushpull(key, values, values, priority);
    }

    /**
     * Same as {@link #pushpull(String[], NDArray[], int)} with priority 0.
     *
     * @param keys the keys
     * @param values the values, one per key, overwritten with the results
     * @return this store
     */
    public KVStore pushpull(String[] keys, NDArray[] values) {
        return pushpull(keys, values, values, 0);
    }

    /**
     * Pushes {@code values[i]} to {@code keys[i]}, then writes each key's result back into
     * its values.
     *
     * @param keys the keys
     * @param values the values, one per key, overwritten with the results
     * @param priority MXNet's priority: orders queued calls (higher first), never results
     * @return this store
     * @throws KVStoreException as {@link #pushpull(String, NDArray, NDArray, int)}
     */
    public KVStore pushpull(String[] keys, NDArray[] values, int priority) {
        return pushpull(keys, values, values, priority);
    }

    // ----- broadcast -----

    /**
     * Same as {@link #broadcast(String, NDArray, NDArray, int)} with priority 0.
     *
     * @param key the key
     * @param value the initial value
     * @param out the out
     * @return this store
     */
    public KVStore broadcast(String key, NDArray value, NDArray out) {
        return broadcast(key, value, out, 0);
    }

    /**
     * Initialises {@code key} with {@code value}, then pulls it into {@code out}.
     *
     * @param key the key
     * @param value the initial value
     * @param out the out
     * @param priority MXNet's priority: orders queued calls (higher first), never results
     * @return this store
     * @throws KVStoreException as {@link #broadcast(String[], NDArray[], NDArray[], int)}
     */
    public KVStore broadcast(String key, NDArray value, NDArray out, int priority) {
        String[] k = one(key, "key");
        return broadcast0(k, one(value, "value"), k, one(out, "out"), priority);
    }

    /**
     * Same as {@link #broadcast(String, NDArray, NDArray[], int)} with priority 0.
     *
     * @param key the key
     * @param value the initial value
     * @param outs the outs
     * @return this store
     */
    public KVStore broadcast(String key, NDArray value, NDArray[] outs) {
        return broadcast(key, value, outs, 0);
    }

    /**
     * Initialises {@code key} with {@code value}, then pulls it into every out.
     *
     * @param key the key
     * @param value the initial value
     * @param outs the outs
     * @param priority MXNet's priority: orders queued calls (higher first), never results
     * @return this store
     * @throws KVStoreException as {@link #broadcast(String[], NDArray[], NDArray[], int)}
     */
    public KVStore broadcast(String key, NDArray value, NDArray[] outs, int priority) {
        String[] k = one(key, "key");
        NDArray[] v = one(value, "value");
        String[] outKeys = repeat(key, "key", outs, "outs");
        checkArrays(outs, "outs");
        return broadcast0(k, v, outKeys, outs, priority);
    }

    /**
     * Same as {@link #broadcast(String[], NDArray[], NDArray[], int)} with priority 0.
     *
     * @param keys the keys
     * @param values the initial values, one per key
     * @param outs the outs, one per key
     * @return this store
     */
    public KVStore broadcast(String[] keys, NDArray[] values, NDArray[] outs) {
        return broadcast(keys, values, outs, 0);
    }

    /**
     * Initialises {@code keys[i]} with {@code values[i]}, then pulls {@code keys[i]} into
     * {@code outs[i]}. Outs are checked against their values before anything is stored.
     *
     * @param keys the keys
     * @param values the initial values, one per key
     * @param outs the outs, one per key
     * @param priority MXNet's priority: orders queued calls (higher first), never results
     * @return this store
     * @throws KVStoreException {@code ALREADY_INITIALIZED}, {@code SHAPE_MISMATCH},
     *     {@code DTYPE_MISMATCH}, {@code LENGTH_MISMATCH}, {@code DISPOSED}
     */
    public KVStore broadcast(String[] keys, NDArray[] values, NDArray[] outs, int priority) {
        keys(keys, "keys");
        checkArrays(values, "values");
        checkArrays(outs, "outs");
        return broadcast0(keys, values, keys, outs, priority);
    }

    private KVStore broadcast0(String[] keys, NDArray[] values, String[] outKeys, NDArray[] outs, int priority) {
        long[] vs = handles(values, "values");
        long[] os = handles(outs, "outs");
        try {
            nBroadcast(handle(), keys, vs, outKeys, os, priority);
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(values);
            Reference.reachabilityFence(outs);
        }
        return this;
    }

    // ----- non-blocking calls -----

    private static final int OP_PUSH = 0;
    private static final int OP_PULL = 1;
    private static final int OP_PUSHPULL = 2;
    private static final int OP_BROADCAST = 3;
    private static final int OP_PUSH_KEY = 4;
    private static final int OP_PULL_KEY = 5;
    private static final String[] NO_KEYS = new String[0];
    private static final NDArray[] NO_ARRAYS = new NDArray[0];

    /**
     * The future of a non-blocking call. A {@code dist_sync} store may hold a small push
     * or pushpull back, to run fused with the calls made after it (the README's
     * "Non-blocking calls"; {@code KVSTORE_FUSE_BYTES}): {@code get}, {@code join},
     * {@code getNow} and {@code isDone} release it first, as {@code Pending::wait} does
     * in Rust, so that waiting for it never waits for a later call. Dependent stages and
     * {@link CompletableFuture#allOf} do not: wait for one of the calls, or call
     * {@link #waitAll()}, before waiting for those. Like every call of a
     * {@code dist_sync} store, a wait must come at the same point of the calls on every
     * worker. A thread in {@code get} or {@code join} has its future completed as soon
     * as the call finishes; dependents of futures that no thread waits for may run up
     * to 50 microseconds later, as the completer takes finished calls in batches.
     * Dependents run on the completer's threads ({@link Completer}), where they may wait.
     * {@code cancel} is refused: a submitted call is never withdrawn.
     */
    private static final class CallFuture extends CompletableFuture<Void> {
        /** The call's id, once registered (-1 until then). */
        volatile long id = -1;

        private void release() {
            long call = id;
            if (call >= 0 && !super.isDone()) {
                nRelease(call);
            }
        }

        /**
         * Before a wait for the future: releases the call, and unless the future is done
         * counts this thread among those waiting ({@link Completer#startWaiting()});
         * returns whether it did, for {@link #endWait}.
         */
        private boolean startWait() {
            release();
            if (super.isDone()) {
                return false;
            }
            Completer.startWaiting();
            return true;
        }

        private static void endWait(boolean counted) {
            if (counted) {
                Completer.stopWaiting();
            }
        }

        @Override
        public Void get() throws InterruptedException, ExecutionException {
            boolean counted = startWait();
            try {
                return super.get();
            } finally {
                endWait(counted);
            }
        }

        @Override
        public Void get(long timeout, TimeUnit unit)
                throws InterruptedException, ExecutionException, TimeoutException {
            boolean counted = startWait();
            try {
                return super.get(timeout, unit);
            } finally {
                endWait(counted);
            }
        }

        @Override
        public Void join() {
            boolean counted = startWait();
            try {
                return super.join();
            } finally {
                endWait(counted);
            }
        }

        @Override
        public Void getNow(Void valueIfAbsent) {
            release();
            return super.getNow(valueIfAbsent);
        }

        @Override
        public boolean isDone() {
            release();
            return super.isDone();
        }

        /**
         * Refuses, whatever {@code mayInterruptIfRunning} says, and returns false: a
         * submitted call is never withdrawn (a queued call runs, and a running one
         * finishes), so a cancelled future would report a call that still takes effect.
         * The future completes with the call.
         */
        @Override
        public boolean cancel(boolean mayInterruptIfRunning) {
            return false;
        }
    }

    /**
     * Submits a call to the store's engine: the future completes when the call is done,
     * exceptionally with the {@link KVStoreException} the blocking call would throw.
     * {@code key} is the one key of {@code OP_PUSH_KEY} and {@code OP_PULL_KEY} (whose
     * {@code keys} and {@code outKeys} are not read), null for the other calls.
     */
    private CompletableFuture<Void> submit(
            int op, String key, String[] keys, NDArray[] values, String[] outKeys, NDArray[] outs, int priority) {
        long[] vs = handles(values, "values");
        long[] os = handles(outs, "outs");
        CallFuture future = new CallFuture();
        long id = Completer.register(future);
        future.id = id;
        try {
            if (key != null) {
                nSubmitKey(handle(), id, op, key, op == OP_PUSH_KEY ? vs : os, priority);
            } else {
                nSubmit(handle(), id, op, keys, vs, outKeys, os, priority);
            }
        } catch (KVStoreException e) {
            // Found before anything was queued (a closed store, a stale array): the same
            // exception, through the future.
            Completer.forget(id);
            future.completeExceptionally(e);
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(values);
            Reference.reachabilityFence(outs);
        }
        return future;
    }

    /**
     * Same as {@link #pushAsync(String[], NDArray[], int)} for one value of one key,
     * priority 0.
     *
     * @param key the key
     * @param value the value
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pushAsync(String key, NDArray value) {
        return pushAsync(key, value, 0);
    }

    /**
     * Same as {@link #pushAsync(String[], NDArray[], int)} for one value of one key.
     *
     * @param key the key
     * @param value the value
     * @param priority orders calls ready at the same time (higher first)
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pushAsync(String key, NDArray value, int priority) {
        return pushAsync(key, one(value, "value"), priority);
    }

    /**
     * Same as {@link #pushAsync(String, NDArray[], int)} with priority 0.
     *
     * @param key the key
     * @param values the values, summed
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pushAsync(String key, NDArray[] values) {
        return pushAsync(key, values, 0);
    }

    /**
     * {@link #push(String, NDArray[], int)}, non-blocking.
     *
     * @param key the key
     * @param values the values, summed
     * @param priority orders calls ready at the same time (higher first)
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pushAsync(String key, NDArray[] values, int priority) {
        Objects.requireNonNull(key, "key");
        checkArrays(values, "values");
        return submit(OP_PUSH_KEY, key, NO_KEYS, values, NO_KEYS, NO_ARRAYS, priority);
    }

    /**
     * Same as {@link #pushAsync(String[], NDArray[], int)} with priority 0.
     *
     * @param keys the keys
     * @param values the values, one per key
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pushAsync(String[] keys, NDArray[] values) {
        return pushAsync(keys, values, 0);
    }

    /**
     * {@link #push(String[], NDArray[], int)}, non-blocking: the values may be reused as
     * soon as this returns, and the push sums what they held when it was made (a write
     * to one before the push read it copies it for the push first; a write while the push
     * reads it waits). The sums and updates run on the store's threads.
     * Calls on the same key take effect in the order they were made, from any thread.
     *
     * <p>The futures of all non-blocking calls work alike. Their dependent actions run
     * on the daemon threads {@code kvstore-completer-N}, or on a thread in
     * {@link #waitAll()}, never on the store's threads: a dependent may block, and may
     * wait for another call's future ({@code join}, {@code get}); the futures of calls
     * that finished about when its own did may then complete up to about 10 milliseconds
     * late, when another thread takes them on (100 milliseconds for a dependent that
     * computes rather than waits: use the {@code ...Async} forms of
     * {@link CompletableFuture} for long work). A call cannot be withdrawn once made:
     * {@code cancel} returns false and the future completes with the call. {@code get}
     * and {@code get(timeout, unit)} end on an interrupt (the call goes on); {@code join}
     * does not, as for every {@link CompletableFuture}.
     *
     * @param keys the keys
     * @param values the values, one per key
     * @param priority orders calls ready at the same time (higher first); never
     *     changes a result
     * @return the call's future, completed exceptionally with the
     *     {@link KVStoreException} that {@link #push(String[], NDArray[], int)} throws;
     *     {@code cancel} refuses (returns false)
     */
    public CompletableFuture<Void> pushAsync(String[] keys, NDArray[] values, int priority) {
        keys(keys, "keys");
        checkArrays(values, "values");
        return submit(OP_PUSH, null, keys, values, NO_KEYS, NO_ARRAYS, priority);
    }

    /**
     * Same as {@link #pullAsync(String, NDArray[], int)} into one out, priority 0.
     *
     * @param key the key
     * @param out the out
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pullAsync(String key, NDArray out) {
        return pullAsync(key, out, 0);
    }

    /**
     * Same as {@link #pullAsync(String, NDArray[], int)} into one out.
     *
     * @param key the key
     * @param out the out
     * @param priority orders calls ready at the same time (higher first)
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pullAsync(String key, NDArray out, int priority) {
        return pullAsync(key, one(out, "out"), priority);
    }

    /**
     * Same as {@link #pullAsync(String, NDArray[], int)} with priority 0.
     *
     * @param key the key
     * @param outs the outs
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pullAsync(String key, NDArray[] outs) {
        return pullAsync(key, outs, 0);
    }

    /**
     * {@link #pull(String, NDArray[], int)}, non-blocking.
     *
     * @param key the key
     * @param outs the outs
     * @param priority orders calls ready at the same time (higher first)
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pullAsync(String key, NDArray[] outs, int priority) {
        Objects.requireNonNull(key, "key");
        checkArrays(outs, "outs");
        return submit(OP_PULL_KEY, key, NO_KEYS, NO_ARRAYS, NO_KEYS, outs, priority);
    }

    /**
     * Same as {@link #pullAsync(String[], NDArray[], int)} with priority 0.
     *
     * @param keys the keys
     * @param outs the outs, one per key
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pullAsync(String[] keys, NDArray[] outs) {
        return pullAsync(keys, outs, 0);
    }

    /**
     * {@link #pull(String[], NDArray[], int)}, non-blocking: the outs are written later,
     * after every call made before on their keys; until then every access to them
     * ({@code toFloatArray}, {@code toString}, using one in another call) waits.
     *
     * @param keys the keys
     * @param outs the outs, one per key
     * @param priority orders calls ready at the same time (higher first)
     * @return the call's future, completed exceptionally with the
     *     {@link KVStoreException} that {@link #pull(String[], NDArray[], int)} throws;
     *     {@code cancel} refuses (see {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pullAsync(String[] keys, NDArray[] outs, int priority) {
        keys(keys, "keys");
        checkArrays(outs, "outs");
        return submit(OP_PULL, null, NO_KEYS, NO_ARRAYS, keys, outs, priority);
    }

    /**
     * Same as {@link #pushpullAsync(String, NDArray, NDArray, int)} with priority 0.
     *
     * @param key the key
     * @param value the value
     * @param out the out
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pushpullAsync(String key, NDArray value, NDArray out) {
        return pushpullAsync(key, value, out, 0);
    }

    /**
     * {@link #pushpull(String, NDArray, NDArray, int)}, non-blocking.
     *
     * @param key the key
     * @param value the value
     * @param out the out
     * @param priority orders calls ready at the same time (higher first)
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pushpullAsync(String key, NDArray value, NDArray out, int priority) {
        String[] k = one(key, "key");
        return submit(OP_PUSHPULL, null, k, one(value, "value"), k, one(out, "out"), priority);
    }

    /**
     * Same as {@link #pushpullAsync(String, NDArray[], NDArray[], int)} with priority 0.
     *
     * @param key the key
     * @param values the values, summed
     * @param outs the outs
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pushpullAsync(String key, NDArray[] values, NDArray[] outs) {
        return pushpullAsync(key, values, outs, 0);
    }

    /**
     * {@link #pushpull(String, NDArray[], NDArray[], int)}, non-blocking.
     *
     * @param key the key
     * @param values the values, summed
     * @param outs the outs
     * @param priority orders calls ready at the same time (higher first)
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pushpullAsync(String key, NDArray[] values, NDArray[] outs, int priority) {
        String[] valueKeys = repeat(key, "key", values, "values");
        String[] outKeys = repeat(key, "key", outs, "outs");
        checkArrays(values, "values");
        checkArrays(outs, "outs");
        return submit(OP_PUSHPULL, null, valueKeys, values, outKeys, outs, priority);
    }

    /**
     * Same as {@link #pushpullAsync(String[], NDArray[], NDArray[], int)} with priority 0.
     *
     * @param keys the keys
     * @param values the values, one per key
     * @param outs the outs, one per key
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pushpullAsync(String[] keys, NDArray[] values, NDArray[] outs) {
        return pushpullAsync(keys, values, outs, 0);
    }

    /**
     * {@link #pushpull(String[], NDArray[], NDArray[], int)}, non-blocking: the values
     * are copied before this returns, the outs written later (see
     * {@link #pullAsync(String[], NDArray[], int)}).
     *
     * @param keys the keys
     * @param values the values, one per key
     * @param outs the outs, one per key
     * @param priority orders calls ready at the same time (higher first)
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pushpullAsync(String[] keys, NDArray[] values, NDArray[] outs, int priority) {
        keys(keys, "keys");
        checkArrays(values, "values");
        checkArrays(outs, "outs");
        return submit(OP_PUSHPULL, null, keys, values, keys, outs, priority);
    }

    /**
     * Same as {@link #pushpullAsync(String, NDArray, NDArray)} into the value itself.
     *
     * @param key the key
     * @param value the value, then the result
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pushpullAsync(String key, NDArray value) {
        return pushpullAsync(key, value, value, 0);
    }

    /**
     * Same as {@link #pushpullAsync(String, NDArray, NDArray, int)} into the value itself.
     *
     * @param key the key
     * @param value the value, then the result
     * @param priority orders calls ready at the same time (higher first)
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pushpullAsync(String key, NDArray value, int priority) {
        return pushpullAsync(key, value, value, priority);
    }

    /**
     * Same as {@link #pushpullAsync(String, NDArray[], NDArray[])} into the values.
     *
     * @param key the key
     * @param values the values, then the result
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pushpullAsync(String key, NDArray[] values) {
        return pushpullAsync(key, values, values, 0);
    }

    /**
     * Same as {@link #pushpullAsync(String, NDArray[], NDArray[], int)} into the values.
     *
     * @param key the key
     * @param values the values, then the result
     * @param priority orders calls ready at the same time (higher first)
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pushpullAsync(String key, NDArray[] values, int priority) {
        return pushpullAsync(key, values, values, priority);
    }

    /**
     * Same as {@link #pushpullAsync(String[], NDArray[], NDArray[])} into the values.
     *
     * @param keys the keys
     * @param values the values, then the results
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pushpullAsync(String[] keys, NDArray[] values) {
        return pushpullAsync(keys, values, values, 0);
    }

    /**
     * Same as {@link #pushpullAsync(String[], NDArray[], NDArray[], int)} into the values.
     *
     * @param keys the keys
     * @param values the values, then the results
     * @param priority orders calls ready at the same time (higher first)
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> pushpullAsync(String[] keys, NDArray[] values, int priority) {
        return pushpullAsync(keys, values, values, priority);
    }

    /**
     * Same as {@link #broadcastAsync(String, NDArray, NDArray, int)} with priority 0.
     *
     * @param key the key
     * @param value the value
     * @param out the out
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> broadcastAsync(String key, NDArray value, NDArray out) {
        return broadcastAsync(key, value, out, 0);
    }

    /**
     * {@link #broadcast(String, NDArray, NDArray, int)}, non-blocking for its pull.
     *
     * @param key the key
     * @param value the value
     * @param out the out
     * @param priority orders calls ready at the same time (higher first)
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> broadcastAsync(String key, NDArray value, NDArray out, int priority) {
        String[] k = one(key, "key");
        return submit(OP_BROADCAST, null, k, one(value, "value"), k, one(out, "out"), priority);
    }

    /**
     * Same as {@link #broadcastAsync(String, NDArray, NDArray[], int)} with priority 0.
     *
     * @param key the key
     * @param value the value
     * @param outs the outs
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> broadcastAsync(String key, NDArray value, NDArray[] outs) {
        return broadcastAsync(key, value, outs, 0);
    }

    /**
     * {@link #broadcast(String, NDArray, NDArray[], int)}, non-blocking for its pull.
     *
     * @param key the key
     * @param value the value
     * @param outs the outs
     * @param priority orders calls ready at the same time (higher first)
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> broadcastAsync(String key, NDArray value, NDArray[] outs, int priority) {
        String[] k = one(key, "key");
        NDArray[] v = one(value, "value");
        String[] outKeys = repeat(key, "key", outs, "outs");
        checkArrays(outs, "outs");
        return submit(OP_BROADCAST, null, k, v, outKeys, outs, priority);
    }

    /**
     * Same as {@link #broadcastAsync(String[], NDArray[], NDArray[], int)} with priority 0.
     *
     * @param keys the keys
     * @param values the values, one per key
     * @param outs the outs, one per key
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> broadcastAsync(String[] keys, NDArray[] values, NDArray[] outs) {
        return broadcastAsync(keys, values, outs, 0);
    }

    /**
     * {@link #broadcast(String[], NDArray[], NDArray[], int)}, non-blocking for its pull:
     * the keys are initialised before this returns (under {@code dist_sync} that waits
     * for the calls made before), the outs are written later.
     *
     * @param keys the keys
     * @param values the values, one per key
     * @param outs the outs, one per key
     * @param priority orders calls ready at the same time (higher first)
     * @return the call's future, which {@code cancel} does not cancel (see
     *     {@link #pushAsync(String[], NDArray[], int)})
     */
    public CompletableFuture<Void> broadcastAsync(String[] keys, NDArray[] values, NDArray[] outs, int priority) {
        keys(keys, "keys");
        checkArrays(values, "values");
        checkArrays(outs, "outs");
        return submit(OP_BROADCAST, null, keys, values, keys, outs, priority);
    }

    /**
     * Waits until every call made so far on this store has finished (MXNet's
     * {@code WaitAll}), and their futures are complete: those that no other thread has
     * completed yet are completed on this thread, where their dependents then run. It
     * waits for no dependent running elsewhere, and no interrupt stops it. Each
     * non-blocking call reports its error to its own future only, so this throws nothing
     * else.
     *
     * @return this store
     * @throws KVStoreException {@code DISPOSED}
     */
    public KVStore waitAll() {
        try {
            nWaitAll(handle());
        } finally {
            Reference.reachabilityFence(this);
        }
        // The calls are done; their futures are completed before this returns.
        Completer.drain();
        return this;
    }

    // ----- updater and the rest of MXNet's API -----

    /**
     * Installs a custom updater, replacing any earlier one; {@code null} goes back to the
     * default (the pushed sum replaces the stored value). See {@link Updater} for when it
     * runs and what it may call. The store keeps the updater reachable until it is
     * replaced, for as long as the store itself is reachable; an updater that captures the
     * store does not keep the store alive.
     *
     * <p>Pushes in flight finish with the updater they started with: this call waits for
     * them, then returns; pushes that start after it use the new one. Calls from several
     * threads take effect one at a time.
     *
     * @param updater the updater, or {@code null}
     * @return this store
     * @throws KVStoreException {@code DISPOSED}; {@code INVALID_ARGUMENT} when called from
     *     inside an updater of this store, or from inside an updater of another store
     *     while this one is busy (a push, or another thread replacing its updater): an
     *     updater never waits for a store
     */
    public KVStore setUpdater(Updater updater) {
        replaceMerger(updater, () -> nSetUpdater(handle(), updater));
        return this;
    }

    /**
     * Runs {@code install} (a native call that replaces the store's updater or optimizer,
     * waiting for the pushes in flight), then makes {@code installed} the updater this
     * object keeps alive. Serialised by {@link #updaterLock}, so that the field and the
     * native store change in the same order: until the native call returns, the field
     * still holds the updater that the pushes in flight run, and the new one is held by
     * this call.
     */
    private void replaceMerger(Updater installed, Runnable install) {
        if (updaterDepth()[0] > 0) {
            // Inside an updater (of this store or another): the lock's holder may be waiting
            // for the push that runs this very updater, so never wait for it. The native
            // call then fails with INVALID_ARGUMENT for this store, or fails instead of
            // waiting for another store that is busy.
            if (!updaterLock.tryLock()) {
                throw new KVStoreException(KVStoreException.Code.INVALID_ARGUMENT,
                        "replacing the updater or optimizer of a store from inside an updater, while another"
                                + " thread is replacing it: an updater may not wait for a store");
            }
        } else {
            updaterLock.lock();
        }
        try {
            install.run();
            this.updater = installed;
        } finally {
            updaterLock.unlock();
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(installed);
        }
    }

    /**
     * Installs {@code optimizer} (MXNet's {@code set_optimizer}): every later push of
     * gradients to a key updates the key's value, its weight, in place with the optimizer's
     * rule; the per-key state lives in the store. Replaces any updater or earlier optimizer,
     * and every key's optimizer state starts afresh. Waits for the pushes in flight, as
     * {@link #setUpdater(Updater)}.
     *
     * @param optimizer the optimizer
     * @return this store
     * @throws KVStoreException {@code DISPOSED}; {@code INVALID_ARGUMENT} from inside an
     *     updater, as {@link #setUpdater(Updater)}; {@code INVALID_ARGUMENT} or
     *     {@code UNSUPPORTED} as {@link Optimizer.Builder#build()} (an optimizer that was
     *     built has passed those checks already)
     */
    public KVStore setOptimizer(Optimizer optimizer) {
        Objects.requireNonNull(optimizer, "optimizer");
        String json = optimizer.toJson();
        // The optimizer replaces the updater, which need not be kept alive any more.
        replaceMerger(null, () -> nSetOptimizer(handle(), json));
        return this;
    }

    /**
     * The canonical name of the installed optimizer ({@code "sgd"} also for an optimizer
     * built as {@code "SGD"} or {@code "ccsgd"}), or {@code null} when none is installed
     * (no optimizer yet, a custom updater, or the default assign).
     *
     * @return the name, or {@code null}
     * @throws KVStoreException {@code DISPOSED}
     */
    public String optimizerName() {
        try {
            return nOptimizerName(handle());
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * Writes the installed optimizer's state to the file {@code path}: every key's state
     * arrays and update count, the global update count and the schedule's position (a
     * safetensors file with JSON metadata). The file is written beside {@code path} and
     * renamed into place, so a failed save leaves an old file whole.
     *
     * @param path the file
     * @return this store
     * @throws KVStoreException {@code INVALID_ARGUMENT} if no optimizer is installed;
     *     {@code IO} if the file cannot be written; {@code DISPOSED}
     */
    public KVStore saveOptimizerStates(String path) {
        return onFile(path, KVStore::nSaveOptimizerStates);
    }

    /**
     * Reads a file of {@link #saveOptimizerStates(String)} into the installed optimizer, so
     * that training continues exactly where the saving store was (the hyper-parameters stay
     * those of the installed optimizer). Keys of this store that are not in the file start
     * afresh. All or nothing: on any error the optimizer's state is unchanged.
     *
     * @param path the file
     * @return this store
     * @throws KVStoreException {@code IO} for a missing, truncated or corrupted file;
     *     {@code INVALID_ARGUMENT} if no optimizer is installed or the file holds another
     *     optimizer's state; {@code KEY_NOT_INITIALIZED} for a key of the file this store
     *     lacks; {@code SHAPE_MISMATCH} / {@code DTYPE_MISMATCH} for a state that does not
     *     fit its key; {@code DISPOSED}
     */
    public KVStore loadOptimizerStates(String path) {
        return onFile(path, KVStore::nLoadOptimizerStates);
    }

    /**
     * Saves the whole store to the file {@code path}: every key (name, shape, dtype,
     * value), the optimizer with its hyper-parameters and per-key multipliers, every
     * key's optimizer state and update count, and the schedule's state, with a CRC-32 of
     * every tensor and of the file (safetensors with JSON metadata). A custom updater is
     * code and is not saved. The checkpoint is one consistent step: it waits for the
     * calls made before it. The file is written beside {@code path}, flushed and renamed
     * into place, so a failed save leaves an old file whole.
     *
     * <p>Under {@code dist_sync} every worker calls it at the same point; rank 0 writes
     * the file, and every worker returns only once it is durable (or throws, naming rank
     * 0, if rank 0 could not write it).
     *
     * @param path the file
     * @return this store
     * @throws KVStoreException {@code INVALID_ARGUMENT} if {@code path} is not a regular
     *     file; {@code IO} if the file cannot be written; {@code DISPOSED}
     */
    public KVStore saveCheckpoint(String path) {
        return onFile(path, KVStore::nSaveCheckpoint);
    }

    /**
     * Loads a file of {@link #saveCheckpoint(String)} into this store, of any kind and on
     * any number of workers: every key of the file gets the file's value (a key the store
     * has must have the file's shape and dtype and stays on its device; a key the store
     * lacks is initialised), and the file's optimizer is installed in the state it was
     * saved in, so training resumes exactly. A file saved with no updater makes pushes
     * assign again; one saved with a custom updater keeps this store's updater. Keys of
     * this store that the file lacks keep their values. All or nothing: the file is
     * checked whole before anything changes.
     *
     * <p>Under {@code dist_sync} every worker calls it with the same file; if any worker
     * cannot read it, or the workers read different files, every worker throws and none
     * changes.
     *
     * @param path the file
     * @return this store
     * @throws KVStoreException {@code IO} for a missing, truncated or damaged file;
     *     {@code INVALID_ARGUMENT} for a path that is not a regular file, or workers that
     *     read different files; {@code SHAPE_MISMATCH} / {@code DTYPE_MISMATCH} for a key
     *     of this store that differs from the file's; {@code DISPOSED}
     */
    public KVStore loadCheckpoint(String path) {
        return onFile(path, KVStore::nLoadCheckpoint);
    }

    /**
     * Waits for every worker; a local store has only this one, so it returns at once.
     *
     * @return this store
     * @throws KVStoreException {@code DISPOSED}
     */
    public KVStore barrier() {
        try {
            nBarrier(handle());
        } finally {
            Reference.reachabilityFence(this);
        }
        return this;
    }

    /**
     * The number of dead nodes in {@code nodeId}'s group: 0 for a local store.
     *
     * @param nodeId the node group
     * @return the number of dead nodes
     * @throws KVStoreException {@code DISPOSED}
     */
    public int numDeadNode(int nodeId) {
        try {
            return nNumDeadNode(handle(), nodeId);
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * Whether closing the store waits at a barrier first (no effect on a local store).
     *
     * @param barrierBeforeExit whether to wait
     * @return this store
     * @throws KVStoreException {@code DISPOSED}
     */
    public KVStore setBarrierBeforeExit(boolean barrierBeforeExit) {
        try {
            nSetBarrierBeforeExit(handle(), barrierBeforeExit);
        } finally {
            Reference.reachabilityFence(this);
        }
        return this;
    }

    /**
     * Sends a command to the parameter servers; a local store has none and ignores it.
     *
     * @param head the command's head
     * @param body the command's body
     * @return this store
     * @throws KVStoreException {@code DISPOSED}
     */
    public KVStore sendCommandToServers(int head, String body) {
        Objects.requireNonNull(body, "body");
        try {
            nSendCommandToServers(handle(), head, body);
        } finally {
            Reference.reachabilityFence(this);
        }
        return this;
    }

    /**
     * Sets gradient compression, for example {@code {"type": "2bit", "threshold": "0.5"}}.
     *
     * @param params the parameters
     * @return this store
     * @throws KVStoreException {@code UNSUPPORTED}: this build pushes uncompressed values
     *     (the store is unchanged)
     */
    public KVStore setGradientCompression(Map<String, String> params) {
        Objects.requireNonNull(params, "params");
        String[] flat = new String[params.size() * 2];
        int i = 0;
        for (Map.Entry<String, String> e : params.entrySet()) {
            if (i >= flat.length) {
                throw new java.util.ConcurrentModificationException("params changed while being read");
            }
            flat[i] = Objects.requireNonNull(e.getKey(), "params key");
            flat[i + 1] = Objects.requireNonNull(e.getValue(), "params[" + e.getKey() + "]");
            i += 2;
        }
        if (i != flat.length) {
            throw new java.util.ConcurrentModificationException("params changed while being read");
        }
        try {
            nSetGradientCompression(handle(), flat);
        } finally {
            Reference.reachabilityFence(this);
        }
        return this;
    }

    /**
     * Whether the store can do {@code capability} ({@code "optimizer"}).
     *
     * @param capability the capability's name
     * @return whether the store has it
     * @throws KVStoreException {@code INVALID_ARGUMENT} for an unknown capability
     */
    public boolean isCapable(String capability) {
        Objects.requireNonNull(capability, "capability");
        try {
            return nIsCapable(handle(), capability);
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    // ----- lifecycle -----

    /** The same as {@link #close()} (clojure-mxnet's {@code dispose}). */
    public void dispose() {
        close();
    }

    /**
     * The store's facts in the form Clojure prints it: {@code #kvstore/store {:kind "local",
     * :keys 3}} (its kind and number of keys), or {@code #kvstore/store {:closed true}} once
     * closed. Never throws.
     *
     * @return the printed form
     */
    @Override
    public String toString() {
        long h = handleOrZero();
        if (h == 0) {
            return CLOSED_FORM;
        }
        try {
            String kind = nType(h);
            int keys = nNumKeys(h);
            StringBuilder out = new StringBuilder("#kvstore/store {:kind \"");
            for (int i = 0; i < kind.length(); i++) {
                char c = kind.charAt(i);
                if (c == '"' || c == '\\') {
                    out.append('\\');
                }
                out.append(c);
            }
            return out.append("\", :keys ").append(keys).append('}').toString();
        } catch (KVStoreException e) {
            // Closed by another thread since the check above.
            return CLOSED_FORM;
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    // ----- natives (kvstore-jni/src/kvstore.rs; contract in kvstore-jni/NATIVES.md) -----

    static native long nCreate(String kind);

    static native void nFree(long h);

    static native String nVersion();

    static native boolean nMpiSupported();

    static native void nFinalizeMpi();

    static native String nType(long h);

    static native int nRank(long h);

    static native int nNumWorkers(long h);

    static native String[] nKeys(long h);

    static native int nNumKeys(long h);

    static native long nPullNew(long h, String key, int priority);

    static native void nInit(long h, String[] keys, long[] values);

    static native void nPush(long h, String[] keys, long[] values, int priority);

    static native void nPull(long h, String[] keys, long[] outs, int priority);

    static native void nPushKey(long h, String key, long[] values, int priority);

    static native void nPullKey(long h, String key, long[] outs, int priority);

    static native void nPushPull(long h, String[] keys, long[] values, String[] outKeys, long[] outs, int priority);

    static native void nBroadcast(long h, String[] keys, long[] values, String[] outKeys, long[] outs, int priority);

    static native void nSubmit(
            long h, long id, int op, String[] keys, long[] values, String[] outKeys, long[] outs, int priority);

    static native void nSubmitKey(long h, long id, int op, String key, long[] arrays, int priority);

    static native int nTakeDone(long[] ids, int timeoutMs);

    static native void nRelease(long id);

    static native void nResult(long id);

    static native void nWaitAll(long h);

    static native void nSetUpdater(long h, Updater updater);

    static native void nBarrier(long h);

    static native int nNumDeadNode(long h, int nodeId);

    static native void nSetBarrierBeforeExit(long h, boolean barrierBeforeExit);

    static native void nSendCommandToServers(long h, int head, String body);

    static native void nSetGradientCompression(long h, String[] keysAndValues);

    static native boolean nIsCapable(long h, String capability);

    static native void nSetOptimizer(long h, String optimizerJson);

    /** A native call on this store's handle and a file's path. */
    @FunctionalInterface
    private interface FileCall {
        void run(long handle, String path);
    }

    /** Runs {@code call} on this store and {@code path}, which must not be null. */
    private KVStore onFile(String path, FileCall call) {
        Objects.requireNonNull(path, "path");
        try {
            call.run(handle(), path);
        } finally {
            Reference.reachabilityFence(this);
        }
        return this;
    }

    static native void nSaveOptimizerStates(long h, String path);

    static native void nLoadOptimizerStates(long h, String path);

    static native void nSaveCheckpoint(long h, String path);

    static native void nLoadCheckpoint(long h, String path);

    static native String nOptimizerName(long h);
}
