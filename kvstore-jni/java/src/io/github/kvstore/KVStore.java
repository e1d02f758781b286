package io.github.kvstore;

import static io.github.kvstore.Args.checkArrays;
import static io.github.kvstore.Args.checkKeys;
import static io.github.kvstore.Args.handles;
import static io.github.kvstore.Args.one;
import static io.github.kvstore.Args.repeat;
import static io.github.kvstore.StoreNatives.*;

import java.lang.ref.Cleaner;
import java.lang.ref.Reference;
import java.util.Arrays;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.locks.ReentrantLock;

/**
 * A key-value store of arrays, as MXNet's {@code KVStore}: {@link #init(String, NDArray)}
 * keys, {@link #push(String, NDArray)} values (summed, then merged into the stored value by
 * the {@link Updater} or the {@link Optimizer}; by default the sum replaces it),
 * {@link #pull(String, NDArray)} the stored values into outs.
 *
 * <p>{@code push}, {@code pull}, {@code pushpull} and {@code broadcast}, here and on
 * {@link AsyncKVStore}, take MXNet's <a href="StoreCalls.html#forms">argument forms</a>
 * ({@link StoreCalls}): one key and one array, one key and many arrays (summed left to
 * right into one update; every out receives the value), or parallel arrays of keys and
 * arrays (a repeated key gets the sum of its arrays in one update). Push always copies:
 * the store never keeps a caller's array.
 *
 * <h2 id="blocking">Blocking and non-blocking calls</h2>
 *
 * <p>The calls of this class block: each returns once it has taken effect (its outs are
 * written), and throws its error. It runs at once on the calling thread when no earlier
 * call holds its keys or arrays, and otherwise waits in the store's queue for them.
 * {@link #async()} gives the same calls non-blocking ({@link AsyncKVStore}): they return a
 * {@link CompletableFuture} at once and run on the store's threads, and their outs stay
 * pending (every read of one waits) until written. Both kinds may be mixed freely: calls
 * on one key take effect in the order they were made, from any thread.
 * {@link #waitAll()} waits for every call made so far.
 *
 * <p>{@code priority} is MXNet's: among queued calls that are ready at the same time, the
 * higher priority runs first. It never changes a result, since calls on one key keep
 * their order; a blocking call that runs at once, and every call of a {@code dist_sync}
 * store (which runs its calls in the order they were made on every worker), ignore it.
 *
 * <h2 id="threads">Threads, nulls and errors</h2>
 *
 * <p>Mutating methods return {@code this} for chaining. A store is safe to use from many
 * threads (calls on one key are serialised, calls on different keys run in parallel). It
 * holds native memory until {@link #close()}; a {@link Cleaner} frees stores that become
 * unreachable unclosed. After {@code close()} every call throws {@link KVStoreException}
 * with code {@link KVStoreException.Code#DISPOSED}; calls already running finish.
 *
 * <p>A null argument is a {@link NullPointerException} naming the parameter (see the
 * <a href="package-summary.html">package</a>; {@link #setUpdater(Updater)} takes
 * {@code null} for "the default"); the store's errors are {@link KVStoreException}s. A
 * closed array given to a call is {@code DISPOSED}: the call is made all the same, with
 * the closed array as its refused argument, and the store fails it as it fails the
 * arguments it refuses itself. On a store shared with other workers ({@code dist_sync}
 * under {@code mpirun}) it so takes its step, as this worker's refusal, and fails on
 * every worker as that call (here with {@code DISPOSED}; on the others with
 * {@code INVALID_ARGUMENT}, saying that this rank refused it), changes nothing, and
 * leaves the workers' next calls matched. (Refused before the call, it would be missing
 * on this worker alone, and its next call would meet the others' this one.)
 *
 * <p>{@link Thread#interrupt()} does not stop a blocking call (nor {@link #waitAll()}): it
 * returns when done, with the interrupt status still set, as {@link CompletableFuture#join()}
 * does, since a queued call always runs. For a wait that an interrupt ends, use the
 * non-blocking call: {@code kv.async().pull(keys, outs).get()} throws
 * {@link InterruptedException}, and the call still takes effect.
 *
 * <pre>{@code
 * try (KVStore kv = KVStore.create("local");
 *      NDArray two = NDArray.full(new int[] {2, 3}, 2.0);
 *      NDArray out = NDArray.zeros(2, 3)) {
 *     kv.init("3", two).push("3", two).pull("3", out);   // out == 2
 *     kv.async().push("3", two).join();                  // the same push, non-blocking
 * }
 * }</pre>
 */
