package io.github.kvstore;

import static io.github.kvstore.Fixtures.assertAll;
import static io.github.kvstore.Fixtures.assertCode;
import static io.github.kvstore.Fixtures.assertNpe;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.kvstore.KVStoreException.Code;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.function.Supplier;
import java.util.stream.Stream;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;
import org.junit.jupiter.api.io.TempDir;

/**
 * Optimizers through the Java API: MXNet's reference cases 12 and 13, schedules and
 * multipliers reaching the store, state files, and every factory.
 */
class OptimizerTest {
    private static final int[] SHAPE = {2, 3};
    private static final float EPS = 1e-6f;

    private static void assertClose(float expected, NDArray a) {
        float[] values = a.toFloatArray();
        float[] want = new float[values.length];
        Arrays.fill(want, expected);
        assertArrayEquals(want, values, EPS, () -> "values of " + a);
    }

    @Test
    void sgdWithItsDefaultsTurnsZerosPushedOnesIntoMinusOneHundredth() {
        // Reference case 12.
        try (KVStore kv = KVStore.create();
                NDArray zeros = NDArray.zeros(2, 2);
                NDArray ones = NDArray.ones(2, 2);
                NDArray out = NDArray.zeros(2, 2)) {
            kv.init("3", zeros);
            assertNull(kv.optimizerName(), "no optimizer yet");
            kv.setOptimizer(Optimizer.sgd().build());
            assertEquals("sgd", kv.optimizerName());
            kv.push("3", ones).pull("3", out);
            assertAll(-0.01f, out);
            kv.setUpdater(null);
            assertNull(kv.optimizerName(), "the default updater replaced the optimizer");
        }
    }

