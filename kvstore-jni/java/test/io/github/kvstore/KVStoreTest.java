package io.github.kvstore;

import static io.github.kvstore.Fixtures.assertAll;
import static io.github.kvstore.Fixtures.closeAll;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The store through the Java API: MXNet's tutorial, clojure-mxnet's cases, every call form. */
class KVStoreTest {
    private static final int[] SHAPE = {2, 3};

    private static NDArray[] onesOnFourCpus(int[] shape) {
        NDArray[] b = new NDArray[4];
        for (int i = 0; i < 4; i++) {
            b[i] = NDArray.ones(shape, Context.cpu(i), DType.FLOAT32);
        }
        return b;
    }

    /** stored += 2 * merged, the tutorial's updater. */
    private static void addTwice(String key, int index, NDArray merged, NDArray stored) {
        try (NDArray twice = merged.mul(2)) {
            stored.addInPlace(twice);
        }
    }

    @Test
    void mxnetTutorialFlowPrintsTwoEightFourSixThreeEleven() {
        try (KVStore kv = KVStore.create("local");
                NDArray ones = NDArray.ones(SHAPE);
                NDArray two = ones.mul(2);
                NDArray eight = ones.mul(8);
                NDArray a = NDArray.zeros(SHAPE)) {
            kv.init("3", two).pull("3", a);
            assertAll(2f, a);

            kv.push("3", eight).pull("3", a);
            assertAll(8f, a);

            NDArray[] b = onesOnFourCpus(SHAPE);
            kv.push("3", b).pull("3", a);
            assertAll(4f, a);

            // Pull into four outs, one per device.
            kv.pull("3", b);
            for (int i = 0; i < 4; i++) {
                assertAll(4f, b[i]);
                assertEquals(Context.cpu(i), b[i].context());
            }

            kv.setUpdater(KVStoreTest::addTwice);
            kv.pull("3", a);
            assertAll(4f, a);
            kv.push("3", ones).pull("3", a);
            assertAll(6f, a);

            String[] keys = {"5", "7", "9"};
            kv.init(keys, new NDArray[] {ones, ones, ones});
            kv.push(keys, new NDArray[] {ones, ones, ones});
            NDArray[] outs = {NDArray.zeros(SHAPE), NDArray.zeros(SHAPE), NDArray.zeros(SHAPE)};
            kv.pull(keys, outs);
            for (NDArray o : outs) {
                assertAll(3f, o);
            }

            // MXNet's nested form [[b0..b3]] * 3, flattened: each key repeated once per device.
            NDArray[] devs = onesOnFourCpus(SHAPE);
            String[] nestedKeys = new String[12];
            NDArray[] nestedValues = new NDArray[12];
            for (int k = 0; k < 3; k++) {
                for (int d = 0; d < 4; d++) {
                    nestedKeys[4 * k + d] = keys[k];
                    nestedValues[4 * k + d] = devs[d];
                }
            }
            kv.push(nestedKeys, nestedValues);
            kv.pull(nestedKeys, nestedValues);
            for (NDArray v : devs) {
                assertAll(11f, v);
            }
            kv.pull(keys, outs);
            for (NDArray o : outs) {
                assertAll(11f, o);
            }
            closeAll(b);
            closeAll(outs);
            closeAll(devs);
        }
    }

    @Test
    void pushOfRepeatedKeysSumsOnceAndPullFillsTwoOuts() {
        try (KVStore kv = KVStore.create();
                NDArray zeros = NDArray.zeros(SHAPE);
                NDArray ones = NDArray.ones(SHAPE);
                NDArray o1 = NDArray.zeros(SHAPE);
                NDArray o2 = NDArray.zeros(SHAPE)) {
            kv.init("3", zeros);
            kv.push(new String[] {"3", "3", "3"}, new NDArray[] {ones, ones, ones});
            kv.pull("3", new NDArray[] {o1, o2});
            assertAll(3f, o1);
            assertAll(3f, o2);
        }
    }

    /** MXNet's 2-bit compression on a device store: t = 1, [0.5, 1.5, -2.5] pushed twice. */
    @Test
    void twoBitCompressionCarriesEachValuesResidualToTheNextPush() {
        try (KVStore kv = KVStore.create("device");
                NDArray g = NDArray.array(new float[] {0.5f, 1.5f, -2.5f}, new int[] {3});
                NDArray out = NDArray.zeros(3)) {
            java.util.Map<String, String> params = new java.util.HashMap<>();
            params.put("type", "2bit");
            params.put("threshold", "1");
            kv.setGradientCompression(params).init("w", out);
            kv.push("w", g).pull("w", out);
            assertArrayEquals(new float[] {0, 1, -1}, out.toFloatArray());
            kv.push("w", g).pull("w", out);
            assertArrayEquals(new float[] {1, 1, -1}, out.toFloatArray());
            params.put("threshold", "0");
            KVStoreException e =
                    Fixtures.assertCode(KVStoreException.Code.INVALID_ARGUMENT, () -> kv.setGradientCompression(params));
            assertTrue(e.getMessage().contains("greater than 0"), e.getMessage());
        }
    }

