package io.github.kvstore;

import java.util.Arrays;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.SynchronousQueue;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
import java.util.concurrent.locks.ReentrantLock;

/**
 * Completes the futures of non-blocking calls. A call is submitted with the id of its
 * future; when the store's engine finishes it, the id and the result wait on the native
 * side until the {@link Taker}, a daemon thread {@code kvstore-completer-N}, takes them,
 * as a {@link Batch}, and completes their futures, normally or with the call's
 * {@link KVStoreException}. No Java code runs on the store's own threads for this.
 *
 * <p>The futures' dependent actions run where the futures are completed: on a completer
 * thread, or on a thread in {@link KVStore#waitAll()}, which completes what finished
 * itself. A dependent may wait for anything, another call's future included, and that
 * call still completes: the {@link #watch watchdog} sees a taker that has spent
 * {@link #STALL_NANOS} in one batch and starts another taker, and another thread for the
 * rest of the stalled batch (as Go's runtime hands a processor on when its thread is
 * stuck in a system call), and {@code waitAll} needs no completer thread at all. (Once
 * the one completer thread ran the dependents while holding the lock {@code waitAll}
 * needs: a dependent that joined another call's future waited for the one thread that
 * could complete it, and every future of the JVM stopped, {@code waitAll} with them.)
 * The taker completes what it took itself, so that a thread waiting for a future is
 * woken by the thread that took its call, with no other thread in between: handing
 * every batch to another thread instead cost a round trip of {@code async().push} and
 * {@code get} about half as much again.
 *
 * <p>While calls keep finishing, the taker takes them in batches, at most one every
 * {@link #GATHER_NANOS}: woken for every call, it would cost the store's thread a
 * wake-up and the machine two thread switches per call, which a stream of small calls
 * on few cores pays for in the caller's time. A thread waiting for a future
 * ({@code get}, {@code join}: see {@link #startWaiting}) is not kept waiting for that: while
 * one waits, every finished call is taken at once.
 */
final class Completer {
    private static final ConcurrentHashMap<Long, AsyncKVStore.CallFuture> FUTURES = new ConcurrentHashMap<>();
    private static final AtomicLong NEXT_ID = new AtomicLong();
    private static final long[] NONE = new long[0];
    /** How many finished calls one native take asks for. */
    private static final int CHUNK = 256;
    /**
     * Held while finished calls are taken from the native side and published to
     * {@link #IN_FLIGHT}, only that long, never while a future is completed:
     * {@link #drain()} holds it to know that every call taken so far is there.
     */
    private static final ReentrantLock PUBLISH = new ReentrantLock();
    /** Batches not all of whose completions have returned, oldest first. */
    private static final ConcurrentLinkedQueue<Batch> IN_FLIGHT = new ConcurrentLinkedQueue<>();
    /**
     * How long the taker lets finished calls gather after a batch, before it takes
     * the next: the longest a future with no thread waiting for it, only dependents,
     * completes after its call (and its call's own wait for the taker's thread).
     */
    static final long GATHER_NANOS = 50_000;
    /**
     * How long a batch may go without completing a future, its thread waiting, before the
     * watchdog hands it on: long enough that quick dependents, or a thread descheduled for
     * a moment, are left alone; short enough that a dependent waiting for a call taken
     * with its own waits little more than the watchdog's {@link #WATCH_NANOS}.
     */
    static final long STALL_NANOS = 1_000_000;
    /**
     * How often the watchdog looks while calls are in flight and no batch is being
     * completed (while one is, it looks again when the batch would be stalled): a wake-up
     * of a sleeping thread costs 20 to 50 microseconds of a core on the two-core
     * development machine, so looking every STALL_NANOS took 2.2% of a core for as long
     * as any call was in flight; this takes about 0.5%, and a stalled batch may wait up to
     * WATCH_NANOS more to be seen.
     */
    static final long WATCH_NANOS = 10_000_000;
    /**
     * How long a thread that runs (rather than waits) may complete nothing before the
     * watchdog hands its work on all the same: a dependent that computes is not stuck,
     * and starting threads for such dependents would only crowd the cores, but one that
     * blocks in native code looks the same from here.
     */
    static final long BUSY_NANOS = 100_000_000;
    /** Threads waiting for a future: while there are any, the taker does not gather. */
    private static final AtomicInteger WAITING = new AtomicInteger();
    private static final AtomicInteger THREADS = new AtomicInteger();
    /**
     * The completer threads, which run takers and the rest of stalled batches: a free one
     * if there is, else a new one (a cached pool), so that dependents that keep stalling
     * reuse the threads of those that returned; one idle for a minute ends.
     */
    private static final ThreadPoolExecutor POOL = new ThreadPoolExecutor(
            0, Integer.MAX_VALUE, 60, TimeUnit.SECONDS, new SynchronousQueue<>(), Completer::newThread);
    /** The taker now; replaced when it stalls. */
    private static volatile Taker taker;
    private static volatile Thread watchdog;
    /** Whether the watchdog sleeps until something is to watch (see {@link #wakeWatchdog}). */
    private static volatile boolean watchdogIdle;

