package io.github.kvstore;

import static io.github.kvstore.Fixtures.assertAll;
import static io.github.kvstore.Fixtures.assertCode;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

/** Arrays, contexts and dtypes through the Java API. */
class NDArrayTest {
    @Test
    void factoriesGiveTheRequestedShapeDtypeContextAndValues() {
        try (NDArray z = NDArray.zeros(2, 3);
                NDArray o = NDArray.ones(new int[] {4}, Context.cpu(2), DType.INT32);
                NDArray f = NDArray.full(new int[] {1, 2, 2}, 2.5);
                NDArray g = NDArray.full(new int[] {3}, -7.9, Context.cpu(1), DType.INT8);
                NDArray h = NDArray.zeros(new int[] {2}, Context.cpu(), DType.FLOAT64)) {
            assertArrayEquals(new int[] {2, 3}, z.shape());
            assertEquals(2, z.ndim());
            assertEquals(6, z.size());
            assertEquals(DType.FLOAT32, z.dtype());
            assertEquals(Context.cpu(0), z.context());
            assertAll(0f, z);
            assertEquals(DType.INT32, o.dtype());
            assertEquals(Context.cpu(2), o.context());
            assertArrayEquals(new int[] {1, 1, 1, 1}, o.toIntArray());
            assertAll(2.5f, f);
            assertEquals(4, f.size());
            assertArrayEquals(new int[] {-7, -7, -7}, g.toIntArray());
            assertEquals(DType.FLOAT64, h.dtype());
        }
    }

    @Test
    void shapeIsACopy() {
        try (NDArray a = NDArray.zeros(2, 3)) {
            a.shape()[0] = 99;
            assertArrayEquals(new int[] {2, 3}, a.shape());
        }
    }

    @Test
    void emptyAndScalarShapesWork() {
        try (NDArray e = NDArray.zeros(0, 3);
                NDArray s = NDArray.full(new int[] {}, 5.0)) {
            assertEquals(0, e.size());
            assertEquals(0, e.toFloatArray().length);
            assertEquals(0, s.ndim());
            assertEquals(1, s.size());
            assertArrayEquals(new float[] {5f}, s.toFloatArray());
        }
    }

    @Test
    void arithmeticMakesNewArraysAndInPlaceVariantsReturnThis() {
        try (NDArray a = NDArray.array(new float[] {1, 2, 3, 4}, new int[] {2, 2});
                NDArray b = NDArray.full(new int[] {2, 2}, 2.0);
                NDArray sum = a.add(b);
                NDArray diff = a.sub(b);
                NDArray prod = a.mul(b);
                NDArray quot = a.div(b);
                NDArray plus = a.add(1);
                NDArray minus = a.sub(1);
                NDArray times = a.mul(3);
                NDArray over = a.div(4)) {
            assertArrayEquals(new float[] {3, 4, 5, 6}, sum.toFloatArray());
            assertArrayEquals(new float[] {-1, 0, 1, 2}, diff.toFloatArray());
            assertArrayEquals(new float[] {2, 4, 6, 8}, prod.toFloatArray());
            assertArrayEquals(new float[] {0.5f, 1, 1.5f, 2}, quot.toFloatArray());
            assertArrayEquals(new float[] {2, 3, 4, 5}, plus.toFloatArray());
            assertArrayEquals(new float[] {0, 1, 2, 3}, minus.toFloatArray());
            assertArrayEquals(new float[] {3, 6, 9, 12}, times.toFloatArray());
            assertArrayEquals(new float[] {0.25f, 0.5f, 0.75f, 1}, over.toFloatArray());
            assertArrayEquals(new float[] {1, 2, 3, 4}, a.toFloatArray(), "operands are unchanged");
            assertFalse(sum.sameStorage(a));

            assertSame(a, a.addInPlace(b));
            assertArrayEquals(new float[] {3, 4, 5, 6}, a.toFloatArray());
            assertSame(a, a.subInPlace(1));
            assertSame(a, a.mulInPlace(b));
            assertArrayEquals(new float[] {4, 6, 8, 10}, a.toFloatArray());
            assertSame(a, a.divInPlace(2));
            assertSame(a, a.subInPlace(b));
            assertSame(a, a.mulInPlace(10));
            assertSame(a, a.divInPlace(b));
            assertSame(a, a.addInPlace(0.5));
            assertArrayEquals(new float[] {0.5f, 5.5f, 10.5f, 15.5f}, a.toFloatArray());
            assertSame(a, a.addInPlace(a));
            assertArrayEquals(new float[] {1, 11, 21, 31}, a.toFloatArray(), "an operation on itself");
        }
    }

