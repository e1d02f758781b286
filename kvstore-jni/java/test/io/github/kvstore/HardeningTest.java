package io.github.kvstore;

import static io.github.kvstore.Fixtures.assertAll;
import static io.github.kvstore.Fixtures.assertCode;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.kvstore.KVStoreException.Code;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Regression tests for issue 11 ("Hardening"): updaters replaced during pushes, metadata of
 * closed arrays, calls from inside an updater, and the contract items of the issue that the
 * Java API reaches.
 */
class HardeningTest {
    private static Thread daemon(String name, Runnable body) {
        Thread t = new Thread(body, name);
        t.setDaemon(true);
        return t;
    }

    /**
     * Item 7: three threads install fresh updaters and one collects garbage while two threads
     * push 1, 4 and 16 MB arrays. Every push must run an updater that is alive: none may fail with
     * "the updater was garbage-collected".
     */
    @Test
    @Timeout(120)
    void updatersReplacedDuringPushesAreNeverCollectedMidPush() throws InterruptedException {
        int[] sizes = {256 * 1024, 1024 * 1024, 4 * 1024 * 1024};
        List<NDArray> values = new ArrayList<>();
        try (KVStore kv = KVStore.create()) {
            for (int i = 0; i < sizes.length; i++) {
                values.add(NDArray.ones(sizes[i]));
                kv.init("k" + i, values.get(i));
            }
            AtomicBoolean stop = new AtomicBoolean();
            ConcurrentLinkedQueue<Throwable> failures = new ConcurrentLinkedQueue<>();
            AtomicInteger pushes = new AtomicInteger();
            AtomicInteger installs = new AtomicInteger();
            List<Thread> threads = new ArrayList<>();
            threads.add(daemon("collector", () -> {
                while (!stop.get()) {
                    System.gc();
                    Thread.onSpinWait();
                }
            }));
            for (int t = 0; t < 3; t++) {
                threads.add(daemon("setter-" + t, () -> {
                    try {
                        for (int i = 0; !stop.get(); i++) {
                            double tag = i;
                            // Captures `tag`: a fresh object each time, reachable only from the store.
                            kv.setUpdater((key, index, merged, stored) -> {
                                stored.copyFrom(merged);
                                if (tag < 0) {
                                    throw new AssertionError("unreachable");
                                }
                            });
                            installs.incrementAndGet();
                        }
                    } catch (Throwable e) {
                        failures.add(e);
                    }
                }));
            }
            for (int t = 0; t < 2; t++) {
                int first = t;
                threads.add(daemon("pusher-" + t, () -> {
                    for (int i = first; !stop.get(); i++) {
                        int k = i % sizes.length;
                        try {
                            kv.push("k" + k, values.get(k));
                            pushes.incrementAndGet();
                        } catch (Throwable e) {
                            failures.add(e);
                        }
                    }
                }));
            }
            threads.forEach(Thread::start);
            Thread.sleep(4000);
            stop.set(true);
            for (Thread t : threads) {
                t.join(60_000);
                assertFalse(t.isAlive(), t.getName() + " ended");
            }
            if (!failures.isEmpty()) {
                AssertionError e = new AssertionError(failures.size() + " of " + (pushes.get() + failures.size())
                        + " pushes or installs failed; the first: " + failures.peek());
                e.initCause(failures.peek());
                throw e;
            }
            assertTrue(pushes.get() >= 20 && installs.get() >= 20,
                    "pushes " + pushes.get() + ", installs " + installs.get());
        } finally {
            values.forEach(NDArray::close);
        }
    }

