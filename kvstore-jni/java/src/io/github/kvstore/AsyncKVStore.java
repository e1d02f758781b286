package io.github.kvstore;

import static io.github.kvstore.Args.checkArrays;
import static io.github.kvstore.Args.checkKeys;
import static io.github.kvstore.Args.handles;
import static io.github.kvstore.Args.one;
import static io.github.kvstore.Args.repeat;

import java.lang.ref.Reference;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.Supplier;

/**
 * The non-blocking calls of a {@link KVStore}, from {@link KVStore#async()}:
 * {@code push}, {@code pull}, {@code pushpull} and {@code broadcast} in the
 * <a href="StoreCalls.html#forms">argument forms</a> of the store's blocking calls (with a
 * {@code priority} on the forms with an {@code NDArray[]}, as there), each returning at
 * once a {@link CompletableFuture} that completes when the call has taken effect, or
 * exceptionally with the {@link KVStoreException} its blocking twin would throw. (As
 * opendal's {@code AsyncOperator} beside its {@code Operator}: a separate view keeps
 * every call of {@link KVStore} itself blocking.) A view is the same for the life of its
 * store and holds no state: calls through it and the store's blocking calls mix freely,
 * and calls on one key take effect in the order they were made, from any thread. A null
 * argument ({@link NullPointerException} naming the parameter) and a closed array
 * ({@link KVStoreException} {@code DISPOSED}) are thrown at once; every other error, a
 * closed store's {@code DISPOSED} included, comes through the future. (A closed array's
 * call is made all the same, as its blocking twin, so that on a store shared with other
 * workers every worker fails it as that call: see {@link KVStore}.)
 *
 * <p>Values: a push may reuse its values as soon as it returns, and sums what they held
 * when it was made (a write to one before the push read it copies it for the push
 * first; a write while the push reads it waits). The sums and updates run on the store's
 * threads. Outs: a pull writes them later, after every call made before on their keys;
 * until then every access to them ({@code toFloatArray}, {@code toString}, using one in
 * another call) waits. {@code pushpull} copies its values before it returns and writes
 * its outs later; {@code broadcast} initialises its keys before it returns (under
 * {@code dist_sync} that waits for the calls made before) and writes its outs later.
 *
 * <p>The futures: their dependent actions run on the daemon threads
 * {@code kvstore-completer-N}, or on a thread in {@link #waitAll()}, never on the store's
 * threads: a dependent may block, and may wait for another call's future ({@code join},
 * {@code get}); the futures of calls that finished about when its own did may then
 * complete up to about 10 milliseconds late, when another thread takes them on (100
 * milliseconds for a dependent that computes rather than waits: use the
 * {@code ...Async} forms of {@link CompletableFuture} for long work). A call cannot be
 * withdrawn once made: {@code cancel} returns false and the future completes with the
 * call. Nor can a future be completed by hand: {@code complete},
 * {@code completeExceptionally}, {@code obtrudeValue}, {@code obtrudeException},
 * {@code completeAsync}, {@code orTimeout} and {@code completeOnTimeout} throw
 * {@link UnsupportedOperationException} (a future that said done while its call was
 * pending would lie); {@code copy()} gives a future of the caller's own to complete or
 * time out. {@code get} and {@code get(timeout, unit)} end on an interrupt (the call goes
 * on); {@code join} does not, as for every {@link CompletableFuture}.
 *
 * <pre>{@code
 * CompletableFuture<Void> pushed = kv.async().push("w", grad);
 * CompletableFuture<Void> pulled = kv.async().pull("w", weight);  // after the push
 * pulled.get();                                                   // weight is written
 * }</pre>
 */
public final class AsyncKVStore implements StoreCalls<CompletableFuture<Void>> {
    private static final int OP_PUSH = 0;
    private static final int OP_PULL = 1;
    private static final int OP_PUSHPULL = 2;
    private static final int OP_BROADCAST = 3;
    private static final int OP_PUSH_KEY = 4;
    private static final int OP_PULL_KEY = 5;
    private static final String[] NO_KEYS = new String[0];
    private static final NDArray[] NO_ARRAYS = new NDArray[0];

    private final KVStore store;