    @Test
    void scalarsConvertToTheDtypeAndIntegersWrap() {
        try (NDArray i = NDArray.array(new int[] {7, -7}, new int[] {2});
                NDArray u = NDArray.array(new int[] {250}, new int[] {1}, Context.cpu(), DType.UINT8);
                NDArray im = i.mul(2.9);
                NDArray uw = u.add(10)) {
            assertArrayEquals(new int[] {14, -14}, im.toIntArray());
            assertArrayEquals(new int[] {4}, uw.toIntArray());
        }
    }

    @Test
    void arangeFollowsNumpy() {
        try (NDArray a = NDArray.arange(0, 1, 0.25);
                NDArray b = NDArray.arange(5, 0, -2, Context.cpu(), DType.INT32);
                NDArray c = NDArray.arange(0, 0, 1);
                NDArray d = NDArray.arange(3, 1, 1);
                NDArray e = NDArray.arange(0, 10, 3, Context.cpu(1), DType.FLOAT64)) {
            assertArrayEquals(new float[] {0, 0.25f, 0.5f, 0.75f}, a.toFloatArray());
            assertArrayEquals(new int[] {5, 3, 1}, b.toIntArray());
            assertArrayEquals(new int[] {0}, c.shape());
            assertArrayEquals(new int[] {0}, d.shape());
            assertArrayEquals(new double[] {0, 3, 6, 9}, e.toDoubleArray());
            assertEquals(Context.cpu(1), e.context());
        }
        assertCode(KVStoreException.Code.INVALID_ARGUMENT, () -> NDArray.arange(0, 1, 0));
        assertCode(KVStoreException.Code.INVALID_ARGUMENT, () -> NDArray.arange(0, Double.NaN, 1));
        assertCode(KVStoreException.Code.INVALID_ARGUMENT, () -> NDArray.arange(0, 1e12, 1));
    }

    @Test
    void everyDtypeRoundTripsSmallIntegersThroughTheFourArrayPairs() {
        int[] shape = {2, 3};
        for (DType d : DType.values()) {
            float[] f = {0, 1, 2, 3, 100, 127};
            double[] g = {0, 1, 2, 3, 100, 127};
            int[] i = {0, 1, 2, 3, 100, 127};
            long[] l = {0, 1, 2, 3, 100, 127};
            try (NDArray a = NDArray.array(f, shape, Context.cpu(), d);
                    NDArray b = NDArray.array(g, shape, Context.cpu(), d);
                    NDArray c = NDArray.array(i, shape, Context.cpu(), d);
                    NDArray e = NDArray.array(l, shape, Context.cpu(), d)) {
                for (NDArray x : new NDArray[] {a, b, c, e}) {
                    assertEquals(d, x.dtype());
                    assertArrayEquals(shape, x.shape());
                    assertArrayEquals(f, x.toFloatArray(), d::mxnetName);
                    assertArrayEquals(g, x.toDoubleArray(), d::mxnetName);
                    assertArrayEquals(i, x.toIntArray(), d::mxnetName);
                    assertArrayEquals(l, x.toLongArray(), d::mxnetName);
                }
            }
        }
    }