    private Completer() {}

    /** Registers {@code future} under a new id (starting the completer at first use). */
    static long register(AsyncKVStore.CallFuture future) {
        long id = NEXT_ID.incrementAndGet();
        FUTURES.put(id, future);
        if (taker == null) {
            start();
        } else {
            wakeWatchdog();
        }
        return id;
    }

    /** Forgets the future of a call that was never submitted. */
    static void forget(long id) {
        FUTURES.remove(id);
    }

    private static synchronized void start() {
        if (taker != null) {
            return;
        }
        Thread w = new Thread(Completer::watch, "kvstore-completer-watchdog");
        w.setDaemon(true);
        startTaker();
        watchdog = w;
        w.start();
    }

    private static Thread newThread(Runnable body) {
        Thread t = new Thread(body, "kvstore-completer-" + THREADS.incrementAndGet());
        t.setDaemon(true);
        return t;
    }

    /**
     * Starts a taker on a completer thread and makes it the one (the one before, if
     * any, was deposed or ended). If no thread can be had, changes nothing.
     */
    private static void startTaker() {
        Taker t = new Taker();
        POOL.execute(t::run);
        taker = t;
    }

    /**
     * Tells the completer that a thread is about to wait for a future ({@code get},
     * {@code join}), so that it completes every call as soon as it finishes; the
     * thread calls {@link #stopWaiting()} when its wait ends.
     */
    static void startWaiting() {
        WAITING.incrementAndGet();
        Taker t = taker;
        Thread running = t == null ? null : t.thread;
        if (running != null) {
            // Cuts short a gathering pause that began before this thread waited.
            LockSupport.unpark(running);
        }
    }

    /** Ends a {@link #startWaiting()}. */
    static void stopWaiting() {
        WAITING.decrementAndGet();
    }

    /**
     * Takes every call finished so far and publishes them as one batch, which it
     * returns; null if none finished. Runs no code but this class's and the natives'.
     */
    private static Batch take(long[] ids) {
        PUBLISH.lock();
        try {
            int n = StoreNatives.nTakeDone(ids, 0);
            if (n == 0) {
                return null;
            }
            long[] taken = ids;
            int last = n;
            while (last == CHUNK) {
                // The take was full: more may be waiting, for this same batch.
                long[] more = new long[CHUNK];
                last = StoreNatives.nTakeDone(more, 0);
                taken = Arrays.copyOf(taken, n + last);
                System.arraycopy(more, 0, taken, n, last);
                n += last;
            }
            Batch batch = new Batch(taken, n);
            if (batch.size == 0) {
                return null;
            }
            IN_FLIGHT.add(batch);
            return batch;
        } finally {
            PUBLISH.unlock();
        }
    }