    @Test
    void sgdWithMomentumOnTwoKeysGivesMxnetsValues() {
        // Reference case 13: keys inited ['w1', 'w0'], two pushes of g0 = 1, g1 = 2.
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(SHAPE);
                NDArray g1 = NDArray.full(SHAPE, 2.0);
                NDArray w0 = NDArray.zeros(SHAPE);
                NDArray w1 = NDArray.zeros(SHAPE)) {
            kv.init(new String[] {"w1", "w0"}, new NDArray[] {ones, ones});
            kv.setOptimizer(Optimizer.sgd().learningRate(0.1).momentum(0.9).build());
            for (int i = 0; i < 2; i++) {
                kv.push(new String[] {"w0", "w1"}, new NDArray[] {ones, g1});
            }
            kv.pull(new String[] {"w0", "w1"}, new NDArray[] {w0, w1});
            assertClose(0.71f, w0);
            assertClose(0.42f, w1);
        }
    }

    @Test
    void theScheduleAndThePerKeyMultipliersReachTheUpdates() {
        // lr 1, halved after every update; "w" at half rate; "d" with wd 0.5, "n" with none.
        Optimizer opt = Optimizer.sgd()
                .learningRate(1)
                .wd(0.5)
                .lrScheduler(LrScheduler.factor(1, 0.5))
                .lrMult("w", 0.5)
                .wdMult("w", 0)
                .wdMult("n", 0)
                .build();
        try (KVStore kv = KVStore.create();
                NDArray zeros = NDArray.zeros(SHAPE);
                NDArray ones = NDArray.ones(SHAPE);
                NDArray out = NDArray.zeros(SHAPE)) {
            kv.init(new String[] {"w", "n", "d"}, new NDArray[] {zeros, ones, ones}).setOptimizer(opt);
            kv.push("w", ones).push("w", ones).pull("w", out);
            assertClose(-0.5f - 0.25f, out);
            // num_update stays 2 (the largest count of any key): the schedule's rate is 0.5.
            kv.push("n", ones).pull("n", out);
            assertClose(1 - 0.5f, out);
            kv.push("d", ones).pull("d", out);
            assertClose((1 - 0.5f * 0.5f) * 1 - 0.5f, out);
        }
    }

    /** Two keys, SGD with momentum and a schedule: state that a file must carry. */
    private static Optimizer stateful() {
        return Optimizer.sgd()
                .learningRate(0.1)
                .momentum(0.9)
                .lrScheduler(LrScheduler.multiFactor(new long[] {2, 3}, 0.5))
                .build();
    }

    private static float[][] train(KVStore kv, NDArray g, NDArray out, int pushes) {
        for (int i = 0; i < pushes; i++) {
            kv.push(new String[] {"a", "b"}, new NDArray[] {g, g});
        }
        kv.pull("a", out);
        float[] a = out.toFloatArray();
        kv.pull("b", out);
        return new float[][] {a, out.toFloatArray()};
    }

    @Test
    void savedStatesLoadedIntoAFreshStoreContinueIdentically(@TempDir Path dir) {
        String file = dir.resolve("sgd.states").toString();
        try (KVStore kv = KVStore.create();
                KVStore fresh = KVStore.create();
                KVStore unloaded = KVStore.create();
                NDArray ones = NDArray.ones(SHAPE);
                NDArray g = NDArray.full(SHAPE, 0.5);
                NDArray out = NDArray.zeros(SHAPE)) {
            kv.init(new String[] {"a", "b"}, new NDArray[] {ones, ones}).setOptimizer(stateful());
            float[][] midway = train(kv, g, out, 2);
            assertTrue(midway[0][0] < 1f, "the weights moved");
            assertSame(kv, kv.saveOptimizerStates(file));
            assertTrue(Files.isRegularFile(Path.of(file)));
            float[][] expected = train(kv, g, out, 3);

            // A fresh store with the weights of the midway point and the saved state.
            try (NDArray a = NDArray.array(midway[0], SHAPE);
                    NDArray b = NDArray.array(midway[1], SHAPE)) {
                fresh.init(new String[] {"a", "b"}, new NDArray[] {a, b}).setOptimizer(stateful());
                assertSame(fresh, fresh.loadOptimizerStates(file));
                float[][] resumed = train(fresh, g, out, 3);
                assertArrayEquals(expected[0], resumed[0]);
                assertArrayEquals(expected[1], resumed[1]);

                // Without the file the momentum and the schedule start afresh: other values.
                unloaded.init(new String[] {"a", "b"}, new NDArray[] {a, b}).setOptimizer(stateful());
                assertFalse(Arrays.equals(expected[0], train(unloaded, g, out, 3)[0]));
            }
        }
    }

    @Test
    void aCheckpointResumesTrainingExactlyInAFreshStore(@TempDir Path dir) throws IOException {
        String file = dir.resolve("store.ckpt").toString();
        try (KVStore kv = KVStore.create();
                KVStore resumed = KVStore.create("device");
                NDArray ones = NDArray.ones(SHAPE);
                NDArray g = NDArray.full(SHAPE, 0.5);
                NDArray out = NDArray.zeros(SHAPE)) {
            kv.init(new String[] {"a", "b"}, new NDArray[] {ones, ones}).setOptimizer(stateful());
            train(kv, g, out, 2);
            assertSame(kv, kv.saveCheckpoint(file));
            float[][] expected = train(kv, g, out, 3);
            // Nothing in the fresh store: the file brings the keys, the weights, the
            // optimizer and its state.
            assertSame(resumed, resumed.loadCheckpoint(file));
            assertEquals("sgd", resumed.optimizerName());
            float[][] got = train(resumed, g, out, 3);
            assertArrayEquals(expected[0], got[0]);
            assertArrayEquals(expected[1], got[1]);

            // A damaged file is IO and changes nothing.
            byte[] bytes = Files.readAllBytes(Path.of(file));
            bytes[bytes.length - 2] ^= 0x40;
            Files.write(Path.of(file), bytes);
            try (KVStore other = KVStore.create()) {
                KVStoreException e = assertCode(Code.IO, () -> other.loadCheckpoint(file));
                assertTrue(e.getMessage().contains("CRC-32"), e.getMessage());
                assertEquals(0, other.keys().length);
            }
            assertCode(Code.INVALID_ARGUMENT, () -> kv.saveCheckpoint(dir.toString()));
            assertCode(Code.IO, () -> kv.loadCheckpoint(dir.resolve("missing").toString()));
        }
    }

    @Test
    void aCorruptedOrMissingStateFileIsIoAndChangesNothing(@TempDir Path dir) throws IOException {
        Path good = dir.resolve("good.states");
        Path corrupt = dir.resolve("corrupt.states");
        Path truncated = dir.resolve("truncated.states");
        try (KVStore kv = KVStore.create();
                KVStore twin = KVStore.create();
                NDArray ones = NDArray.ones(SHAPE);
                NDArray g = NDArray.full(SHAPE, 0.5);
                NDArray out = NDArray.zeros(SHAPE)) {
            for (KVStore s : new KVStore[] {kv, twin}) {
                s.init(new String[] {"a", "b"}, new NDArray[] {ones, ones}).setOptimizer(stateful());
                train(s, g, out, 2);
            }
            kv.saveOptimizerStates(good.toString());
            byte[] bytes = Files.readAllBytes(good);
            byte[] garbage = bytes.clone();
            for (int i = 8; i < Math.min(garbage.length, 200); i++) {
                garbage[i] = (byte) (garbage[i] ^ 0x5a); // the header of the metadata
            }
            Files.write(corrupt, garbage);
            Files.write(truncated, Arrays.copyOf(bytes, bytes.length / 2));

            assertCode(Code.IO, () -> kv.loadOptimizerStates(corrupt.toString()));
            assertCode(Code.IO, () -> kv.loadOptimizerStates(truncated.toString()));
            KVStoreException missing = assertCode(Code.IO,
                    () -> kv.loadOptimizerStates(dir.resolve("missing.states").toString()));
            assertTrue(missing.getMessage().contains("missing.states"), missing.getMessage());
            // The failed loads left the state alone: kv goes on exactly as its twin.
            assertArrayEquals(train(twin, g, out, 2)[0], train(kv, g, out, 2)[0]);
        }
    }

    @Test
    void badNamesAndValuesAreInvalidArgumentAtBuild() {
        KVStoreException e = assertCode(Code.INVALID_ARGUMENT, () -> Optimizer.builder("adamw").build());
        assertTrue(e.getMessage().contains("adamw") && e.getMessage().contains("sgd"), e.getMessage());
        e = assertCode(Code.INVALID_ARGUMENT, () -> Optimizer.sgd().param("beta1", 0.9).build());
        assertTrue(e.getMessage().contains("beta1") && e.getMessage().contains("momentum"), e.getMessage());
        // A hyper-parameter check comes before the rule: true of adam with or without its rule.
        assertCode(Code.INVALID_ARGUMENT, () -> Optimizer.adam().param("momentum", 0.9).build());
        // What MXNet 1.9.1 accepts is accepted: a momentum of 1 or more, a negative learning
        // rate (gradient ascent), a negative clip_gradient (no clipping, as MXNet).
        Optimizer.sgd().momentum(1.5).build();
        Optimizer.sgd().learningRate(-1).build();
        Optimizer.sgd().clipGradient(-1).build();
        assertCode(Code.INVALID_ARGUMENT, () -> Optimizer.sgd().beginNumUpdate(-3).build());
        e = assertCode(Code.INVALID_ARGUMENT, () -> Optimizer.sgd().learningRate(Double.NaN).build());
        assertTrue(e.getMessage().contains("learning_rate") && e.getMessage().contains("NaN"), e.getMessage());
        assertCode(Code.INVALID_ARGUMENT, () -> Optimizer.sgd().wd(Double.POSITIVE_INFINITY).build());
        assertCode(Code.INVALID_ARGUMENT, () -> Optimizer.sgd().lrMult("w", Double.NaN).build());
        assertCode(Code.INVALID_ARGUMENT, () -> Optimizer.sgd().lrScheduler(LrScheduler.factor(0, 0.5)).build());
        assertCode(Code.INVALID_ARGUMENT, () -> Optimizer.sgd().lrScheduler(LrScheduler.factor(-2, 0.5)).build());
        assertCode(Code.INVALID_ARGUMENT, () -> Optimizer.sgd().lrScheduler(LrScheduler.factor(2, 1.5)).build());
        assertCode(Code.INVALID_ARGUMENT,
                () -> Optimizer.sgd().lrScheduler(LrScheduler.multiFactor(new long[] {5, 2}, 0.5)).build());
        assertCode(Code.INVALID_ARGUMENT,
                () -> Optimizer.sgd().lrScheduler(LrScheduler.cosine(10, 0).stopFactorLr(1e-3)).build());
        assertCode(Code.INVALID_ARGUMENT,
                () -> Optimizer.sgd().lrScheduler(LrScheduler.poly(10, 2, 0).warmup(10, 0, true)).build());
        assertCode(Code.INVALID_ARGUMENT,
                () -> Optimizer.sgd().lrScheduler(LrScheduler.cosine(10, 0).warmup(2, 0.5, false)).build());
        // Schedules that are fine.
        Optimizer.sgd().lrScheduler(LrScheduler.poly(100, 2, 0).baseLr(0.1).warmup(5, 0.01, true)).build();
        Optimizer.sgd().lrScheduler(LrScheduler.factor(10, 0.5).stopFactorLr(1e-4).warmup(3, 0, false)).build();
        // No optimizer to save or load.
        try (KVStore kv = KVStore.create()) {
            assertCode(Code.INVALID_ARGUMENT, () -> kv.saveOptimizerStates("never-written.states"));
            assertCode(Code.INVALID_ARGUMENT, () -> kv.loadOptimizerStates("never-read.states"));
            assertFalse(Files.exists(Path.of("never-written.states")));
        }
    }

    @Test
    void anOptimizerIsAnImmutableValueWithItsJson() {
        Optimizer.Sgd b = Optimizer.sgd().learningRate(0.5).momentum(0.9).lazyUpdate(false).lrMult("w\"1", 2);
        Optimizer o = b.lrScheduler(LrScheduler.multiFactor(new long[] {10, 20}, 0.1).warmup(2, 0.001, false))
                .build();
        assertEquals("{\"name\": \"sgd\", \"params\": {\"learning_rate\": 0.5, \"momentum\": 0.9, "
                + "\"lazy_update\": 0}, \"scheduler\": {\"type\": \"multifactor\", \"steps\": [10, 20], "
                + "\"factor\": 0.1, \"warmup_steps\": 2, \"warmup_begin_lr\": 0.001, \"warmup_mode\": \"constant\"}, "
                + "\"lr_mult\": {\"w\\\"1\": 2}, \"wd_mult\": {}}", o.toJson());
        Map<String, Double> params = new LinkedHashMap<>();
        params.put("learning_rate", 0.5);
        params.put("momentum", 0.9);
        params.put("lazy_update", 0.0);
        assertEquals(params, o.params());
        assertEquals("multifactor", o.lrScheduler().orElseThrow().type());
        // The builder goes on; the optimizer does not change, and equal descriptions are equal.
        b.momentum(0.5);
        assertEquals(0.9, o.params().get("momentum"));
        assertNotEquals(o, b.build());
        assertEquals(Optimizer.sgd().learningRate(0.2).build(), Optimizer.builder("sgd").learningRate(0.2).build());
        assertEquals(LrScheduler.cosine(5, 0), LrScheduler.cosine(5, 0));
        assertTrue(o.toString().contains("multifactor"), o.toString());
        // An optimizer built by another spelling installs under its canonical name.
        try (KVStore kv = KVStore.create()) {
            assertEquals("sgd", kv.setOptimizer(Optimizer.builder("CCSGD").build()).optimizerName());
        }
    }

    @Test
    void nullsAreNullPointerExceptionsAndRawNullsAreInvalidArgument() {
        try (KVStore kv = KVStore.create()) {
            assertNpe("optimizer", () -> kv.setOptimizer(null));
            assertNpe("path", () -> kv.saveOptimizerStates(null));
            assertNpe("path", () -> kv.loadOptimizerStates(null));
            assertNpe("name", () -> Optimizer.builder(null));
            assertNpe("mxnetName", () -> Optimizer.sgd().param(null, 1));
            assertNpe("key", () -> Optimizer.sgd().lrMult(null, 1));
            assertNpe("steps", () -> LrScheduler.multiFactor(null, 0.5));
            assertCode(Code.INVALID_ARGUMENT, () -> Optimizer.nValidate(null));
            assertCode(Code.INVALID_ARGUMENT, () -> Optimizer.nValidate("{\"name\": \"sgd\", \"lr\": 1}"));
        }
        KVStore closed = KVStore.create();
        closed.close();
        Optimizer sgd = Optimizer.sgd().build();
        assertCode(Code.DISPOSED, () -> closed.setOptimizer(sgd));
        assertCode(Code.DISPOSED, closed::optimizerName);
        assertCode(Code.DISPOSED, () -> closed.saveOptimizerStates("x"));
        assertCode(Code.DISPOSED, () -> closed.loadOptimizerStates("x"));
    }

    /** Java's codes of LBSGD's warm-up strategies are the store's own for their names. */
    @Test
    void lbsgdWarmupStrategiesHaveTheStoresCodes() {
        for (String name : new String[] {"linear", "power2", "sqrt", "lars", "LARS", "constant"}) {
            String fromJava = Optimizer.nCanonicalJson(Optimizer.lbsgd().warmupStrategy(name).build().toJson());
            String byName = Optimizer.nCanonicalJson(
                    "{\"name\": \"lbsgd\", \"params\": {\"warmup_strategy\": \"" + name + "\"}}");
            assertEquals(byName, fromJava, name);
        }
        assertNpe("strategy", () -> Optimizer.lbsgd().warmupStrategy(null));
        assertCode(Code.INVALID_ARGUMENT, () -> Optimizer.lbsgd().batchScale(0).build());
    }

    /** Every factory, with the MXNet name it must install as. */
    static Stream<Map.Entry<String, Supplier<Optimizer.Builder<?>>>> factories() {
        Map<String, Supplier<Optimizer.Builder<?>>> m = new LinkedHashMap<>();
        m.put("sgd", Optimizer::sgd);
        m.put("nag", Optimizer::nag);
        m.put("adam", Optimizer::adam);
        m.put("adagrad", Optimizer::adaGrad);
        m.put("rmsprop", Optimizer::rmsProp);
        m.put("adadelta", Optimizer::adaDelta);
        m.put("ftrl", Optimizer::ftrl);
        m.put("signum", Optimizer::signum);
        m.put("sgld", Optimizer::sgld);
        m.put("dcasgd", Optimizer::dcasgd);
        m.put("adamax", Optimizer::adamax);
        m.put("nadam", Optimizer::nadam);
        m.put("lamb", Optimizer::lamb);
        m.put("lars", Optimizer::lars);
        m.put("ftml", Optimizer::ftml);
        m.put("lbsgd", Optimizer::lbsgd);
        return m.entrySet().stream();
    }

    /**
     * Builds {@code b}; a build that says UNSUPPORTED (the optimizer's rule is not in this
     * build of the library) skips the test, printing which, and nothing else may.
     */
    static Optimizer buildOrSkip(String name, Optimizer.Builder<?> b) {
        try {
            return b.build();
        } catch (KVStoreException e) {
            if (e.code() == Code.UNSUPPORTED) {
                System.out.println("SKIP: optimizer " + name + ": " + e.getMessage());
                Assumptions.assumeTrue(false, "optimizer " + name + " is UNSUPPORTED in this build");
            }
            throw e;
        }
    }

    @TestFactory
    Stream<DynamicTest> everyFactoryBuildsAndItsOptimizerUpdatesWeights() {
        return factories().map(f -> DynamicTest.dynamicTest(f.getKey(), () -> {
            String name = f.getKey();
            Optimizer o = buildOrSkip(name, f.getValue().get());
            assertEquals(name, o.name());
            try (KVStore kv = KVStore.create();
                    NDArray ones = NDArray.ones(SHAPE);
                    NDArray out = NDArray.zeros(SHAPE)) {
                kv.init("w", ones).setOptimizer(o);
                assertEquals(name, kv.optimizerName());
                kv.push("w", ones).pull("w", out);
                for (float v : out.toFloatArray()) {
                    assertTrue(Float.isFinite(v) && v != 1f, name + " left " + v);
                    // A positive gradient moves the weight down (SGLD adds noise: any way).
                    assertTrue(name.equals("sgld") || v < 1f, name + " moved the weight up to " + v);
                }
            }
        }));
    }

    @TestFactory
    Stream<DynamicTest> everyFactorysTypedSettersAreHyperParametersItKnows() {
        Map<String, Supplier<Optimizer.Builder<?>>> m = new LinkedHashMap<>();
        m.put("sgd", () -> Optimizer.sgd().momentum(0.5).lazyUpdate(false));
        m.put("nag", () -> Optimizer.nag().momentum(0.5));
        m.put("adam", () -> Optimizer.adam().beta1(0.8).beta2(0.99).epsilon(1e-7).lazyUpdate(false));
        m.put("adagrad", () -> Optimizer.adaGrad().epsilon(1e-6));
        m.put("rmsprop", () -> Optimizer.rmsProp().gamma1(0.8).gamma2(0.8).epsilon(1e-6).centered(true)
                .clipWeights(5));
        m.put("adadelta", () -> Optimizer.adaDelta().rho(0.8).epsilon(1e-6));
        m.put("ftrl", () -> Optimizer.ftrl().lamda1(0.02).beta(2));
        m.put("signum", () -> Optimizer.signum().momentum(0.8).wdLh(0.01));
        m.put("sgld", () -> Optimizer.sgld().seed(42));
        m.put("dcasgd", () -> Optimizer.dcasgd().momentum(0.5).lamda(0.1));
        m.put("adamax", () -> Optimizer.adamax().beta1(0.8).beta2(0.99));
        m.put("nadam", () -> Optimizer.nadam().beta1(0.8).beta2(0.99).epsilon(1e-7).scheduleDecay(0.01));
        m.put("lamb", () -> Optimizer.lamb().beta1(0.8).beta2(0.99).epsilon(1e-7).lowerBound(0.1).upperBound(10)
                .biasCorrection(false));
        m.put("lars", () -> Optimizer.lars().momentum(0.5).eta(0.01).epsilon(1e-8).momentumCorrection(false));
        m.put("ftml", () -> Optimizer.ftml().beta1(0.7).beta2(0.99).epsilon(1e-7));
        m.put("lbsgd", () -> Optimizer.lbsgd().momentum(0.9).warmupStrategy("sqrt").warmupEpochs(2).batchScale(2)
                .updatesPerEpoch(4).beginEpoch(1));
        return m.entrySet().stream().map(f -> DynamicTest.dynamicTest(f.getKey(), () -> {
            Optimizer.Builder<?> b = f.getValue().get()
                    .learningRate(0.05)
                    .wd(1e-4)
                    .rescaleGrad(0.5)
                    .clipGradient(10)
                    .multiPrecision(true)
                    .beginNumUpdate(3)
                    .lrScheduler(LrScheduler.factor(5, 0.9))
                    .lrMult("w", 2)
                    .wdMult("w", 0);
            // Names and values are checked before the rule is looked up, so UNSUPPORTED (no
            // rule in this build yet) still means every setter named a hyper-parameter of
            // this optimizer; a misspelt one would be INVALID_ARGUMENT.
            try {
                assertEquals(f.getKey(), b.build().name());
            } catch (KVStoreException e) {
                assertEquals(Code.UNSUPPORTED, e.code(), e.getMessage());
            }
        }));
    }
}