    /**
     * The fix of item 7 serialises setUpdater: an updater that calls setUpdater on its own store
     * while another thread waits in setUpdater for that very push must fail at once
     * (INVALID_ARGUMENT), not wait for the waiting thread.
     */
    @Test
    @Timeout(60)
    void setUpdaterFromItsOwnUpdaterFailsWhileAnotherThreadWaitsToReplaceIt() throws InterruptedException {
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(2);
                NDArray five = NDArray.full(new int[] {2}, 5);
                NDArray out = NDArray.zeros(2)) {
            CountDownLatch inUpdater = new CountDownLatch(1);
            CountDownLatch setterStarted = new CountDownLatch(1);
            AtomicReference<Throwable> nested = new AtomicReference<>();
            kv.init("k", ones).setUpdater((key, index, merged, stored) -> {
                inUpdater.countDown();
                try {
                    assertTrue(setterStarted.await(20, TimeUnit.SECONDS));
                    Thread.sleep(300); // the setter is now waiting for this push
                } catch (InterruptedException e) {
                    throw new AssertionError(e);
                }
                try {
                    kv.setUpdater(null);
                } catch (Throwable e) {
                    nested.set(e);
                }
                stored.copyFrom(merged);
            });
            AtomicReference<Throwable> pushed = new AtomicReference<>();
            Thread pusher = daemon("pusher", () -> {
                try {
                    kv.push("k", five);
                } catch (Throwable e) {
                    pushed.set(e);
                }
            });
            pusher.start();
            assertTrue(inUpdater.await(20, TimeUnit.SECONDS));
            AtomicReference<Throwable> set = new AtomicReference<>();
            Thread setter = daemon("setter", () -> {
                setterStarted.countDown();
                try {
                    kv.setUpdater((key, index, merged, stored) -> stored.copyFrom(merged.mul(2)));
                } catch (Throwable e) {
                    set.set(e);
                }
            });
            setter.start();
            pusher.join(20_000);
            setter.join(10_000);
            assertFalse(pusher.isAlive(), "the push ended (no deadlock)");
            assertFalse(setter.isAlive(), "setUpdater ended (no deadlock)");
            assertEquals(null, pushed.get());
            assertEquals(null, set.get());
            KVStoreException e = assertInstanceOf(KVStoreException.class, nested.get());
            assertEquals(Code.INVALID_ARGUMENT, e.code());
            kv.pull("k", out);
            assertAll(5f, out);
            // The waiting thread's updater was installed after the push.
            kv.push("k", ones).pull("k", out);
            assertAll(2f, out);
        }
    }

    /** "Calling init or setUpdater on a store from inside its own updater succeeds." */
    @Test
    void initAndSetUpdaterFromInsideTheStoresOwnUpdaterFailTheirPush() {
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(2);
                NDArray three = NDArray.full(new int[] {2}, 3);
                NDArray out = NDArray.zeros(2)) {
            kv.init("k", ones).setUpdater((key, index, merged, stored) -> {
                stored.copyFrom(merged);
                kv.init("other", merged);
            });
            KVStoreException e = assertCode(Code.BACKEND, () -> kv.push("k", three));
            assertEquals(Code.INVALID_ARGUMENT, assertInstanceOf(KVStoreException.class, e.getCause()).code());
            assertCode(Code.KEY_NOT_INITIALIZED, () -> kv.pull("other", out));
            kv.pull("k", out);
            assertAll(1f, out);

            Updater replacing = (key, index, merged, stored) -> {
                stored.copyFrom(merged);
                kv.setUpdater(null);
            };
            kv.setUpdater(replacing);
            e = assertCode(Code.BACKEND, () -> kv.push("k", three));
            assertEquals(Code.INVALID_ARGUMENT, assertInstanceOf(KVStoreException.class, e.getCause()).code());
            kv.pull("k", out);
            assertAll(1f, out);
            // The updater is still the one that failed: the nested setUpdater changed nothing.
            assertCode(Code.BACKEND, () -> kv.push("k", three));
            kv.setUpdater(null).push("k", three).pull("k", out);
            assertAll(3f, out);
        }
    }

    /** "Pulling an uninitialised key into an empty list of outs succeeds silently." */
    @Test
    void pullOfAnUninitialisedKeyIntoNoOutsIsKeyNotInitialized() {
        try (KVStore kv = KVStore.create(); NDArray ones = NDArray.ones(2)) {
            assertCode(Code.KEY_NOT_INITIALIZED, () -> kv.pull("missing", new NDArray[0]));
            kv.init("k", ones).pull("k", new NDArray[0]);
        }
    }

    /** "A negative learning rate is rejected today but MXNet accepts it": SGD at -1 accumulates. */
    @Test
    void sgdWithLearningRateMinusOneAddsEachPushToTheWeight() {
        Optimizer accumulate = Optimizer.sgd().learningRate(-1).build();
        assertEquals(-1.0, accumulate.params().get("learning_rate"));
        try (KVStore kv = KVStore.create();
                NDArray weight = NDArray.array(new float[] {1, 2}, new int[] {2});
                NDArray g1 = NDArray.array(new float[] {10, 20}, new int[] {2});
                NDArray g2 = NDArray.array(new float[] {0.5f, -4}, new int[] {2});
                NDArray out = NDArray.zeros(2)) {
            kv.init("w", weight).setOptimizer(accumulate);
            kv.push("w", g1).pull("w", out);
            assertEquals(List.of(11f, 22f), List.of(out.toFloatArray()[0], out.toFloatArray()[1]));
            kv.push("w", new NDArray[] {g1, g2}).pull("w", out);
            assertEquals(List.of(21.5f, 38f), List.of(out.toFloatArray()[0], out.toFloatArray()[1]));
        }
    }

    /** Item 4: "begin_num_update of 1e20 is accepted from Java (param) and wraps". */
    @Test
    void updateCountersBeyondTwoToThe53AreInvalidArgumentAtBuild() {
        KVStoreException e = assertCode(Code.INVALID_ARGUMENT,
                () -> Optimizer.sgd().param("begin_num_update", 1e20).build());
        assertTrue(e.getMessage().contains("begin_num_update"), e.getMessage());
        assertCode(Code.INVALID_ARGUMENT, () -> Optimizer.sgd().beginNumUpdate(Long.MAX_VALUE).build());
        assertCode(Code.INVALID_ARGUMENT, () -> Optimizer.adam().beginNumUpdate(-1).build());
        assertCode(Code.INVALID_ARGUMENT, () -> Optimizer.sgd().param("begin_num_update", 2.5).build());
        assertCode(Code.INVALID_ARGUMENT, () -> Optimizer.builder("sgd").param("begin_num_update", 1e20).build());
        Optimizer nearTheLimit = Optimizer.sgd().beginNumUpdate((1L << 53) - 10).build();
        try (KVStore kv = KVStore.create(); NDArray w = NDArray.ones(2); NDArray out = NDArray.zeros(2)) {
            kv.init("w", w).setOptimizer(nearTheLimit).push("w", w).pull("w", out);
            assertTrue(Float.isFinite(out.toFloatArray()[0]), "a finite weight: " + out);
        }
    }

    /**
     * "shape(), dtype(), size() work after close(); the Javadoc says everything but close,
     * isClosed, toString is DISPOSED."
     */
    @Test
    void everyMethodOfAClosedArrayButCloseIsClosedAndToStringIsDisposed() {
        NDArray a = NDArray.ones(2, 3);
        a.close();
        assertTrue(a.isClosed());
        assertEquals("<NDArray closed>", a.toString());
        assertCode(Code.DISPOSED, a::shape);
        assertCode(Code.DISPOSED, a::dtype);
        assertCode(Code.DISPOSED, a::size);
        assertCode(Code.DISPOSED, a::ndim);
        assertCode(Code.DISPOSED, a::context);
        assertCode(Code.DISPOSED, a::toFloatArray);
        a.close();
        assertTrue(a.isClosed());
    }

    /** The arrays an updater gets are valid only during its call, metadata included. */
    @Test
    void theArraysOfAnUpdaterCallAreDisposedAfterIt() {
        AtomicReference<NDArray> kept = new AtomicReference<>();
        try (KVStore kv = KVStore.create(); NDArray ones = NDArray.ones(2, 3)) {
            kv.init("k", ones).setUpdater((key, index, merged, stored) -> {
                assertEquals(6, merged.size());
                kept.set(stored);
                stored.copyFrom(merged);
            });
            kv.push("k", ones);
        }
        NDArray stored = kept.get();
        assertTrue(stored.isClosed());
        assertEquals("<NDArray closed>", stored.toString());
        assertCode(Code.DISPOSED, stored::shape);
        assertCode(Code.DISPOSED, stored::toFloatArray);
    }
}
