package io.github.kvstore;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;

/** The non-blocking calls: futures, their errors, pending outs, order and Java updaters. */
class AsyncTest {
    private static final int[] SHAPE = {2, 3};

    private static float[] filled(float v) {
        float[] a = new float[6];
        java.util.Arrays.fill(a, v);
        return a;
    }

    /** stored = merged, after a pause: keeps calls queued while the test looks at them. */
    private static void slowAssign(String key, int index, NDArray merged, NDArray stored) {
        try {
            Thread.sleep(20);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        stored.copyFrom(merged);
    }

    /** An updater that waits for {@code gate} (10 s at most), then assigns. */
    private static Updater gatedAssign(CountDownLatch gate) {
        return (key, index, merged, stored) -> {
            try {
                gate.await(10, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            stored.copyFrom(merged);
        };
    }

    /**
     * A store whose key "w" (zeros) has {@link #gatedAssign} for updater, with a value of
     * 4s to push and an out; closing it opens the gate first.
     */
    private static final class Gated implements AutoCloseable {
        final CountDownLatch release = new CountDownLatch(1);
        final KVStore kv = KVStore.create("local");
        final NDArray four = NDArray.full(SHAPE, 4);
        final NDArray out = NDArray.zeros(SHAPE);

        Gated() {
            try (NDArray zeros = NDArray.zeros(SHAPE)) {
                kv.init("w", zeros);
            }
            kv.setUpdater(gatedAssign(release));
        }

        @Override
        public void close() {
            release.countDown();
            kv.close();
            Fixtures.closeAll(four, out);
        }
    }

    @Test
    void futuresCompleteAndPendingOutsWaitForThePull() throws Exception {
        try (Gated g = new Gated()) {
            // The updater (on the store's engine thread) waits until the test lets it go:
            // had the calls blocked, they would have waited out the latch's 10 s here.
            long t0 = System.nanoTime();
            CompletableFuture<Void> pushed = g.kv.async().push("w", g.four);
            CompletableFuture<Void> pulled = g.kv.async().pull("w", g.out);
            assertTrue(System.nanoTime() - t0 < TimeUnit.SECONDS.toNanos(5), "the calls did not return at once");
            assertFalse(pushed.isDone());
            assertFalse(pulled.isDone());
            g.release.countDown();
            // Reading the out waits for the pull, which sees the push.
            assertArrayEquals(filled(4), g.out.toFloatArray());
            assertNull(pushed.get(10, TimeUnit.SECONDS));
            assertNull(pulled.get(10, TimeUnit.SECONDS));
        }
    }

    /**
     * An array that another store's queued pull writes is pushed after that pull wrote it:
     * the push waits, when it is made, for the pull (the store's gate opens 50 ms later,
     * from another thread).
     */
    @Test
    void anArrayAnotherStoresPullWritesIsPushedAfterThatWrite() throws Exception {
        try (Gated g = new Gated();
                KVStore b = KVStore.create("local");
                NDArray x = NDArray.ones(SHAPE);
                NDArray zeros = NDArray.zeros(SHAPE);
                NDArray got = NDArray.zeros(SHAPE)) {
            b.init("w", zeros);
            CompletableFuture<Void> pushed = g.kv.async().push("w", g.four);
            CompletableFuture<Void> pulled = g.kv.async().pull("w", x);
            Thread opener = new Thread(() -> {
                try {
                    Thread.sleep(50);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                g.release.countDown();
            });
            opener.start();
            b.async().push("w", x).get(20, TimeUnit.SECONDS);
            b.pull("w", got);
            for (float v : got.toFloatArray()) {
                assertEquals(4f, v, "the push summed the array before the other store's pull wrote it");
            }
            pushed.get(20, TimeUnit.SECONDS);
            pulled.get(20, TimeUnit.SECONDS);
            opener.join();
        }
    }

    /**
     * A blocking pull of many keys into one out writes it key after key: it ends with the
     * value of the key initialised last, whichever threads share the copies.
     */
    @Test
    void aBlockingPullOfManyKeysIntoOneOutEndsWithTheLastKeysValue() {
        int n = 256;
        String[] keys = new String[n];
        NDArray[] values = new NDArray[n];
        try (KVStore kv = KVStore.create("local"); NDArray out = NDArray.zeros(256)) {
            for (int i = 0; i < n; i++) {
                keys[i] = "k" + i;
                values[i] = NDArray.full(new int[] {256}, i);
            }
            kv.init(keys, values);
            NDArray[] outs = new NDArray[n];
            java.util.Arrays.fill(outs, out);
            for (int round = 0; round < 20; round++) {
                kv.pull(keys, outs);
                for (float v : out.toFloatArray()) {
                    assertEquals(n - 1f, v, "round " + round);
                }
            }
        } finally {
            Fixtures.closeAll(values);
        }
    }

    @Test
    void aFailedCallCompletesItsFutureExceptionallyWithTheBlockingCallsException() throws Exception {
        try (KVStore kv = KVStore.create("local");
                NDArray two = NDArray.full(SHAPE, 2);
                NDArray wrong = NDArray.zeros(3)) {
            kv.init("w", two);
            ExecutionException missing = assertThrows(ExecutionException.class,
                    () -> kv.async().pull("nope", two).get(10, TimeUnit.SECONDS));
            KVStoreException e = assertInstanceOf(KVStoreException.class, missing.getCause());
            assertEquals(KVStoreException.Code.KEY_NOT_INITIALIZED, e.code());
            ExecutionException shape = assertThrows(ExecutionException.class,
                    () -> kv.async().push("w", wrong).get(10, TimeUnit.SECONDS));
            KVStoreException s = assertInstanceOf(KVStoreException.class, shape.getCause());
            assertEquals(KVStoreException.Code.SHAPE_MISMATCH, s.code());
            assertEquals("w", s.key());
            // join() wraps it as every CompletableFuture does (docs/nonblocking.md).
            CompletionException joined = assertThrows(CompletionException.class,
                    () -> kv.async().push("w", wrong).join());
            KVStoreException j = assertInstanceOf(KVStoreException.class, joined.getCause());
            assertEquals(KVStoreException.Code.SHAPE_MISMATCH, j.code());
            // Nothing changed.
            try (NDArray w = kv.pull("w")) {
                assertArrayEquals(filled(2), w.toFloatArray());
            }
            kv.waitAll();
        }
    }

    @Test
    void aThrowingJavaUpdaterFailsOnlyItsOwnFutureWithItsExceptionAsTheCause() throws Exception {
        try (KVStore kv = KVStore.create("local");
                NDArray zeros = NDArray.zeros(SHAPE);
                NDArray one = NDArray.ones(SHAPE)) {
            kv.init(new String[] {"ok", "bad"}, new NDArray[] {zeros, zeros});
            kv.setUpdater((key, index, merged, stored) -> {
                if (key.equals("bad")) {
                    throw new IllegalStateException("the updater refuses " + key);
                }
                stored.addInPlace(merged);
            });
            CompletableFuture<Void> before = kv.async().push("ok", one);
            CompletableFuture<Void> failing = kv.async().push("bad", one);
            CompletableFuture<Void> after = kv.async().push("ok", one);
            before.get(10, TimeUnit.SECONDS);
            ExecutionException e = assertThrows(ExecutionException.class, () -> failing.get(10, TimeUnit.SECONDS));
            KVStoreException k = assertInstanceOf(KVStoreException.class, e.getCause());
            assertEquals(KVStoreException.Code.BACKEND, k.code());
            assertInstanceOf(IllegalStateException.class, k.getCause());
            after.get(10, TimeUnit.SECONDS);
            try (NDArray ok = kv.pull("ok"); NDArray bad = kv.pull("bad")) {
                assertArrayEquals(filled(2), ok.toFloatArray());
                assertArrayEquals(filled(0), bad.toFloatArray());
            }
        }
    }

    @Test
    void callsOnOneKeyTakeEffectInOrderAndClosingWaitsForThem() throws Exception {
        NDArray out = NDArray.zeros(SHAPE);
        List<CompletableFuture<Void>> futures = new ArrayList<>();
        try (KVStore kv = KVStore.create("local"); NDArray zeros = NDArray.zeros(SHAPE)) {
            kv.init("w", zeros);
            kv.setUpdater((key, index, merged, stored) -> stored.addInPlace(merged));
            for (int i = 1; i <= 20; i++) {
                try (NDArray v = NDArray.full(SHAPE, i)) {
                    futures.add(kv.async().push("w", new NDArray[] {v}, i % 3));
                }
            }
            futures.add(kv.async().pushpull("w", new NDArray[] {}, new NDArray[] {out}));
        }
        // close() waited for every call: 1 + 2 + ... + 20.
        assertArrayEquals(filled(210), out.toFloatArray());
        CompletableFuture.allOf(futures.toArray(new CompletableFuture<?>[0])).get(10, TimeUnit.SECONDS);
        out.close();
    }

    @Test
    void everyFormMatchesItsBlockingTwin() throws Exception {
        try (KVStore a = KVStore.create("local");
                KVStore b = KVStore.create("local");
                NDArray zeros = NDArray.zeros(SHAPE);
                NDArray v1 = NDArray.full(SHAPE, 1.5);
                NDArray v2 = NDArray.full(SHAPE, -2)) {
            for (KVStore kv : new KVStore[] {a, b}) {
                kv.init(new String[] {"x", "y"}, new NDArray[] {zeros, zeros});
            }
            NDArray[] outsA = {NDArray.zeros(SHAPE), NDArray.zeros(SHAPE)};
            NDArray[] outsB = {NDArray.zeros(SHAPE), NDArray.zeros(SHAPE)};
            a.push("x", new NDArray[] {v1, v2}).pushpull(new String[] {"x", "y"}, new NDArray[] {v1, v2}, outsA);
            b.async().push("x", new NDArray[] {v1, v2});
            b.async().pushpull(new String[] {"x", "y"}, new NDArray[] {v1, v2}, outsB).get(10, TimeUnit.SECONDS);
            for (int i = 0; i < 2; i++) {
                assertArrayEquals(outsA[i].toFloatArray(), outsB[i].toFloatArray());
            }
            a.broadcast("z", v2, outsA);
            b.async().broadcast("z", v2, outsB).get(10, TimeUnit.SECONDS);
            assertArrayEquals(outsA[1].toFloatArray(), outsB[1].toFloatArray());
            a.pull(new String[] {"x", "z"}, outsA);
            b.async().pull(new String[] {"x", "z"}, outsB).get(10, TimeUnit.SECONDS);
            assertArrayEquals(outsA[0].toFloatArray(), outsB[0].toFloatArray());
            assertArrayEquals(outsA[1].toFloatArray(), outsB[1].toFloatArray());
            Fixtures.closeAll(outsA);
            Fixtures.closeAll(outsB);
        }
    }

    @Test
    void futuresThatNoThreadWaitsForRunTheirDependents() throws Exception {
        int calls = 2000;
        CountDownLatch ran = new CountDownLatch(calls + 1);
        List<KVStoreException.Code> failures = new java.util.concurrent.CopyOnWriteArrayList<>();
        try (KVStore kv = KVStore.create("local"); NDArray zeros = NDArray.zeros(SHAPE); NDArray one = NDArray.ones(SHAPE)) {
            kv.init(new String[] {"a", "b"}, new NDArray[] {zeros, zeros});
            kv.setUpdater((key, index, merged, stored) -> stored.addInPlace(merged));
            for (int i = 0; i < calls; i++) {
                kv.async().push(i % 2 == 0 ? "a" : "b", one).thenRun(ran::countDown);
            }
            kv.async().pull("missing", one).whenComplete((v, e) -> {
                failures.add(e instanceof KVStoreException k ? k.code() : null);
                ran.countDown();
            });
            // Nothing waits for a future: the completer takes them as they finish.
            assertTrue(ran.await(10, TimeUnit.SECONDS), "dependents did not run: " + ran.getCount() + " left");
            assertEquals(List.of(KVStoreException.Code.KEY_NOT_INITIALIZED), failures);
            try (NDArray a = kv.pull("a")) {
                assertArrayEquals(filled(calls / 2), a.toFloatArray());
            }
        }
    }

    @Test
    void afterWaitAllEveryFutureIsDone() {
        try (KVStore kv = KVStore.create("local"); NDArray zeros = NDArray.zeros(SHAPE); NDArray one = NDArray.ones(SHAPE)) {
            kv.init("w", zeros);
            kv.setUpdater(AsyncTest::slowAssign);
            List<CompletableFuture<Void>> futures = new ArrayList<>();
            for (int i = 0; i < 5; i++) {
                futures.add(kv.async().push("w", one));
            }
            futures.add(kv.async().push("missing", one));
            kv.waitAll();
            for (CompletableFuture<Void> f : futures) {
                assertTrue(f.isDone());
            }
            assertTrue(futures.get(5).isCompletedExceptionally());
        }
    }

    @Test
    void aClosedStoreFailsTheFutureWithDisposed() {
        KVStore kv = KVStore.create("local");
        kv.close();
        try (NDArray one = NDArray.ones(SHAPE)) {
            ExecutionException e = assertThrows(ExecutionException.class,
                    () -> kv.async().push("w", one).get(10, TimeUnit.SECONDS));
            assertEquals(KVStoreException.Code.DISPOSED, ((KVStoreException) e.getCause()).code());
        }
    }

    /**
     * Runs a {@link CompleterProbe} scenario in a fresh JVM (a stuck completer there stalls
     * no other test) and asserts that it passed all its {@code steps}.
     */
    private static void assertProbePasses(String scenario, int steps) throws Exception {
        ChildJvm.Result run = ChildJvm.run(CompleterProbe.class, List.of(), Map.of(), 300, scenario);
        assertEquals(0, run.exit, run::toString);
        assertEquals(steps, run.out.lines().filter(l -> l.startsWith("ok: ")).count(), run::toString);
        assertTrue(run.out.endsWith("done\n"), run::toString);
    }

    /**
     * Issue 38, finding 1: a dependent stage that waits for another call's future
     * ({@code join}, {@code get}), even one taken in the same batch as its own, once
     * waited on the one thread that completes futures, for good.
     */
    @Test
    void aDependentStageMayWaitForAnotherCallsFuture() throws Exception {
        assertProbePasses("join-in-stage", 4);
    }

    /**
     * Issue 38, finding 1: while a dependent stage blocks, the futures of other calls, of
     * any store, complete, their dependents run, and {@code waitAll} returns.
     */
    @Test
    void aBlockedDependentStageHoldsUpNoOtherFutureNorWaitAll() throws Exception {
        assertProbePasses("blocked-stage", 6);
    }

    /**
     * Issue 38, finding 2: a call cannot be withdrawn once submitted, so {@code cancel}
     * is refused, with either argument, and the future completes with the call.
     */
    @Test
    void cancelIsRefusedAndTheCallStillTakesEffect() throws Exception {
        try (Gated g = new Gated()) {
            CompletableFuture<Void> pushed = g.kv.async().push("w", g.four);
            assertFalse(pushed.cancel(true), "cancel(true) of a submitted call was accepted");
            assertFalse(pushed.cancel(false), "cancel(false) of a submitted call was accepted");
            assertFalse(pushed.isCancelled());
            assertFalse(pushed.isDone());
            g.release.countDown();
            assertNull(pushed.get(10, TimeUnit.SECONDS));
            assertFalse(pushed.isCancelled());
            try (NDArray w = g.kv.pull("w")) {
                assertArrayEquals(filled(4), w.toFloatArray());
            }
        }
    }

    /**
     * Issue 54: a call's future is completed by its call only. Completing it by hand
     * ({@code complete}, {@code completeExceptionally}, {@code obtrude...}, and the forms
     * that complete it later) is refused while the call is pending, so it never reports
     * done (or failed) before the call has taken effect; dependents and copies still work.
     */
    @Test
    void aPendingCallsFutureCannotBeCompletedByHand() throws Exception {
        try (Gated g = new Gated()) {
            CompletableFuture<Void> pushed = g.kv.async().push("w", g.four);
            CompletableFuture<Integer> dependent = pushed.thenApply(v -> 7);
            CompletableFuture<Void> copy = pushed.copy();
            assertThrows(UnsupportedOperationException.class, () -> pushed.complete(null));
            assertThrows(UnsupportedOperationException.class,
                    () -> pushed.completeExceptionally(new IllegalStateException("by hand")));
            assertThrows(UnsupportedOperationException.class, () -> pushed.obtrudeValue(null));
            assertThrows(UnsupportedOperationException.class,
                    () -> pushed.obtrudeException(new IllegalStateException("by hand")));
            assertThrows(UnsupportedOperationException.class, () -> pushed.completeAsync(() -> null));
            assertThrows(UnsupportedOperationException.class,
                    () -> pushed.completeAsync(() -> null, Runnable::run));
            assertThrows(UnsupportedOperationException.class, () -> pushed.orTimeout(1, TimeUnit.MILLISECONDS));
            assertThrows(UnsupportedOperationException.class,
                    () -> pushed.completeOnTimeout(null, 1, TimeUnit.MILLISECONDS));
            Thread.sleep(50);
            assertFalse(pushed.isDone(), "the future of a pending call reports done");
            assertFalse(pushed.isCompletedExceptionally());
            assertFalse(dependent.isDone(), "a dependent ran before the call");
            // A copy is the caller's own future: it may be completed, and that leaves
            // the call's future as it was.
            assertTrue(copy.complete(null));
            assertFalse(pushed.isDone());
            g.release.countDown();
            assertNull(pushed.get(10, TimeUnit.SECONDS));
            assertEquals(7, dependent.get(10, TimeUnit.SECONDS));
            try (NDArray w = g.kv.pull("w")) {
                assertArrayEquals(filled(4), w.toFloatArray());
            }
            // Done, its outcome cannot be rewritten either.
            assertThrows(UnsupportedOperationException.class, () -> pushed.obtrudeException(new IllegalStateException()));
            assertThrows(UnsupportedOperationException.class, () -> pushed.complete(null));
            assertNull(pushed.getNow(null));
            assertFalse(pushed.isCompletedExceptionally());
        }
    }

    /** A wait for a pull into {@code out} of key "w" of {@code kv}: what it returns, or throws. */
    @FunctionalInterface
    private interface PullWait {
        Object run(KVStore kv, NDArray out) throws Exception;
    }

    /**
     * How an interrupted wait ended: with what, by the deadline after the interrupt (null
     * if it was still waiting), and in the end.
     */
    private record Ended(Object byDeadline, Object atEnd) {}

    /**
     * Runs {@code wait} on a thread while a push of 4 to "w" is held at a gate, interrupts
     * the thread 100 ms in and gives it {@code deadlineMillis} to end; then opens the gate,
     * lets the thread end, and asserts that the pull still wrote the push's 4.
     */
    private static Ended interruptedWait(PullWait wait, long deadlineMillis) throws Exception {
        try (Gated g = new Gated()) {
            g.kv.async().push("w", g.four);
            AtomicReference<Object> ended = new AtomicReference<>();
            Thread waiter = new Thread(() -> {
                try {
                    ended.set(wait.run(g.kv, g.out));
                } catch (Exception e) {
                    ended.set(e);
                }
            }, "kvstore-test-waiter");
            waiter.setDaemon(true);
            waiter.start();
            Thread.sleep(100);
            waiter.interrupt();
            waiter.join(deadlineMillis);
            Object byDeadline = waiter.isAlive() ? null : ended.get();
            g.release.countDown();
            waiter.join(10_000);
            assertFalse(waiter.isAlive(), "the wait did not end after the push ran");
            // The pull ran, interrupt or not.
            assertArrayEquals(filled(4), g.out.toFloatArray());
            return new Ended(byDeadline, ended.get());
        }
    }

    /**
     * Issue 38, finding 3, as documented on {@link KVStore#pull(String[], NDArray[], int)}:
     * an interrupt does not stop a blocking call that waits for queued calls; it returns
     * when done, its out written, with the thread's interrupt status still set.
     */
    @Test
    void anInterruptLeavesABlockingPullToFinishWithTheStatusSet() throws Exception {
        Ended e = interruptedWait((kv, out) -> {
            kv.pull("w", out);
            return Thread.currentThread().isInterrupted() ? "interrupt status set" : "interrupt status cleared";
        }, 300);
        assertNull(e.byDeadline(), "the pull returned before the push it waits for ran");
        assertEquals("interrupt status set", e.atEnd());
    }

    /**
     * What the blocking calls' documentation offers instead: a wait for a non-blocking
     * call's future ends at once on an interrupt, and the call still takes effect.
     */
    @Test
    void anInterruptEndsAWaitForAFutureButNotItsCall() throws Exception {
        Ended e = interruptedWait((kv, out) -> kv.async().pull("w", out).get(), 10_000);
        assertInstanceOf(InterruptedException.class, e.byDeadline(), "get did not end on the interrupt");
    }
}
