package io.github.kvstore;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

/**
 * A tiny program that {@link AsyncTest} runs in a fresh JVM: dependent stages of
 * non-blocking calls that wait, which once stopped every future of the JVM for good (issue
 * 38), so that a failure here cannot stall the tests that run after it. {@code args[0]}
 * names the scenario. Each step that passes prints {@code ok: STEP}; a step still running
 * after {@link #STEP_SECONDS} prints {@code timed out: STEP} and ends the process at once
 * with status 3; a wrong result prints {@code wrong: ...} and exits with status 4.
 */
public final class CompleterProbe {
    /** How long one step may take, far more than any of them needs. */
    static final long STEP_SECONDS = 10;
    private static final int[] SHAPE = {2, 3};

    private static volatile String step = "starting";
    /**
     * What the stores' updater waits for before it adds: a call is held at the gate until
     * its dependents are attached (attached to a done future, a dependent would run at
     * once on the thread that attaches it).
     */
    private static volatile CountDownLatch gate = new CountDownLatch(0);
    private static volatile long stepStart = System.nanoTime();

    private CompleterProbe() {}

    /**
     * Entry point.
     *
     * @param args the scenario: {@code join-in-stage} or {@code blocked-stage}
     * @throws Exception if a step fails other than by timing out
     */
    public static void main(String[] args) throws Exception {
        Thread watchdog = new Thread(CompleterProbe::watch, "probe-watchdog");
        watchdog.setDaemon(true);
        watchdog.start();
        switch (args[0]) {
            case "join-in-stage" -> joinInStage();
            case "blocked-stage" -> blockedStage();
            default -> throw new IllegalArgumentException("no scenario " + args[0]);
        }
        System.out.println("done");
    }

    /** Ends the process if a step runs past {@link #STEP_SECONDS}. */
    private static void watch() {
        while (true) {
            try {
                Thread.sleep(50);
            } catch (InterruptedException e) {
                return;
            }
            if (System.nanoTime() - stepStart > TimeUnit.SECONDS.toNanos(STEP_SECONDS)) {
                System.out.println("timed out: " + step);
                System.out.flush();
                // halt, not exit: a stuck thread must not hold the process up in a hook.
                Runtime.getRuntime().halt(3);
            }
        }
    }

    private static void step(String what) {
        stepStart = System.nanoTime();
        step = what;
    }

    private static void ok() {
        System.out.println("ok: " + step);
    }

    private static void expect(float expected, NDArray a) {
        float got = a.toFloatArray()[0];
        if (got != expected) {
            System.out.println("wrong: " + step + ": read " + got + ", expected " + expected);
            System.exit(4);
        }
    }

    /** stored += merged, once the {@link #gate} opens. */
    private static void gatedAdd(String key, int index, NDArray merged, NDArray stored) {
        try {
            gate.await();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        stored.addInPlace(merged);
    }

    /** Stages that wait for another call of the same store, with join and with get. */
    private static void joinInStage() throws Exception {
        try (KVStore kv = KVStore.create("local");
                NDArray zeros = NDArray.zeros(SHAPE);
                NDArray two = NDArray.full(SHAPE, 2);
                NDArray three = NDArray.full(SHAPE, 3);
                NDArray out = NDArray.zeros(SHAPE);
                NDArray out2 = NDArray.zeros(SHAPE)) {
            kv.init("w", zeros);
            kv.setUpdater(CompleterProbe::gatedAdd);

            step("a stage that joins a pull's future");
            gate = new CountDownLatch(1);
            CompletableFuture<Void> joining = kv.async().push("w", two).thenRun(() -> kv.async().pull("w", out).join());
            gate.countDown();
            joining.get();
            expect(2, out);
            ok();

            step("a stage that gets a pull's future");
            gate = new CountDownLatch(1);
            CompletableFuture<Void> getting = kv.async().push("w", three).thenRun(() -> {
                try {
                    kv.async().pull("w", out2).get();
                } catch (InterruptedException | ExecutionException e) {
                    throw new CompletionException(e);
                }
            });
            gate.countDown();
            getting.get();
            expect(5, out2);
            ok();

            step("a chain of stages, each joining the next call's future");
            // The calls finish one right after the other once the gate opens: the
            // completer takes most of them at once, so a stage waits for a call taken
            // with its own.
            gate = new CountDownLatch(1);
            List<CompletableFuture<Void>> calls = new ArrayList<>();
            for (int i = 0; i < 20; i++) {
                calls.add(kv.async().push("w", two));
            }
            List<CompletableFuture<Void>> stages = new ArrayList<>();
            for (int i = 0; i < 19; i++) {
                CompletableFuture<Void> next = calls.get(i + 1);
                stages.add(calls.get(i).thenRun(next::join));
            }
            gate.countDown();
            CompletableFuture.allOf(stages.toArray(new CompletableFuture<?>[0])).get();
            kv.pull("w", out);
            expect(5 + 20 * 2, out);
            ok();

            step("calls after the stages complete, and waitAll returns");
            kv.async().push("w", two).get();
            kv.waitAll();
            ok();
        }
    }

    /**
     * A stage that blocks until the end: meanwhile every other future completes, in this
     * store and another, and waitAll returns with every call's future done.
     */
    private static void blockedStage() throws Exception {
        CountDownLatch release = new CountDownLatch(1);
        CountDownLatch entered = new CountDownLatch(1);
        try (KVStore a = KVStore.create("local");
                KVStore b = KVStore.create("local");
                NDArray zeros = NDArray.zeros(SHAPE);
                NDArray one = NDArray.ones(SHAPE);
                NDArray out = NDArray.zeros(SHAPE)) {
            a.init("w", zeros);
            b.init("w", zeros);
            a.setUpdater(CompleterProbe::gatedAdd);

            step("a stage that blocks starts");
            gate = new CountDownLatch(1);
            CompletableFuture<Void> blocked = a.async().push("w", one).thenRun(() -> {
                entered.countDown();
                try {
                    release.await();
                } catch (InterruptedException e) {
                    throw new CompletionException(e);
                }
            });
            gate.countDown();
            entered.await();
            ok();

            step("another store's future completes while the stage blocks");
            b.async().push("w", one).get();
            ok();

            step("the same store's future completes while the stage blocks");
            a.async().push("w", one).get();
            ok();

            step("a dependent of a future no thread waits for runs while the stage blocks");
            CountDownLatch ran = new CountDownLatch(1);
            b.async().push("w", one).thenRun(ran::countDown);
            ran.await();
            ok();

            step("waitAll returns while the stage blocks, every future done");
            List<CompletableFuture<Void>> futures = new ArrayList<>();
            for (int i = 0; i < 50; i++) {
                futures.add(a.async().push("w", one));
            }
            a.waitAll();
            for (CompletableFuture<Void> f : futures) {
                if (!f.isDone()) {
                    System.out.println("wrong: " + step + ": a future is not done after waitAll");
                    System.exit(4);
                }
            }
            a.pull("w", out);
            expect(52, out);
            ok();

            step("the blocked stage completes once let go");
            release.countDown();
            blocked.get();
            ok();
        }
    }
}