public final class KVStore extends NativeObject implements StoreCalls<KVStore>, AutoCloseable {
    static {
        NativeLibrary.load();
        // A program of one process closes its timeline's file whole at exit (a
        // dist_sync job's is closed and merged by finalizeMpi).
        Runtime.getRuntime()
                .addShutdownHook(new Thread(StoreNatives::nCloseTimelineAtExit, "kvstore-timeline-exit"));
    }

    /** How stores are freed, and how many were (for tests). */
    private static final Kind KIND = new Kind("KVStore", StoreNatives::nFree);
    /** What {@link #toString()} says once the store is closed. */
    private static final String CLOSED_FORM = "#kvstore/store {:closed true}";

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
    /** The view of {@link #async()}: the non-blocking calls. */
    private final AsyncKVStore async = new AsyncKVStore(this);

    private KVStore(long handle) {
        super(KIND, handle, 0, true);
    }

    /**
     * A new {@code "local"} store ({@link #create(String)}), which reduces on the host.
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

    // ----- the store's kind and place -----

    /**
     * The kind, lower-cased (MXNet's {@code type}).
     *
     * @return for example {@code "local"}
     * @throws KVStoreException {@code DISPOSED}
     */
    public String type() {
        return with(StoreNatives::nType);
    }

    /**
     * This worker's rank: 0 for a local store.
     *
     * @return the rank
     * @throws KVStoreException {@code DISPOSED}
     */
    public int rank() {
        return with(StoreNatives::nRank);
    }

    /**
     * The number of workers: 1 for a local store.
     *
     * @return the number of workers
     * @throws KVStoreException {@code DISPOSED}
     */
    public int numWorkers() {
        return with(StoreNatives::nNumWorkers);
    }

    /**
     * The keys of the store, in the order they were first initialised.
     *
     * @return a new array of the keys (empty for a new store)
     * @throws KVStoreException {@code DISPOSED}
     */
    public String[] keys() {
        return with(StoreNatives::nKeys);
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
        checkKeys(keys, "keys");
        checkArrays(values, "values");
        long[] vs = handles(values);
        try {
            nInit(handle(), keys, vs);
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(values);
        }
        return this;
    }

    // ----- push -----

    @Override
    public KVStore push(String key, NDArray[] values, int priority) {
        Objects.requireNonNull(key, "key");
        checkArrays(values, "values");
        long[] vs = handles(values);
        try {
            nPushKey(handle(), key, vs, priority);
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(values);
        }
        return this;
    }

    @Override
    public KVStore push(String[] keys, NDArray[] values, int priority) {
        checkKeys(keys, "keys");
        checkArrays(values, "values");
        long[] vs = handles(values);
        try {
            nPush(handle(), keys, vs, priority);
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(values);
        }
        return this;
    }

    // ----- row-sparse keys -----

    /**
     * Initialises {@code key} with a row-sparse value: the key holds its rows (zero
     * elsewhere) and is row-sparse ({@link #rowSparsePull} reads it).
     *
     * @param key the key
     * @param value the initial value (copied)
     * @return this store
     * @throws KVStoreException as {@link #initRowSparse(String[], RowSparse[])}
     */
    public KVStore initRowSparse(String key, RowSparse value) {
        return initRowSparse(one(key, "key"), new RowSparse[] {Objects.requireNonNull(value, "value")});
    }

    /**
     * Initialises each key with its row-sparse value. All or nothing: on error no key of
     * the call is added.
     *
     * @param keys the keys, each at most once
     * @param values the values, one per key (copied)
     * @return this store
     * @throws KVStoreException {@code ALREADY_INITIALIZED}, {@code LENGTH_MISMATCH},
     *     {@code UNSUPPORTED} (a {@code dist_*} store), {@code DISPOSED}
     */
    public KVStore initRowSparse(String[] keys, RowSparse[] values) {
        checkKeys(keys, "keys");
        long[][] vs = RowSparse.describe(values, "values");
        try {
            nInitRowSparse(handle(), keys, vs[0], vs[1]);
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(values);
        }
        return this;
    }