    @Test
    void nativeDtypesRoundTripExactly() {
        float[] f = {1.5f, -0.0f, Float.MAX_VALUE, Float.MIN_VALUE, Float.NaN, Float.NEGATIVE_INFINITY, 0.1f};
        double[] g = {0.1, -0.0, Double.MAX_VALUE, Double.MIN_VALUE, Double.NaN, 1e300, Math.PI};
        int[] i = {Integer.MIN_VALUE, Integer.MAX_VALUE, 0, -1, 123456789};
        long[] l = {Long.MIN_VALUE, Long.MAX_VALUE, (1L << 53) + 1, -1, 0};
        try (NDArray a = NDArray.array(f, new int[] {f.length});
                NDArray b = NDArray.array(g, new int[] {g.length});
                NDArray c = NDArray.array(i, new int[] {i.length});
                NDArray d = NDArray.array(l, new int[] {l.length})) {
            assertEquals(DType.FLOAT32, a.dtype());
            assertEquals(DType.FLOAT64, b.dtype());
            assertEquals(DType.INT32, c.dtype());
            assertEquals(DType.INT64, d.dtype());
            assertArrayEquals(f, a.toFloatArray());
            assertArrayEquals(g, b.toDoubleArray());
            assertArrayEquals(i, c.toIntArray());
            assertArrayEquals(l, d.toLongArray());
            // Widening reads are exact too.
            double[] fw = new double[f.length];
            for (int k = 0; k < f.length; k++) {
                fw[k] = f[k];
            }
            assertArrayEquals(fw, a.toDoubleArray());
            assertArrayEquals(new long[] {Integer.MIN_VALUE, Integer.MAX_VALUE, 0, -1, 123456789}, c.toLongArray());
        }
    }

    /** bfloat16 rounding of a float: round to nearest, ties to even (for finite values). */
    private static float bf16(float x) {
        int bits = Float.floatToIntBits(x);
        int rounded = (bits + 0x7FFF + ((bits >>> 16) & 1)) & 0xFFFF0000;
        return Float.intBitsToFloat(rounded);
    }

    @Test
    void float16AndBfloat16RoundToNearest() {
        float[] in = {1.5f, 0.1f, 65504f, 1e5f, 6e-8f, -2.0f, 1.0009765625f};
        try (NDArray h = NDArray.array(in, new int[] {in.length}, Context.cpu(), DType.FLOAT16);
                NDArray hd = NDArray.array(new double[] {0.1}, new int[] {1}, Context.cpu(), DType.FLOAT16);
                NDArray b = NDArray.array(in, new int[] {in.length}, Context.cpu(), DType.BFLOAT16);
                NDArray h2 = b.asType(DType.FLOAT16);
                NDArray back = h.asType(DType.FLOAT32)) {
            float[] expected = {1.5f, 0.0999755859375f, 65504f, Float.POSITIVE_INFINITY, 5.9604645e-8f, -2f,
                1.0009765625f};
            assertArrayEquals(expected, h.toFloatArray());
            assertArrayEquals(new double[] {0.0999755859375}, hd.toDoubleArray());
            float[] expectedB = new float[in.length];
            for (int k = 0; k < in.length; k++) {
                expectedB[k] = bf16(in[k]);
            }
            assertArrayEquals(expectedB, b.toFloatArray());
            assertEquals(0.10009765625f, b.toFloatArray()[1]);
            assertEquals(1.0f, b.toFloatArray()[6], "7 mantissa bits cannot hold 2^-10");
            assertEquals(DType.FLOAT32, back.dtype());
            assertArrayEquals(expected, back.toFloatArray());
            assertEquals(0.10009765625f, h2.toFloatArray()[1], 1e-4f);
        }
    }

