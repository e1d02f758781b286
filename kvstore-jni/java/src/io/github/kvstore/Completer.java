package io.github.kvstore;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.ReentrantLock;

/**
 * Completes the futures of non-blocking calls. A call is submitted with the id of its
 * future; when the store's engine finishes it, the id and the result wait on the native
 * side until the daemon thread {@code kvstore-completer} takes them and completes the
 * future, normally or with the call's {@link KVStoreException}. No Java code runs on
 * the store's own threads for this: the futures' dependent actions run on the completer
 * thread, or on a thread in {@link KVStore#waitAll()}, which completes what finished.
 */
final class Completer {
    private static final ConcurrentHashMap<Long, CompletableFuture<Void>> FUTURES = new ConcurrentHashMap<>();
    private static final AtomicLong NEXT_ID = new AtomicLong();
    private static final long[] NONE = new long[0];
    /** Held while ids are taken and their futures completed, so a drain sees all of them. */
    private static final ReentrantLock LOCK = new ReentrantLock();
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

    private static void run() {
        long[] ids = new long[256];
        while (true) {
            try {
                drain(ids);
                // Waits (up to a second) until a call finishes; takes nothing.
                KVStore.nTakeDone(NONE, 1000);
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

    private static void drain(long[] ids) {
        LOCK.lock();
        try {
            int n;
            while ((n = KVStore.nTakeDone(ids, 0)) > 0) {
                for (int i = 0; i < n; i++) {
                    complete(ids[i]);
                }
            }
        } finally {
            LOCK.unlock();
        }
    }

    private static void complete(long id) {
        CompletableFuture<Void> future = FUTURES.remove(id);
        try {
            KVStore.nResult(id);
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
