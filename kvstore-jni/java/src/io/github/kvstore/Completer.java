package io.github.kvstore;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
import java.util.concurrent.locks.ReentrantLock;

/**
 * Completes the futures of non-blocking calls. A call is submitted with the id of its
 * future; when the store's engine finishes it, the id and the result wait on the native
 * side until the daemon thread {@code kvstore-completer} takes them and completes the
 * future, normally or with the call's {@link KVStoreException}. No Java code runs on
 * the store's own threads for this: the futures' dependent actions run on the completer
 * thread, or on a thread in {@link KVStore#waitAll()}, which completes what finished.
 *
 * <p>While calls keep finishing, the completer takes them in batches, at most one every
 * {@link #GATHER_NANOS}: woken for every call, it would cost the store's thread a
 * wake-up and the machine two thread switches per call, which a stream of small calls
 * on few cores pays for in the caller's time. A thread waiting for a future
 * ({@code get}, {@code join}: see {@link #startWaiting}) is not kept waiting for that: while
 * one waits, every finished call is taken at once.
 */
final class Completer {
    private static final ConcurrentHashMap<Long, CompletableFuture<Void>> FUTURES = new ConcurrentHashMap<>();
    private static final AtomicLong NEXT_ID = new AtomicLong();
    private static final long[] NONE = new long[0];
    /** Held while ids are taken and their futures completed, so a drain sees all of them. */
    private static final ReentrantLock LOCK = new ReentrantLock();
    /**
     * How long the completer lets finished calls gather after a batch, before it takes
     * the next: the longest a future with no thread waiting for it, only dependents,
     * completes after its call (and its call's own wait for the completer's thread).
     */
    static final long GATHER_NANOS = 50_000;
    /** Threads waiting for a future: while there are any, the completer does not gather. */
    private static final AtomicInteger WAITING = new AtomicInteger();
    private static volatile Thread thread;

    private Completer() {}

    /** Registers {@code future} under a new id (starting the completer at first use). */
    static long register(CompletableFuture<Void> future) {
        long id = NEXT_ID.incrementAndGet();
        FUTURES.put(id, future);
        if (thread == null) {
            start();
        }
        return id;
    }

    /** Forgets the future of a call that was never submitted. */
    static void forget(long id) {
        FUTURES.remove(id);
    }

    private static synchronized void start() {
        if (thread != null) {
            return;
        }
        thread = new Thread(Completer::run, "kvstore-completer");
        thread.setDaemon(true);
        thread.start();
    }

    /**
     * Tells the completer that a thread is about to wait for a future ({@code get},
     * {@code join}), so that it completes every call as soon as it finishes; the
     * thread calls {@link #stopWaiting()} when its wait ends.
     */
    static void startWaiting() {
        WAITING.incrementAndGet();
        Thread t = thread;
        if (t != null) {
            // Cuts short a gathering pause that began before this thread waited.
            LockSupport.unpark(t);
        }
    }

    /** Ends a {@link #startWaiting()}. */
    static void stopWaiting() {
        WAITING.decrementAndGet();
    }

    private static void run() {
        long[] ids = new long[256];
        while (true) {
            try {
                if (drain(ids) > 0) {
                    if (WAITING.get() == 0) {
                        // Lets more calls finish before the next look (see the class doc).
                        LockSupport.parkNanos(GATHER_NANOS);
                    }
                } else {
                    // Waits (up to a second) until a call finishes; takes nothing.
                    KVStore.nTakeDone(NONE, 1000);
                }
            } catch (RuntimeException e) {
                // Nothing to do but go on: a failed take leaves its ids for the next one.
            }
        }
    }

    /**
     * Completes the futures of every call finished so far, on this thread: what
     * {@link KVStore#waitAll()} calls once the store is idle, so that its futures are
     * done when it returns.
     */
    static void drain() {
        drain(new long[256]);
    }

    /** Completes the futures of the calls finished so far; returns how many. */
    private static int drain(long[] ids) {
        LOCK.lock();
        try {
            int n;
            int total = 0;
            while ((n = KVStore.nTakeDone(ids, 0)) > 0) {
                for (int i = 0; i < n; i++) {
                    complete(ids[i]);
                }
                total += n;
            }
            return total;
        } finally {
            LOCK.unlock();
        }
    }

    /** Completes the future of call {@code taken}: its id, negated if the call failed. */
    private static void complete(long taken) {
        long id = Math.abs(taken);
        CompletableFuture<Void> future = FUTURES.remove(id);
        try {
            if (taken < 0) {
                // Throws the call's exception.
                KVStore.nResult(id);
            }
            if (future != null) {
                future.complete(null);
            }
        } catch (KVStoreException e) {
            if (future != null) {
                future.completeExceptionally(e);
            }
        } catch (RuntimeException | Error e) {
            // A dependent action threw: CompletableFuture keeps that to its own futures.
            if (future != null && !future.isDone()) {
                future.completeExceptionally(e);
            }
        }
    }
}