    @Test
    void singleKeyPushReplacesTheValueWithoutAnUpdater() {
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(SHAPE);
                NDArray out = NDArray.zeros(SHAPE)) {
            kv.init("3", ones).push("3", ones).pull("3", out);
            assertAll(1f, out);
        }
    }

    @Test
    void aggregateOverFourCpuContextsSumsForEveryKey() {
        int[] shape = {4, 4};
        String[] ks = {"b", "c", "d"};
        try (KVStore kv = KVStore.create();
                NDArray z1 = NDArray.zeros(shape);
                NDArray z2 = NDArray.zeros(shape);
                NDArray z3 = NDArray.zeros(shape);
                NDArray z4 = NDArray.zeros(shape)) {
            kv.init("a", z1).init(ks, new NDArray[] {z2, z3, z4});
            NDArray[] vals = onesOnFourCpus(shape);
            kv.push("a", vals).pull("a", vals);
            for (NDArray v : vals) {
                assertAll(4f, v);
            }
            // Every key gets the four devices' values: 4 values of 4 = 16.
            String[] keys = new String[12];
            NDArray[] values = new NDArray[12];
            for (int k = 0; k < 3; k++) {
                for (int d = 0; d < 4; d++) {
                    keys[4 * k + d] = ks[k];
                    values[4 * k + d] = vals[d];
                }
            }
            kv.push(keys, values);
            NDArray[] outs = {NDArray.zeros(shape), NDArray.zeros(shape), NDArray.zeros(shape)};
            kv.pull(ks, outs);
            for (NDArray o : outs) {
                assertAll(16f, o);
            }
            closeAll(vals);
            closeAll(outs);
        }
    }

    @Test
    void localStoreReportsTypeRankAndNumWorkers() {
        try (KVStore local = KVStore.create("local");
                KVStore byDefault = KVStore.create();
                KVStore device = KVStore.create("Device")) {
            assertEquals("local", local.type());
            assertEquals("local", byDefault.type());
            assertEquals("device", device.type());
            assertEquals(0, local.rank());
            assertEquals(1, local.numWorkers());
        }
    }

    @Test
    void pushpullWritesTheResultToOutsAndInPlace() {
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(SHAPE);
                NDArray out = NDArray.zeros(SHAPE);
                NDArray x = NDArray.full(SHAPE, 5.0)) {
            kv.init(new String[] {"p", "q"}, new NDArray[] {ones, ones});
            try (NDArray seven = ones.mul(7)) {
                kv.pushpull("p", seven, out);
            }
            assertAll(7f, out);

            NDArray[] vals = onesOnFourCpus(SHAPE);
            NDArray[] outs = {NDArray.zeros(SHAPE), NDArray.zeros(SHAPE)};
            kv.pushpull("p", vals, outs, 3);
            assertAll(4f, outs[0]);
            assertAll(4f, outs[1]);

            kv.pushpull(new String[] {"p", "q"}, new NDArray[] {ones, x}, outs);
            assertAll(1f, outs[0]);
            assertAll(5f, outs[1]);

            // In place: the pushed arrays receive the result.
            kv.pushpull("p", vals);
            for (NDArray v : vals) {
                assertAll(4f, v);
            }
            kv.pushpull("q", x);
            assertAll(5f, x);
            NDArray[] pair = {NDArray.full(SHAPE, 2.0), NDArray.full(SHAPE, 9.0)};
            kv.pushpull(new String[] {"p", "q"}, pair);
            assertAll(2f, pair[0]);
            assertAll(9f, pair[1]);
            closeAll(vals);
            closeAll(outs);
            closeAll(pair);
        }
    }

    @Test
    void pushpullUsesTheUpdaterOnce() {
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(SHAPE);
                NDArray out = NDArray.zeros(SHAPE)) {
            kv.init("w", ones).setUpdater(KVStoreTest::addTwice);
            kv.pushpull("w", ones, out);
            assertAll(3f, out);
        }
    }

    @Test
    void broadcastInitialisesAndPullsIntoEveryOut() {
        try (KVStore kv = KVStore.create();
                NDArray v = NDArray.full(SHAPE, 3.0);
                NDArray w = NDArray.full(SHAPE, 4.0);
                NDArray out = NDArray.zeros(SHAPE);
                NDArray check = NDArray.zeros(SHAPE)) {
            kv.broadcast("b1", v, out);
            assertAll(3f, out);
            NDArray[] outs = onesOnFourCpus(SHAPE);
            kv.broadcast("b2", w, outs);
            for (NDArray o : outs) {
                assertAll(4f, o);
            }
            kv.broadcast(new String[] {"b3", "b4"}, new NDArray[] {v, w}, new NDArray[] {outs[0], outs[1]}, 1);
            assertAll(3f, outs[0]);
            assertAll(4f, outs[1]);
            // The keys now exist: pull them.
            kv.pull("b4", check);
            assertAll(4f, check);
            closeAll(outs);
        }
    }

    @Test
    void updaterRunsOncePerDistinctKeyInFirstInitOrder() {
        List<String> calls = new ArrayList<>();
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(SHAPE);
                NDArray out = NDArray.zeros(SHAPE)) {
            kv.init(new String[] {"w", "a", "m"}, new NDArray[] {ones, ones, ones});
            kv.setUpdater((key, index, merged, stored) -> {
                calls.add(key + "#" + index + "=" + merged.toFloatArray()[0]);
                stored.copyFrom(merged);
            });
            kv.push(new String[] {"m", "w", "a", "w"}, new NDArray[] {ones, ones, ones, ones});
            assertEquals(List.of("w#0=2.0", "a#1=1.0", "m#2=1.0"), calls);
            kv.pull("w", out);
            assertAll(2f, out);
        }
    }

    @Test
    void updaterArraysAreDisposedAfterTheCall() {
        List<NDArray> seen = new ArrayList<>();
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(SHAPE)) {
            kv.init("k", ones).setUpdater((key, index, merged, stored) -> {
                assertEquals(DType.FLOAT32, merged.dtype());
                assertEquals(Context.cpu(0), stored.context());
                seen.add(merged);
                seen.add(stored);
            });
            kv.push("k", ones);
        }
        assertEquals(2, seen.size());
        for (NDArray a : seen) {
            Fixtures.assertCode(KVStoreException.Code.DISPOSED, a::toFloatArray);
            assertEquals("<NDArray closed>", a.toString());
            a.close(); // freeing a handle the native side already freed is harmless
        }
    }

    @Test
    void setUpdaterNullGoesBackToAssign() {
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(SHAPE);
                NDArray out = NDArray.zeros(SHAPE)) {
            kv.init("k", ones).setUpdater(KVStoreTest::addTwice).push("k", ones).pull("k", out);
            assertAll(3f, out);
            kv.setUpdater(null).push("k", ones).pull("k", out);
            assertAll(1f, out);
        }
    }

    @Test
    void pushCopiesSoLaterChangesToTheValueDoNotReachTheStore() {
        try (KVStore kv = KVStore.create();
                NDArray v = NDArray.ones(SHAPE);
                NDArray out = NDArray.zeros(SHAPE)) {
            kv.init("k", v);
            v.addInPlace(10);
            kv.pull("k", out);
            assertAll(1f, out);
            kv.push("k", v);
            v.addInPlace(10);
            kv.pull("k", out);
            assertAll(11f, out);
        }
    }

    @Test
    void mutatingMethodsReturnTheStoreAndTheRestOfTheApiAnswers() {
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(SHAPE);
                NDArray out = NDArray.zeros(SHAPE)) {
            assertSame(kv, kv.init("k", ones));
            assertSame(kv, kv.push("k", new NDArray[] {ones}, 1));
            assertSame(kv, kv.pull("k", new NDArray[] {out}, 1));
            assertSame(kv, kv.pushpull("k", ones, out));
            assertSame(kv, kv.setUpdater(null));
            assertSame(kv, kv.barrier());
            assertSame(kv, kv.setBarrierBeforeExit(false));
            assertSame(kv, kv.sendCommandToServers(0, "noop"));
            assertEquals(0, kv.numDeadNode(0));
            assertTrue(kv.isCapable("optimizer"));
            assertTrue(kv.isCapable("OPTIMIZER"));
            assertEquals("#kvstore/store {:kind \"local\", :keys 1}", kv.toString());
            assertFalse(kv.isClosed());
        }
    }

    @Test
    void toStringGivesTheKindAndNumberOfKeysAndNeverThrows() {
        KVStore kv = KVStore.create("LOCAL");
        try (NDArray one = NDArray.ones(1)) {
            assertEquals("#kvstore/store {:kind \"local\", :keys 0}", kv.toString());
            kv.init(new String[] {"a", "b", "c"}, new NDArray[] {one, one, one});
            assertEquals("#kvstore/store {:kind \"local\", :keys 3}", kv.toString());
            kv.broadcast("d", one, one);
            assertEquals("#kvstore/store {:kind \"local\", :keys 4}", kv.toString());
        }
        try (KVStore device = KVStore.create("device")) {
            assertEquals("#kvstore/store {:kind \"device\", :keys 0}", device.toString());
        }
        kv.close();
        assertEquals("#kvstore/store {:closed true}", kv.toString());
        assertEquals("#kvstore/store {:closed true}", String.valueOf(kv), "string concatenation of a closed store");
    }

    @Test
    void versionIsTheWorkspaceVersion() throws java.io.IOException {
        String cargo = java.nio.file.Files.readString(java.nio.file.Path.of("Cargo.toml"));
        java.util.regex.Matcher m = java.util.regex.Pattern
                .compile("(?s)\\[workspace\\.package\\].*?\nversion = \"([^\"]+)\"").matcher(cargo);
        assertTrue(m.find(), "the suite runs from the repository root, next to the workspace's Cargo.toml");
        assertEquals(m.group(1), KVStore.version());
    }

    @Test
    void keysListsTheKeysInFirstInitOrder() {
        KVStore kv = KVStore.create();
        try (NDArray one = NDArray.ones(2)) {
            assertArrayEquals(new String[0], kv.keys());
            kv.init(new String[] {"b", "a"}, new NDArray[] {one, one}).init("10", one);
            kv.broadcast("\uD83D\uDE00", one, one);
            assertArrayEquals(new String[] {"b", "a", "10", "\uD83D\uDE00"}, kv.keys());
            String[] keys = kv.keys();
            keys[0] = "changed";
            assertArrayEquals(new String[] {"b", "a", "10", "\uD83D\uDE00"}, kv.keys(), "a new array each time");
            try (NDArray outs = NDArray.zeros(2)) {
                // The keys go back into the list forms as they are.
                kv.pull(kv.keys(), new NDArray[] {outs, outs, outs, outs});
                assertAll(1f, outs);
            }
        } finally {
            kv.close();
        }
        Fixtures.assertCode(KVStoreException.Code.DISPOSED, kv::keys);
    }

    @Test
    void pullOfAKeyAloneReturnsANewArrayOfItsShapeAndDtype() {
        KVStore kv = KVStore.create();
        try (NDArray w = NDArray.array(new double[] {1, 2, 3, 4, 5, 6}, SHAPE, Context.cpu(2), DType.FLOAT64);
                NDArray g = NDArray.full(SHAPE, 1, Context.cpu(), DType.FLOAT64)) {
            kv.init("w", w);
            try (NDArray value = kv.pull("w")) {
                assertArrayEquals(SHAPE, value.shape());
                assertEquals(DType.FLOAT64, value.dtype());
                assertEquals(Context.cpu(), value.context());
                assertArrayEquals(new double[] {1, 2, 3, 4, 5, 6}, value.toDoubleArray());
                assertFalse(value.sameStorage(w));
                value.addInPlace(100);
            }
            kv.push("w", g);
            try (NDArray value = kv.pull("w")) {
                assertArrayEquals(new double[] {1, 1, 1, 1, 1, 1}, value.toDoubleArray(), "the value after a push");
            }
            try (NDArray i8 = NDArray.full(new int[] {3}, -2, Context.cpu(), DType.INT8)) {
                kv.init("7", i8);
                try (NDArray value = kv.pull("7")) {
                    assertEquals(DType.INT8, value.dtype());
                    assertArrayEquals(new int[] {-2, -2, -2}, value.toIntArray());
                }
            }
            Fixtures.assertCode(KVStoreException.Code.KEY_NOT_INITIALIZED, () -> kv.pull("nope"));
        } finally {
            kv.close();
        }
        Fixtures.assertCode(KVStoreException.Code.DISPOSED, () -> kv.pull("w"));
    }

    @Test
    void integerKeysAndOtherDtypesWork() {
        try (KVStore kv = KVStore.create();
                NDArray v = NDArray.array(new long[] {1L << 40, -5}, new int[] {2});
                NDArray out = NDArray.zeros(new int[] {2}, Context.cpu(), DType.INT64)) {
            kv.init("9", v).push("9", new NDArray[] {v, v}).pull("9", out);
            assertArrayEquals(new long[] {2L << 40, -10L}, out.toLongArray());
        }
    }
}