    /**
     * Pushes row-sparse values to {@code key}: they are summed row by row over the union
     * of their rows (left to right), then merged: with no updater the sum replaces the
     * whole value (rows it lacks become zero, MXNet's assign) and the key becomes
     * row-sparse; SGD and Adam with {@code lazy_update} (their default), AdaGrad and Ftrl
     * update only the pushed rows, of the weight and of their state; other optimizers
     * and updaters get the sum as a dense gradient.
     *
     * @param key the key
     * @param values the values
     * @return this store
     * @throws KVStoreException as {@link #pushRowSparse(String[], RowSparse[], int)}
     */
    public KVStore pushRowSparse(String key, RowSparse... values) {
        Objects.requireNonNull(key, "key");
        Objects.requireNonNull(values, "values");
        String[] keys = new String[values.length];
        Arrays.fill(keys, key);
        return pushRowSparse(keys, values, 0);
    }

    /**
     * Pushes {@code values[i]} to {@code keys[i]}, as {@link #pushRowSparse(String,
     * RowSparse...)} for each distinct key (a key given twice has its values summed).
     * Every key, shape and dtype is checked before any key changes.
     *
     * @param keys the keys
     * @param values the values, one per key
     * @param priority MXNet's priority (see the class doc)
     * @return this store
     * @throws KVStoreException {@code KEY_NOT_INITIALIZED}, {@code SHAPE_MISMATCH},
     *     {@code DTYPE_MISMATCH}, {@code LENGTH_MISMATCH}, {@code UNSUPPORTED} (a
     *     {@code dist_*} store), {@code BACKEND} (the updater threw), {@code DISPOSED}
     */
    public KVStore pushRowSparse(String[] keys, RowSparse[] values, int priority) {
        checkKeys(keys, "keys");
        long[][] vs = RowSparse.describe(values, "values");
        try {
            nPushRowSparse(handle(), keys, vs[0], vs[1], priority);
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(values);
        }
        return this;
    }

    /**
     * The rows {@code rowIds} of row-sparse {@code key} (any order, repeats allowed),
     * as a new row-sparse array whose indices are those ids sorted and de-duplicated;
     * only those rows are copied. The caller owns the result: close it.
     *
     * @param key the key
     * @param rowIds the rows to pull
     * @return the rows
     * @throws KVStoreException as {@link #rowSparsePull(String, long[], int)}
     */
    public RowSparse rowSparsePull(String key, long[] rowIds) {
        return rowSparsePull(key, rowIds, 0);
    }

    /**
     * {@link #rowSparsePull(String, long[])} at a priority.
     *
     * @param key the key
     * @param rowIds the rows to pull
     * @param priority MXNet's priority (see the class doc)
     * @return the rows
     * @throws KVStoreException {@code KEY_NOT_INITIALIZED}; {@code INVALID_ARGUMENT} for
     *     a dense key or a row id out of range; {@code UNSUPPORTED} (a {@code dist_*}
     *     store); {@code DISPOSED}
     */
    public RowSparse rowSparsePull(String key, long[] rowIds, int priority) {
        Objects.requireNonNull(key, "key");
        Objects.requireNonNull(rowIds, "rowIds");
        return RowSparse.fromJava(with(h -> nRowSparsePull(h, key, rowIds, priority)));
    }

    /**
     * The storage type of {@code key}: {@code "row_sparse"} once initialised with, or
     * assigned, a row-sparse value; else {@code "default"}.
     *
     * @param key the key
     * @return MXNet's name of the storage type
     * @throws KVStoreException {@code KEY_NOT_INITIALIZED}, {@code DISPOSED}
     */
    public String stype(String key) {
        Objects.requireNonNull(key, "key");
        return with(h -> nStype(h, key)) == 1 ? "row_sparse" : "default";
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
        return new NDArray(with(h -> nPullNew(h, key, 0)));
    }

    @Override
    public KVStore pull(String key, NDArray[] outs, int priority) {
        Objects.requireNonNull(key, "key");
        checkArrays(outs, "outs");
        long[] os = handles(outs);
        try {
            nPullKey(handle(), key, os, priority);
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(outs);
        }
        return this;
    }

    @Override
    public KVStore pull(String[] keys, NDArray[] outs, int priority) {
        checkKeys(keys, "keys");
        checkArrays(outs, "outs");
        long[] os = handles(outs);
        try {
            nPull(handle(), keys, os, priority);
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(outs);
        }
        return this;
    }

    // ----- pushpull -----

    @Override
    public KVStore pushpull(String key, NDArray[] values, NDArray[] outs, int priority) {
        String[] valueKeys = repeat(key, "key", values, "values");
        String[] outKeys = repeat(key, "key", outs, "outs");
        checkArrays(values, "values");
        checkArrays(outs, "outs");
        return pushpull0(valueKeys, values, outKeys, outs, priority);
    }

