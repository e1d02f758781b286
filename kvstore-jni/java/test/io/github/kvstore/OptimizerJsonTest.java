package io.github.kvstore;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;

import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/**
 * The JSON that Java's {@link Optimizer#toJson()} builds, read by Rust's core
 * ({@code OptimizerSpec}) and written back in core's canonical form: every optimizer and
 * every schedule kind gives the description Java meant, and core's round trip of its own
 * JSON is the identity.
 */
class OptimizerJsonTest {
    /** Core's canonical JSON of {@code o}, checked to read back as itself. */
    private static String canonical(Optimizer o) {
        String c = Optimizer.nCanonicalJson(o.toJson());
        assertEquals(c, Optimizer.nCanonicalJson(c), "core reads back what it writes");
        return c;
    }

    private static String sgdWith(String scheduler) {
        return "{\"name\":\"sgd\",\"params\":{\"learning_rate\":0.5},\"scheduler\":" + scheduler
                + ",\"lr_mult\":{},\"wd_mult\":{}}";
    }

    @TestFactory
    Stream<DynamicTest> everyOptimizersJsonReadsInCoreAsTheSameDescription() {
        return OptimizerTest.factories().map(f -> DynamicTest.dynamicTest(f.getKey(), () -> {
            String name = f.getKey();
            Optimizer o = OptimizerTest.buildOrSkip(name, f.getValue().get()
                    .learningRate(0.5)
                    .wd(0.25)
                    .multiPrecision(true)
                    .lrMult("w", 2)
                    .wdMult("b", 0));
            assertEquals("{\"name\":\"" + name + "\",\"params\":{\"learning_rate\":0.5,\"multi_precision\":1.0,"
                    + "\"wd\":0.25},\"scheduler\":null,\"lr_mult\":{\"w\":2.0},\"wd_mult\":{\"b\":0.0}}",
                    canonical(o));
        }));
    }

    @Test
    void everyScheduleKindsJsonReadsInCoreAsTheSameDescription() {
        Object[][] cases = {
            {LrScheduler.factor(2, 0.5), "{\"type\":\"factor\",\"step\":2,\"factor\":0.5}"},
            {LrScheduler.factor(10, 0.5).stopFactorLr(0.25).baseLr(0.5).warmup(3, 0.125, false),
                "{\"type\":\"factor\",\"step\":10,\"factor\":0.5,\"stop_factor_lr\":0.25,\"base_lr\":0.5,"
                        + "\"warmup_steps\":3,\"warmup_begin_lr\":0.125,\"warmup_mode\":\"constant\"}"},
            {LrScheduler.multiFactor(new long[] {10, 20}, 0.1),
                "{\"type\":\"multifactor\",\"steps\":[10,20],\"factor\":0.1}"},
            {LrScheduler.multiFactor(new long[] {3}, 0.5).warmup(2, 0, true),
                "{\"type\":\"multifactor\",\"steps\":[3],\"factor\":0.5,\"warmup_steps\":2,"
                        + "\"warmup_begin_lr\":0.0,\"warmup_mode\":\"linear\"}"},
            {LrScheduler.poly(100, 2, 0), "{\"type\":\"poly\",\"max_update\":100,\"pwr\":2.0,\"final_lr\":0.0}"},
            {LrScheduler.poly(100, 1.5, 0.001).baseLr(0.1).warmup(5, 0.01, true),
                "{\"type\":\"poly\",\"max_update\":100,\"pwr\":1.5,\"final_lr\":0.001,\"base_lr\":0.1,"
                        + "\"warmup_steps\":5,\"warmup_begin_lr\":0.01,\"warmup_mode\":\"linear\"}"},
            {LrScheduler.cosine(50, 0.001), "{\"type\":\"cosine\",\"max_update\":50,\"final_lr\":0.001}"},
            {LrScheduler.cosine(50, 0).baseLr(0.5).warmup(4, 0.25, false),
                "{\"type\":\"cosine\",\"max_update\":50,\"final_lr\":0.0,\"base_lr\":0.5,\"warmup_steps\":4,"
                        + "\"warmup_begin_lr\":0.25,\"warmup_mode\":\"constant\"}"},
        };
        for (Object[] c : cases) {
            LrScheduler s = (LrScheduler) c[0];
            Optimizer o = Optimizer.sgd().learningRate(0.5).lrScheduler(s).build();
            assertEquals(sgdWith((String) c[1]), canonical(o), s.toString());
        }
    }

    @Test
    void descriptionsThatDifferOnlyInOrderHaveOneCanonicalJson() {
        Optimizer a = Optimizer.sgd().learningRate(0.1).momentum(0.9).lrMult("x", 1).lrMult("a", 2).build();
        Optimizer b = Optimizer.sgd().momentum(0.9).lrMult("a", 2).learningRate(0.1).lrMult("x", 1).build();
        assertNotEquals(a.toJson(), b.toJson());
        assertEquals(canonical(a), canonical(b));
        assertEquals("{\"name\":\"sgd\",\"params\":{\"learning_rate\":0.1,\"momentum\":0.9},\"scheduler\":null,"
                + "\"lr_mult\":{\"a\":2.0,\"x\":1.0},\"wd_mult\":{}}", canonical(a));
    }
}
