package io.github.kvstore;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Completes the futures of non-blocking calls. A call is submitted with the id of its
 * future; when the store's engine finishes it, the id and the result wait on the native
 * side until the daemon thread {@code kvstore-completer} takes them and completes the
 * future, normally or with the call's {@link KVStoreException}. No Java code runs on
 * the store's own threads for this, and the futures' dependent actions run on the
 * completer thread.
 */
final class Completer {
    private static final ConcurrentHashMap<Long, CompletableFuture<Void>> FUTURES = new ConcurrentHashMap<>();
    private static final AtomicLong NEXT_ID = new AtomicLong();
    private static Thread thread;

    private Completer() {}

    /** Registers {@code future} under a new id (starting the completer at first use). */
    static long register(CompletableFuture<Void> future) {
        long id = NEXT_ID.incrementAndGet();
        FUTURES.put(id, future);
        start();
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
            int n;
            try {
                n = KVStore.nTakeDone(ids, 1000);
            } catch (RuntimeException e) {
                continue;
            }
            for (int i = 0; i < n; i++) {
                complete(ids[i]);
            }
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