    @Override
    public KVStore pushpull(String[] keys, NDArray[] values, NDArray[] outs, int priority) {
        checkKeys(keys, "keys");
        checkArrays(values, "values");
        checkArrays(outs, "outs");
        return pushpull0(keys, values, keys, outs, priority);
    }

    private KVStore pushpull0(String[] keys, NDArray[] values, String[] outKeys, NDArray[] outs, int priority) {
        long[] vs = handles(values);
        long[] os = handles(outs);
        try {
            nPushPull(handle(), keys, vs, outKeys, os, priority);
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(values);
            Reference.reachabilityFence(outs);
        }
        return this;
    }

    // ----- broadcast -----

    @Override
    public KVStore broadcast(String key, NDArray value, NDArray[] outs, int priority) {
        String[] k = one(key, "key");
        NDArray[] v = one(value, "value");
        String[] outKeys = repeat(key, "key", outs, "outs");
        checkArrays(outs, "outs");
        return broadcast0(k, v, outKeys, outs, priority);
    }

    @Override
    public KVStore broadcast(String[] keys, NDArray[] values, NDArray[] outs, int priority) {
        checkKeys(keys, "keys");
        checkArrays(values, "values");
        checkArrays(outs, "outs");
        return broadcast0(keys, values, keys, outs, priority);
    }