    /**
     * Completes the futures of every call finished so far, on this thread, whichever
     * thread took them: what {@link KVStore#waitAll()} calls once the store is idle, so
     * that its futures are done when it returns, whatever the completer threads are
     * doing. Dependents run here.
     */
    static void drain() {
        if (take(new long[CHUNK]) != null) {
            // Should one of its dependents stall this thread, the rest is handed on.
            wakeWatchdog();
        }
        for (Batch batch : IN_FLIGHT) {
            batch.completeAll();
        }
    }

    /**
     * The thread that takes finished calls and completes their futures, until the
     * watchdog finds it stalled in a batch and starts another: it then ends once its
     * batch returns.
     */
    private static final class Taker {
        /** The thread it runs on, once it runs. */
        volatile Thread thread;
        /** Whether it is completing a batch, and since when. */
        volatile boolean completing;
        volatile long since;
        /** Set by the watchdog, which started another taker. */
        volatile boolean deposed;
        /** Whether it has stopped, deposed or not (an error it could not go on from). */
        volatile boolean ended;
        private final long[] ids = new long[CHUNK];

        void run() {
            thread = Thread.currentThread();
            try {
                loop();
            } finally {
                ended = true;
            }
        }

        private void loop() {
            while (true) {
                try {
                    Batch batch = take(ids);
                    if (batch == null) {
                        if (deposed) {
                            // Only now: a call's wake-up may have been handed to this
                            // thread rather than to the new taker, and this take saw to it.
                            return;
                        }
                        // Waits (up to a second) until a call finishes; takes nothing.
                        StoreNatives.nTakeDone(NONE, 1000);
                        continue;
                    }
                    since = System.nanoTime();
                    completing = true;
                    wakeWatchdog();
                    batch.run();
                    completing = false;
                    if (WAITING.get() == 0 && !deposed) {
                        // Lets more calls finish before the next look (see the class doc).
                        LockSupport.parkNanos(GATHER_NANOS);
                    }
                } catch (RuntimeException e) {
                    // Nothing to do but go on: a failed take leaves its ids for the next one.
                    completing = false;
                }
            }
        }
    }

    /** Wakes the watchdog if it sleeps for want of anything to watch. */
    private static void wakeWatchdog() {
        if (watchdogIdle) {
            LockSupport.unpark(watchdog);
        }
    }

    /**
     * The watchdog's loop: while calls are in flight, it starts a new taker if the taker
     * is stalled in a batch (see {@link #stalled}), and a thread for the rest of each batch
     * that is stalled (in a taker, or in {@code waitAll}'s thread); asleep while nothing is
     * in flight. It runs no code but this class's, so nothing can stall it.
     */
    private static void watch() {
        while (true) {
            try {
                if (!inFlight()) {
                    watchdogIdle = true;
                    // Whoever adds something to watch reads watchdogIdle after adding it:
                    // it sees the flag, or this sees what it added.
                    if (!inFlight()) {
                        LockSupport.park();
                    }
                    // Set only while idle, so that calls made while it watches never
                    // wake it.
                    watchdogIdle = false;
                    continue;
                }
                long now = System.nanoTime();
                // The next look: in WATCH_NANOS, or when a batch being completed has gone
                // STALL_NANOS without completing a future, if that comes first.
                long sleep = WATCH_NANOS;
                Taker t = taker;
                if (t.ended || (t.completing && stalled(t.thread, now - t.since))) {
                    t.deposed = true;
                    startTaker();
                } else if (t.completing) {
                    sleep = Math.min(sleep, untilStalled(now - t.since));
                }
                for (Batch batch : IN_FLIGHT) {
                    int next = batch.next.get();
                    if (next >= batch.size) {
                        continue;
                    }
                    if (next != batch.seenNext) {
                        batch.seenNext = next;
                        batch.seenAt = now;
                    } else if (stalled(batch.runner, now - batch.seenAt)) {
                        batch.seenAt = now;
                        POOL.execute(batch::run);
                    }
                    sleep = Math.min(sleep, untilStalled(now - batch.seenAt));
                }
                LockSupport.parkNanos(sleep);
            } catch (RuntimeException | OutOfMemoryError e) {
                // A thread could not be started: the next look tries again.
            }
        }
    }