    AsyncKVStore(KVStore store) {
        this.store = store;
    }

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
     * {@code cancel} is refused: a submitted call is never withdrawn. Only the call
     * completes its future ({@link #finish}): the methods that would complete it by hand
     * throw {@link UnsupportedOperationException}, as those of
     * {@link CompletableFuture#minimalCompletionStage()} do, so it never reports a call
     * done (or failed) before the call has ended.
     */
    static final class CallFuture extends CompletableFuture<Void> {
        /** The call's id, once registered (-1 until then). */
        volatile long id = -1;

        private static UnsupportedOperationException byHand(String method) {
            return new UnsupportedOperationException(method + " of a kvstore call's future: it is "
                    + "completed by its call only (wait with get(timeout, unit), or complete a copy())");
        }

        /**
         * Completes the future with the call's outcome: normally when {@code error} is
         * null, else exceptionally with it. The one way the future completes (the
         * {@link Completer}, and {@link #submit} for a call that failed before it was queued).
         *
         * @return whether this completed it
         */
        boolean finish(Throwable error) {
            return error == null ? super.complete(null) : super.completeExceptionally(error);
        }

        private void release() {
            long call = id;
            if (call >= 0 && !super.isDone()) {
                StoreNatives.nRelease(call);
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

        /** Refused (the call completes its future): throws {@link UnsupportedOperationException}. */
        @Override
        public boolean complete(Void value) {
            throw byHand("complete");
        }

        /** Refused (the call completes its future): throws {@link UnsupportedOperationException}. */
        @Override
        public boolean completeExceptionally(Throwable ex) {
            throw byHand("completeExceptionally");
        }

        /** Refused (a call's outcome is never rewritten): throws {@link UnsupportedOperationException}. */
        @Override
        public void obtrudeValue(Void value) {
            throw byHand("obtrudeValue");
        }

        /** Refused (a call's outcome is never rewritten): throws {@link UnsupportedOperationException}. */
        @Override
        public void obtrudeException(Throwable ex) {
            throw byHand("obtrudeException");
        }

        /** Refused (the call completes its future): throws {@link UnsupportedOperationException}. */
        @Override
        public CompletableFuture<Void> completeAsync(Supplier<? extends Void> supplier, Executor executor) {
            throw byHand("completeAsync");
        }

        /** Refused (the call completes its future): throws {@link UnsupportedOperationException}. */
        @Override
        public CompletableFuture<Void> completeAsync(Supplier<? extends Void> supplier) {
            throw byHand("completeAsync");
        }

        /**
         * Refused (it would fail the future while the call goes on): throws
         * {@link UnsupportedOperationException}. Wait with {@code get(timeout, unit)}, or
         * time out a {@code copy()}.
         */
        @Override
        public CompletableFuture<Void> orTimeout(long timeout, TimeUnit unit) {
            throw byHand("orTimeout");
        }

        /**
         * Refused (it would complete the future while the call goes on): throws
         * {@link UnsupportedOperationException}. Use a {@code copy()}.
         */
        @Override
        public CompletableFuture<Void> completeOnTimeout(Void value, long timeout, TimeUnit unit) {
            throw byHand("completeOnTimeout");
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
        CallFuture future = new CallFuture();
        long[] vs = handles(values);
        long[] os = handles(outs);
        if (Args.anyClosed(vs) || Args.anyClosed(os)) {
            // A closed array: its blocking twin, made with it as its refused argument,
            // throws its DISPOSED at once (on a store shared with other workers, once
            // the call took its step as this worker's refusal).
            try {
                blocking(op, key, keys, vs, outKeys, os, priority);
            } finally {
                Reference.reachabilityFence(values);
                Reference.reachabilityFence(outs);
            }
        }
        long id = Completer.register(future);
        future.id = id;
        try {
            if (key != null) {
                StoreNatives.nSubmitKey(store.handle(), id, op, key, op == OP_PUSH_KEY ? vs : os, priority);
            } else {
                StoreNatives.nSubmit(store.handle(), id, op, keys, vs, outKeys, os, priority);
            }
        } catch (KVStoreException e) {
            // Found before anything was queued (a closed store, a stale array): the same
            // exception, through the future.
            Completer.forget(id);
            future.finish(e);
        } finally {
            Reference.reachabilityFence(store);
            Reference.reachabilityFence(values);
            Reference.reachabilityFence(outs);
        }
        return future;
    }

    /** The blocking twin of a call {@link #submit} would make. */
    private void blocking(int op, String key, String[] keys, long[] vs, String[] outKeys, long[] os, int priority) {
        long h = store.handle();
        try {
            switch (op) {
                case OP_PUSH -> StoreNatives.nPush(h, keys, vs, priority);
                case OP_PULL -> StoreNatives.nPull(h, outKeys, os, priority);
                case OP_PUSHPULL -> StoreNatives.nPushPull(h, keys, vs, outKeys, os, priority);
                case OP_BROADCAST -> StoreNatives.nBroadcast(h, keys, vs, outKeys, os, priority);
                case OP_PUSH_KEY -> StoreNatives.nPushKey(h, key, vs, priority);
                case OP_PULL_KEY -> StoreNatives.nPullKey(h, key, os, priority);
                default -> throw new IllegalStateException("no call numbered " + op);
            }
        } finally {
            Reference.reachabilityFence(store);
        }
    }

    // ----- push -----

    @Override
    public CompletableFuture<Void> push(String key, NDArray[] values, int priority) {
        Objects.requireNonNull(key, "key");
        checkArrays(values, "values");
        return submit(OP_PUSH_KEY, key, NO_KEYS, values, NO_KEYS, NO_ARRAYS, priority);
    }

    @Override
    public CompletableFuture<Void> push(String[] keys, NDArray[] values, int priority) {
        checkKeys(keys, "keys");
        checkArrays(values, "values");
        return submit(OP_PUSH, null, keys, values, NO_KEYS, NO_ARRAYS, priority);
    }

    // ----- pull -----

    @Override
    public CompletableFuture<Void> pull(String key, NDArray[] outs, int priority) {
        Objects.requireNonNull(key, "key");
        checkArrays(outs, "outs");
        return submit(OP_PULL_KEY, key, NO_KEYS, NO_ARRAYS, NO_KEYS, outs, priority);
    }

    @Override
    public CompletableFuture<Void> pull(String[] keys, NDArray[] outs, int priority) {
        checkKeys(keys, "keys");
        checkArrays(outs, "outs");
        return submit(OP_PULL, null, NO_KEYS, NO_ARRAYS, keys, outs, priority);
    }

    // ----- pushpull -----

    @Override
    public CompletableFuture<Void> pushpull(String key, NDArray[] values, NDArray[] outs, int priority) {
        String[] valueKeys = repeat(key, "key", values, "values");
        String[] outKeys = repeat(key, "key", outs, "outs");
        checkArrays(values, "values");
        checkArrays(outs, "outs");
        return submit(OP_PUSHPULL, null, valueKeys, values, outKeys, outs, priority);
    }

    @Override
    public CompletableFuture<Void> pushpull(String[] keys, NDArray[] values, NDArray[] outs, int priority) {
        checkKeys(keys, "keys");
        checkArrays(values, "values");
        checkArrays(outs, "outs");
        return submit(OP_PUSHPULL, null, keys, values, keys, outs, priority);
    }

    // ----- broadcast -----

    @Override
    public CompletableFuture<Void> broadcast(String key, NDArray value, NDArray[] outs, int priority) {
        String[] k = one(key, "key");
        NDArray[] v = one(value, "value");
        String[] outKeys = repeat(key, "key", outs, "outs");
        checkArrays(outs, "outs");
        return submit(OP_BROADCAST, null, k, v, outKeys, outs, priority);
    }

    @Override
    public CompletableFuture<Void> broadcast(String[] keys, NDArray[] values, NDArray[] outs, int priority) {
        checkKeys(keys, "keys");
        checkArrays(values, "values");
        checkArrays(outs, "outs");
        return submit(OP_BROADCAST, null, keys, values, keys, outs, priority);
    }

    /**
     * {@link KVStore#waitAll()}: waits, blocking, until every call made so far on the
     * store has finished and the futures of its non-blocking calls are complete (their
     * dependents that no other thread ran run on this thread).
     *
     * @return this view
     * @throws KVStoreException {@code DISPOSED}
     */
    public AsyncKVStore waitAll() {
        store.waitAll();
        return this;
    }

    /**
     * The store whose view this is, for its blocking calls.
     *
     * @return the store
     */
    public KVStore store() {
        return store;
    }
}