    private KVStore broadcast0(String[] keys, NDArray[] values, String[] outKeys, NDArray[] outs, int priority) {
        long[] vs = handles(values);
        long[] os = handles(outs);
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

    /**
     * This store's non-blocking calls: the same {@code push}, {@code pull},
     * {@code pushpull} and {@code broadcast}, in the same forms, each returning a
     * {@link CompletableFuture} at once (see {@link AsyncKVStore}). Always the same view
     * of this store, with no state of its own; once the store is closed, its calls'
     * futures complete exceptionally with {@code DISPOSED}.
     *
     * @return the non-blocking view of this store
     */
    public AsyncKVStore async() {
        return async;
    }

    /**
     * Waits until every call made so far on this store has finished (MXNet's
     * {@code WaitAll}), and the futures of its non-blocking calls are complete: those that
     * no other thread has completed yet are completed on this thread, where their
     * dependents then run. It waits for no dependent running elsewhere, and no interrupt
     * stops it. Each non-blocking call reports its error to its own future only, so this
     * throws nothing else.
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
        if (UpdaterDepth.cell()[0] > 0) {
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
        return with(StoreNatives::nOptimizerName);
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
        return onFile(path, StoreNatives::nSaveOptimizerStates);
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
        return onFile(path, StoreNatives::nLoadOptimizerStates);
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
        return onFile(path, StoreNatives::nSaveCheckpoint);
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
        return onFile(path, StoreNatives::nLoadCheckpoint);
    }

    /**
     * Waits for every worker; a local store has only this one, so it returns at once.
     *
     * @return this store
     * @throws KVStoreException {@code DISPOSED}
     */
    public KVStore barrier() {
        return on(StoreNatives::nBarrier);
    }

    /**
     * The number of dead nodes in {@code nodeId}'s group: 0 for a local store.
     *
     * @param nodeId the node group
     * @return the number of dead nodes
     * @throws KVStoreException {@code DISPOSED}
     */
    public int numDeadNode(int nodeId) {
        return with(h -> nNumDeadNode(h, nodeId));
    }

    /**
     * Whether closing the store waits at a barrier first (no effect on a local store).
     *
     * @param barrierBeforeExit whether to wait
     * @return this store
     * @throws KVStoreException {@code DISPOSED}
     */
    public KVStore setBarrierBeforeExit(boolean barrierBeforeExit) {
        return on(h -> nSetBarrierBeforeExit(h, barrierBeforeExit));
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
        return on(h -> nSendCommandToServers(h, head, body));
    }

    /**
     * Sets MXNet's 2-bit gradient compression on a {@code device} or {@code dist_sync} store,
     * for example
     * {@code {"type": "2bit", "threshold": "0.5"}}: every value pushed from then on, even a
     * single one, is quantised to {-t, 0, +t} with a residual per key and per position in the
     * push's values that carries what was not sent to the next push; the quantised values are
     * summed and merged as ever. {@code init} and {@code pull} are not compressed; values must
     * be float32. {@code threshold} defaults to 0.5; other names are ignored, as in MXNet. Under
     * {@code dist_sync} each worker quantises its own sum of a key and the workers exchange
     * 2-bit codes; every worker must set the same compression. {@code {"type": "fp16"}} or
     * {@code "bf16"} (an extension, {@code dist_sync} only) rounds each worker's sums once to
     * that 16-bit float for the wire instead.
     *
     * @param params the parameters
     * @return this store
     * @throws KVStoreException {@code INVALID_ARGUMENT} for no {@code type}, a type other than
     *     {@code 2bit} or a threshold that is not a number above 0; {@code UNSUPPORTED} on a
     *     {@code local} store, as MXNet (the store is unchanged either way)
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
        return on(h -> nSetGradientCompression(h, flat));
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
        return with(h -> nIsCapable(h, capability));
    }

    // ----- where the time goes -----

    /**
     * Starts writing the timeline of this process's stores to {@code path}: Chrome Trace
     * Event Format JSON, which Perfetto and {@code chrome://tracing} open (as {@code
     * KVSTORE_TIMELINE=path} does for a whole program; see docs/timeline.md). Under {@code
     * dist_sync} each worker writes its own file beside it until {@link #stopTimeline()}.
     *
     * @param path the trace's file
     * @return this store
     * @throws KVStoreException {@code IO} if the file cannot be made; {@code DISPOSED}
     */
    public KVStore startTimeline(String path) {
        return onFile(path, StoreNatives::nStartTimeline);
    }

    /**
     * Stops the timeline and closes its file; under {@code dist_sync} (every worker calls it,
     * as {@link #barrier()}) worker 0 merges every worker's file into the path it was started
     * with.
     *
     * @return the file written here (the merged one on worker 0), or null if it was off
     * @throws KVStoreException {@code IO} if a file cannot be written; {@code DISPOSED}
     */
    public String stopTimeline() {
        return with(StoreNatives::nStopTimeline);
    }

    /**
     * Commits the whole store as of this call (every key's value, the optimizer and its
     * state, this rank's compression residuals, {@code step} and {@code extra}, the
     * program's own bytes) into memory that outlives the process ({@code /dev/shm}): a
     * store made later by a run of the same job ({@code KVSTORE_JOB}, which {@code
     * kvstore-run} sets) restores it ({@link #restored()}). Under {@code dist_sync} and
     * {@code dist_async} a collective, like {@link #barrier()}.
     *
     * @param step the step committed
     * @param extra the program's own bytes (a data loader's position; empty for none)
     * @throws KVStoreException {@code INVALID_ARGUMENT} for a store made without a job
     *     name or a negative step, {@code IO} when the commit cannot be written
     */
    public void commit(long step, byte[] extra) {
        Objects.requireNonNull(extra, "extra");
        on(h -> StoreNatives.nCommit(h, step, extra));
    }

    /**
     * The commit this store resumed from when it was made (see {@link #commit}).
     *
     * @return its step and extra bytes, or null when the store restored nothing
     */
    public Restored restored() {
        return Restored.of(with(StoreNatives::nRestored));
    }

    /**
     * What this store did since it was made or {@link #resetStats()}.
     *
     * @return calls, keys, bytes, time in each phase and, under {@code dist_sync}, each
     *     worker's arrivals at the collectives
     * @throws KVStoreException {@code DISPOSED}
     */
    public Stats stats() {
        return Stats.of(with(StoreNatives::nStats));
    }

    /**
     * Sets this store's counters ({@link #stats()}) to zero.
     *
     * @return this store
     * @throws KVStoreException {@code DISPOSED}
     */
    public KVStore resetStats() {
        return on(StoreNatives::nResetStats);
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
            StringBuilder out = new StringBuilder("#kvstore/store {:kind ");
            Json.string(out, kind);
            return out.append(", :keys ").append(keys).append('}').toString();
        } catch (KVStoreException e) {
            // Closed by another thread since the check above.
            return CLOSED_FORM;
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /** Runs {@code call} on this store's handle. */
    private KVStore on(java.util.function.LongConsumer call) {
        try {
            call.accept(handle());
        } finally {
            Reference.reachabilityFence(this);
        }
        return this;
    }

    /** What {@code call} returns on this store's handle. */
    private <T> T with(java.util.function.LongFunction<T> call) {
        try {
            return call.apply(handle());
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /** A native call on this store's handle and a file's path. */
    @FunctionalInterface
    private interface FileCall {
        void run(long handle, String path);
    }

    /** Runs {@code call} on this store and {@code path}, which must not be null. */
    private KVStore onFile(String path, FileCall call) {
        Objects.requireNonNull(path, "path");
        return on(h -> call.run(h, path));
    }
}