    /** How long until work that has completed nothing for {@code nanos} is looked at again. */
    private static long untilStalled(long nanos) {
        return nanos < STALL_NANOS ? STALL_NANOS - nanos : STALL_NANOS;
    }

    /**
     * Whether the work of {@code thread}, which has completed no future for {@code nanos},
     * goes to another thread: it waits (for a future, a lock, a sleep) since
     * {@link #STALL_NANOS}, or runs since {@link #BUSY_NANOS}; null when no thread has
     * started on it.
     */
    private static boolean stalled(Thread thread, long nanos) {
        if (nanos < STALL_NANOS) {
            return false;
        }
        return thread == null || thread.getState() != Thread.State.RUNNABLE || nanos >= BUSY_NANOS;
    }

    /** Whether a call or a batch is in flight, or the taker is completing one (or ended). */
    private static boolean inFlight() {
        Taker t = taker;
        if (t.completing || t.ended || !FUTURES.isEmpty()) {
            return true;
        }
        for (Batch batch : IN_FLIGHT) {
            if (batch.next.get() < batch.size) {
                return true;
            }
        }
        return false;
    }

    /**
     * Calls taken from the native side together: their futures, in the order the calls
     * finished, with the errors of those that failed. Any thread may complete any of
     * them: completing a future twice does nothing.
     */
    private static final class Batch {
        private final AsyncKVStore.CallFuture[] futures;
        /** The call's exception, or null for a call that succeeded. */
        private final Throwable[] errors;
        final int size;
        /** The next future to complete, claimed by the thread that increments past it. */
        final AtomicInteger next = new AtomicInteger();
        /** How many completions have returned: at {@link #size}, the batch leaves IN_FLIGHT. */
        private final AtomicInteger returned = new AtomicInteger();
        /** The thread that last started completing the batch's futures. */
        volatile Thread runner;
        /** What the watchdog saw of {@link #next}, and when it last moved (its thread only). */
        int seenNext;
        long seenAt = System.nanoTime();

        /** The batch of the first {@code n} ids (negated for calls that failed). */
        Batch(long[] ids, int n) {
            futures = new AsyncKVStore.CallFuture[n];
            errors = new Throwable[n];
            int k = 0;
            for (int i = 0; i < n; i++) {
                long id = Math.abs(ids[i]);
                AsyncKVStore.CallFuture future = FUTURES.remove(id);
                Throwable error = null;
                if (ids[i] < 0) {
                    try {
                        // Throws the call's exception (taken once for each failed id,
                        // even one whose future is gone).
                        StoreNatives.nResult(id);
                    } catch (RuntimeException e) {
                        error = e;
                    }
                }
                if (future != null) {
                    futures[k] = future;
                    errors[k] = error;
                    k++;
                }
            }
            size = k;
        }

        /** Completes, in order, the futures that no thread has claimed yet. */
        void run() {
            runner = Thread.currentThread();
            int i;
            while ((i = next.getAndIncrement()) < size) {
                complete(i);
                if (returned.incrementAndGet() == size) {
                    IN_FLIGHT.remove(this);
                }
            }
        }

        /**
         * Completes every future of the batch on this thread: those no thread has
         * claimed, and those claimed by a thread that has not completed them yet.
         */
        void completeAll() {
            run();
            for (int i = 0; i < size; i++) {
                complete(i);
            }
        }

        private void complete(int i) {
            AsyncKVStore.CallFuture future = futures[i];
            try {
                future.finish(errors[i]);
            } catch (RuntimeException | Error e) {
                // CompletableFuture keeps a dependent's exception to the dependent's own
                // future; whatever got past it, the batch's other futures still complete.
                future.finish(e);
            }
        }
    }
}