    @Test
    void narrowingConversionsTruncateSaturateAndWrap() {
        try (NDArray wrapped = NDArray.array(new int[] {300, -129, 127}, new int[] {3}, Context.cpu(), DType.INT8);
                NDArray unsigned = NDArray.array(new long[] {300, -1}, new int[] {2}, Context.cpu(), DType.UINT8);
                NDArray floats = NDArray.array(new float[] {1.7f, -1.7f, 300f, -300f, Float.NaN}, new int[] {5},
                        Context.cpu(), DType.INT8);
                NDArray big = NDArray.array(new double[] {1e20, -1e20, Double.POSITIVE_INFINITY}, new int[] {3});
                NDArray asInt = big.asType(DType.INT32)) {
            assertArrayEquals(new int[] {44, 127, 127}, wrapped.toIntArray());
            assertArrayEquals(new int[] {44, 255}, unsigned.toIntArray());
            assertArrayEquals(new int[] {1, -1, 127, -128, 0}, floats.toIntArray());
            assertArrayEquals(new int[] {Integer.MAX_VALUE, Integer.MIN_VALUE, Integer.MAX_VALUE}, asInt.toIntArray());
            assertArrayEquals(new int[] {Integer.MAX_VALUE, Integer.MIN_VALUE, Integer.MAX_VALUE}, big.toIntArray());
        }
    }

    @Test
    void copyToAsTypeAndCopyFromMoveAndConvert() {
        try (NDArray a = NDArray.array(new float[] {1.7f, -1.7f}, new int[] {2});
                NDArray onCpu3 = a.copyTo(Context.cpu(3));
                NDArray asInt = a.asType(DType.INT32);
                NDArray target = NDArray.zeros(new int[] {2}, Context.cpu(1), DType.FLOAT64)) {
            assertEquals(Context.cpu(3), onCpu3.context());
            assertArrayEquals(a.toFloatArray(), onCpu3.toFloatArray());
            assertFalse(onCpu3.sameStorage(a));
            assertEquals(DType.INT32, asInt.dtype());
            assertArrayEquals(new int[] {1, -1}, asInt.toIntArray());
            assertSame(target, target.copyFrom(a));
            assertArrayEquals(new double[] {1.7f, -1.7f}, target.toDoubleArray());
            assertEquals(DType.FLOAT64, target.dtype());
            assertTrue(a.sameStorage(a));
        }
    }

    @Test
    void arraysPrintTheirValuesAndContext() {
        NDArray a = NDArray.full(new int[] {2, 3}, 2.0);
        String s = a.toString();
        assertTrue(s.contains("2.0"), s);
        assertTrue(s.contains("@cpu(0)"), s);
        assertEquals("[[2.0 2.0 2.0]\n [2.0 2.0 2.0]]\n<NDArray 2x3 float32 @cpu(0)>", s);
        a.close();
        assertEquals("<NDArray closed>", a.toString());
        try (NDArray i = NDArray.zeros(new int[] {2}, Context.cpu(1), DType.INT32)) {
            assertEquals("[0 0]\n<NDArray 2 int32 @cpu(1)>", i.toString());
        }
    }

    @Test
    void closeIsIdempotentAndUseAfterCloseIsDisposed() {
        NDArray a = NDArray.ones(3);
        assertFalse(a.isClosed());
        a.close();
        a.close();
        assertTrue(a.isClosed());
        assertCode(KVStoreException.Code.DISPOSED, a::toFloatArray);
        assertCode(KVStoreException.Code.DISPOSED, () -> a.add(1));
        assertCode(KVStoreException.Code.DISPOSED, () -> a.addInPlace(1));
        assertCode(KVStoreException.Code.DISPOSED, () -> a.asType(DType.INT8));
        // The metadata too (it is cached in Java, but the array is gone).
        assertCode(KVStoreException.Code.DISPOSED, a::shape);
        assertEquals("<NDArray closed>", a.toString());

        KVStore kv = KVStore.create();
        kv.close();
        kv.dispose();
        kv.close();
        assertTrue(kv.isClosed());
        assertEquals("#kvstore/store {:closed true}", kv.toString());
    }

