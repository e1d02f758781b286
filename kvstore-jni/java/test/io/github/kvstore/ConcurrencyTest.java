package io.github.kvstore;

import static io.github.kvstore.Fixtures.assertAll;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** Many threads on one store or one array, including a close in the middle. */
class ConcurrencyTest {
    private static final int THREADS = 4;

    /** Runs {@code body} on THREADS threads until it throws; returns what each ended with. */
    private static List<Throwable> runUntilThrown(Runnable body, Runnable whileRunning) throws InterruptedException {
        ConcurrentLinkedQueue<Throwable> ends = new ConcurrentLinkedQueue<>();
        AtomicInteger iterations = new AtomicInteger();
        CountDownLatch warmedUp = new CountDownLatch(THREADS);
        List<Thread> threads = new ArrayList<>();
        for (int t = 0; t < THREADS; t++) {
            Thread thread = new Thread(() -> {
                int n = 0;
                try {
                    while (true) {
                        body.run();
                        iterations.incrementAndGet();
                        if (++n == 20) {
                            warmedUp.countDown();
                        }
                    }
                } catch (Throwable e) {
                    warmedUp.countDown();
                    ends.add(e);
                }
            }, "kvstore-test-" + t);
            thread.setDaemon(true);
            threads.add(thread);
            thread.start();
        }
        assertTrue(warmedUp.await(30, TimeUnit.SECONDS), "every thread ran 20 iterations");
        whileRunning.run();
        for (Thread thread : threads) {
            thread.join(30_000);
            assertTrue(!thread.isAlive(), thread.getName() + " ended after the close");
        }
        assertTrue(iterations.get() >= THREADS * 20, "iterations: " + iterations.get());
        return new ArrayList<>(ends);
    }

    private static void assertAllDisposed(List<Throwable> ends) {
        assertEquals(THREADS, ends.size());
        for (Throwable e : ends) {
            if (!(e instanceof KVStoreException) || ((KVStoreException) e).code() != KVStoreException.Code.DISPOSED) {
                throw new AssertionError("a thread ended with something else than DISPOSED", e);
            }
        }
    }

    @Test
    @Timeout(120)
    void closingAStoreWhileFourThreadsPushAndPullEndsThemWithDisposed() throws InterruptedException {
        KVStore kv = KVStore.create();
        int[] shape = {256};
        NDArray ones = NDArray.ones(shape);
        for (int t = 0; t < THREADS; t++) {
            kv.init("k" + t, ones);
        }
        AtomicInteger next = new AtomicInteger();
        ThreadLocal<Integer> id = ThreadLocal.withInitial(next::getAndIncrement);
        ThreadLocal<NDArray> out = ThreadLocal.withInitial(() -> NDArray.zeros(shape));
        List<Throwable> ends = runUntilThrown(() -> {
            String key = "k" + (id.get() % THREADS);
            kv.push(key, new NDArray[] {ones, ones});
            kv.pull(new String[] {key, "k0"}, new NDArray[] {out.get(), out.get()});
            kv.pushpull(key, ones, out.get());
        }, kv::close);
        assertAllDisposed(ends);
        assertAll(1f, ones);
        ones.close();
    }

    @Test
    @Timeout(120)
    void closingAnArrayWhileFourThreadsUseItEndsThemWithDisposed() throws InterruptedException {
        NDArray shared = NDArray.ones(1024);
        try (KVStore kv = KVStore.create();
                NDArray two = NDArray.full(new int[] {1024}, 2.0)) {
            kv.init("s", two);
            List<Throwable> ends = runUntilThrown(() -> {
                try (NDArray sum = shared.add(two)) {
                    sum.toFloatArray();
                }
                shared.mulInPlace(1.0);
                kv.push("s", shared);
                kv.pull("s", shared);
            }, shared::close);
            assertAllDisposed(ends);
            // The store is unharmed.
            try (NDArray out = NDArray.zeros(1024)) {
                kv.pull("s", out);
                assertAll(1f, out);
            }
        }
    }

    @Test
    @Timeout(120)
    void concurrentPushesToOneKeyAreSerialisedAndNoneIsLost() throws InterruptedException {
        int perThread = 200;
        try (KVStore kv = KVStore.create();
                NDArray zeros = NDArray.zeros(64);
                NDArray ones = NDArray.ones(64);
                NDArray out = NDArray.zeros(64)) {
            kv.init(new String[] {"shared", "a", "b", "c", "d"}, new NDArray[] {zeros, zeros, zeros, zeros, zeros});
            kv.setUpdater((key, index, merged, stored) -> stored.addInPlace(merged));
            String[] own = {"a", "b", "c", "d"};
            List<Thread> threads = new ArrayList<>();
            ConcurrentLinkedQueue<Throwable> errors = new ConcurrentLinkedQueue<>();
            for (int t = 0; t < THREADS; t++) {
                String mine = own[t];
                Thread thread = new Thread(() -> {
                    try {
                        for (int i = 0; i < perThread; i++) {
                            kv.push(new String[] {"shared", mine}, new NDArray[] {ones, ones});
                        }
                    } catch (Throwable e) {
                        errors.add(e);
                    }
                });
                threads.add(thread);
                thread.start();
            }
            for (Thread thread : threads) {
                thread.join();
            }
            assertTrue(errors.isEmpty(), () -> "errors: " + errors);
            kv.pull("shared", out);
            assertAll(THREADS * perThread, out);
            for (String k : own) {
                kv.pull(k, out);
                assertAll(perThread, out);
            }
        }
    }

    @Test
    @Timeout(60)
    void anUpdaterThatPullsItsOwnKeyEndsInsteadOfDeadlocking() throws InterruptedException {
        // No input may hang or crash the JVM (DESIGN.md section 4): a re-entrant call from
        // an updater must end, with a result or a KVStoreException. The call runs on a
        // daemon thread so that a deadlock fails this test instead of hanging the suite.
        KVStore kv = KVStore.create();
        NDArray ones = NDArray.ones(2);
        kv.init("k", ones).init("other", ones);
        kv.setUpdater((key, index, merged, stored) -> kv.pull("other", merged));
        // Any call on the store that runs the updater is refused, even for another key
        // (waiting could deadlock with another thread's push): the push fails, BACKEND,
        // with the refusal as its cause, and the key keeps its value.
        KVStoreException refused = assertThrows(KVStoreException.class, () -> kv.push("k", ones));
        assertEquals(KVStoreException.Code.BACKEND, refused.code());
        assertTrue(refused.getCause() instanceof KVStoreException cause
                && cause.code() == KVStoreException.Code.INVALID_ARGUMENT, () -> "cause: " + refused.getCause());
        kv.setUpdater((key, index, merged, stored) -> kv.pull("k", merged));
        ConcurrentLinkedQueue<Object> outcome = new ConcurrentLinkedQueue<>();
        Thread pusher = new Thread(() -> {
            try {
                kv.push("k", ones);
                outcome.add("returned");
            } catch (Throwable e) {
                outcome.add(e);
            }
        }, "kvstore-reentrant-push");
        pusher.setDaemon(true);
        pusher.start();
        pusher.join(10_000);
        assertTrue(!pusher.isAlive(),
                "push(\"k\") whose updater calls pull(\"k\") did not end within 10 s (deadlock in the native store)");
        Object result = outcome.peek();
        assertTrue("returned".equals(result) || result instanceof KVStoreException, () -> "outcome: " + result);
        kv.close();
        ones.close();
    }
}