    @Test
    void cleanerFreesAbandonedArrays() throws InterruptedException {
        long before = NDArray.freedCount();
        int n = 10_000;
        long[] abandonedHandles = new long[16];
        for (int k = 0; k < n; k++) {
            NDArray a = NDArray.zeros(4);
            if (k < abandonedHandles.length) {
                abandonedHandles[k] = a.handle();
            }
        }
        long deadline = System.nanoTime() + 20_000_000_000L;
        while (NDArray.freedCount() - before < n && System.nanoTime() < deadline) {
            System.gc();
            Thread.sleep(20);
        }
        assertTrue(NDArray.freedCount() - before >= n,
                "the Cleaner freed " + (NDArray.freedCount() - before) + " of " + n + " abandoned arrays");
        // The native side forgot them: their handles are stale now.
        for (long h : abandonedHandles) {
            assertCode(KVStoreException.Code.DISPOSED, () -> NDArray.nInfo(h));
        }
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(4);
                NDArray out = NDArray.zeros(4)) {
            kv.init("sanity", ones).push("sanity", new NDArray[] {ones, ones}).pull("sanity", out);
            assertAll(2f, out);
        }
    }

    @Test
    void contextsAreValuesWithMxnetNames() {
        assertEquals("cpu(0)", Context.cpu().toString());
        assertEquals("gpu(1)", Context.gpu(1).toString());
        assertEquals(Context.cpu(0), Context.defaultContext());
        assertEquals(Context.cpu(2), Context.cpu(2));
        assertEquals(Context.cpu(2).hashCode(), Context.cpu(2).hashCode());
        assertNotEquals(Context.cpu(1), Context.gpu(1));
        assertNotEquals(Context.cpu(1), Context.cpu(2));
        assertEquals("gpu", Context.gpu().deviceType());
        assertEquals(0, Context.gpu().deviceId());
        assertEquals("cpu", Context.cpu(5).deviceType());
        assertEquals(5, Context.cpu(5).deviceId());
        assertThrows(IllegalArgumentException.class, () -> Context.cpu(-1));
        assertThrows(IllegalArgumentException.class, () -> Context.gpu(-3));
    }

    @Test
    void dtypesParseTheirNamesAndKeepTheNativeOrder() {
        String[] names = {"float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8"};
        DType[] values = DType.values();
        assertEquals(names.length, values.length);
        for (int k = 0; k < names.length; k++) {
            assertEquals(k, values[k].code());
            assertEquals(names[k], values[k].mxnetName());
            assertSame(values[k], DType.fromName(names[k]));
            assertSame(values[k], DType.fromName(names[k].toUpperCase(java.util.Locale.ROOT)));
        }
        assertSame(DType.FLOAT32, DType.fromName("f32"));
        assertSame(DType.BFLOAT16, DType.fromName("BF16"));
        assertSame(DType.UINT8, DType.fromName("u8"));
        assertSame(DType.INT64, DType.fromName("i64"));
        assertThrows(IllegalArgumentException.class, () -> DType.fromName("complex64"));
        assertThrows(NullPointerException.class, () -> DType.fromName(null));
    }

    @Test
    void floatArraysCopyIntoAndOutOfExistingArrays() {
        try (NDArray a = NDArray.zeros(2, 3);
                NDArray h = NDArray.zeros(new int[] {2, 3}, Context.cpu(0), DType.FLOAT16)) {
            float[] data = {1, 2, 3, 4, 5, 6.5f};
            assertSame(a, a.copyFrom(data));
            float[] dst = new float[6];
            assertSame(dst, a.toFloatArray(dst));
            assertArrayEquals(data, dst);
            h.copyFrom(data);
            assertArrayEquals(data, h.toFloatArray(new float[6]));
            KVStoreException e = assertThrows(KVStoreException.class, () -> a.copyFrom(new float[5]));
            assertEquals(KVStoreException.Code.SHAPE_MISMATCH, e.code());
            e = assertThrows(KVStoreException.class, () -> a.toFloatArray(new float[7]));
            assertEquals(KVStoreException.Code.SHAPE_MISMATCH, e.code());
            assertArrayEquals(data, a.toFloatArray(), "a failed copy changes nothing");
            assertThrows(NullPointerException.class, () -> a.copyFrom((float[]) null));
        }
    }
}
