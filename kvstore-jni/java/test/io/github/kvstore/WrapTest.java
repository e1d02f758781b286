package io.github.kvstore;

import static io.github.kvstore.Fixtures.assertCode;
import static io.github.kvstore.Fixtures.assertNpe;
import static io.github.kvstore.Fixtures.filled;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.ref.WeakReference;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** {@link NDArray#wrap}: arrays over a direct ByteBuffer's memory, read and written in place. */
class WrapTest {
    /** A direct buffer in native order holding {@code values} as float32. */
    private static ByteBuffer floats(float... values) {
        ByteBuffer b = ByteBuffer.allocateDirect(values.length * Float.BYTES).order(ByteOrder.nativeOrder());
        for (int i = 0; i < values.length; i++) {
            b.putFloat(i * Float.BYTES, values[i]);
        }
        return b;
    }

    /** The float32 elements of {@code b} from {@code at}, read by absolute index. */
    private static float[] read(ByteBuffer b, int at, int n) {
        float[] out = new float[n];
        for (int i = 0; i < n; i++) {
            out[i] = b.getFloat(at + i * Float.BYTES);
        }
        return out;
    }

    private static ByteOrder otherOrder() {
        return ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN ? ByteOrder.BIG_ENDIAN : ByteOrder.LITTLE_ENDIAN;
    }

    @Test
    void aWrappedBufferIsInitPushedAndPulledInPlace() {
        ByteBuffer init = floats(1, 2, 3, 4);
        ByteBuffer grad = floats(0, 0, 0, 0);
        ByteBuffer out = floats(0, 0, 0, 0);
        try (KVStore kv = KVStore.create("local");
                NDArray w = NDArray.wrap(init, new int[] {2, 2}, DType.FLOAT32);
                NDArray g = NDArray.wrap(grad, new int[] {2, 2}, DType.FLOAT32);
                NDArray o = NDArray.wrap(out, new int[] {2, 2}, DType.FLOAT32)) {
            assertArrayEquals(new int[] {2, 2}, w.shape());
            assertEquals(DType.FLOAT32, w.dtype());
            assertEquals(Context.cpu(0), w.context());
            kv.init("w", w);
            try (NDArray stored = kv.pull("w")) {
                assertArrayEquals(new float[] {1, 2, 3, 4}, stored.toFloatArray(), "init read the buffer");
            }
            // Written through the buffer after wrap: the push reads the buffer, not a copy.
            for (int i = 0; i < 4; i++) {
                grad.putFloat(i * Float.BYTES, 10 * (i + 1));
            }
            kv.push("w", new NDArray[] {g, g});
            kv.pull("w", o);
            assertArrayEquals(new float[] {20, 40, 60, 80}, read(out, 0, 4), "the pull wrote the buffer itself");
            assertArrayEquals(new float[] {20, 40, 60, 80}, o.toFloatArray());
            assertArrayEquals(new float[] {1, 2, 3, 4}, read(init, 0, 4), "init left its value alone");
        }
    }

    @Test
    void theArrayAndTheBufferAreOneMemory() {
        ByteBuffer b = floats(1, 2, 3);
        try (NDArray a = NDArray.wrap(b, new int[] {3}, DType.FLOAT32)) {
            a.addInPlace(1);
            assertArrayEquals(new float[] {2, 3, 4}, read(b, 0, 3));
            b.putFloat(4, -5);
            assertArrayEquals(new float[] {2, -5, 4}, a.toFloatArray());
            a.copyFrom(new float[] {7, 8, 9});
            assertArrayEquals(new float[] {7, 8, 9}, read(b, 0, 3));
        }
    }

    @Test
    void nonBlockingCallsReadAndWriteTheBuffer() throws Exception {
        ByteBuffer value = floats(3, 3);
        ByteBuffer out = floats(0, 0);
        try (KVStore kv = KVStore.create("local");
                NDArray zeros = NDArray.zeros(2);
                NDArray v = NDArray.wrap(value, new int[] {2}, DType.FLOAT32);
                NDArray o = NDArray.wrap(out, new int[] {2}, DType.FLOAT32)) {
            kv.init("k", zeros);
            kv.async().push("k", v).get(30, TimeUnit.SECONDS);
            kv.async().pull("k", o).get(30, TimeUnit.SECONDS);
            assertArrayEquals(new float[] {3, 3}, read(out, 0, 2));
        }
    }

    /**
     * Calls on one buffer through different wraps of it take effect in call order: a blocking pull
     * after a non-blocking pull (queued behind a slow push) into another wrap of the same bytes ends
     * with its own value, and a push after such a pull pushes what the pull wrote.
     */
    @Test
    void callsThroughDifferentWrapsOfOneBufferTakeEffectInCallOrder() throws Exception {
        final int n = 1 << 14;
        try (KVStore kv = KVStore.create("local");
                NDArray seven = NDArray.full(new int[] {n}, 7);
                NDArray five = NDArray.full(new int[] {n}, 5);
                NDArray zeros = NDArray.zeros(n)) {
            kv.init("a", seven).init("b", five).init("c", zeros);
            kv.setUpdater((key, index, merged, stored) -> {
                try {
                    Thread.sleep(2);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                stored.copyFrom(merged);
            });
            for (int round = 0; round < 20; round++) {
                ByteBuffer b = ByteBuffer.allocateDirect(n * Float.BYTES).order(ByteOrder.nativeOrder());
                try (NDArray first = NDArray.wrap(b, new int[] {n}, DType.FLOAT32);
                        NDArray second = NDArray.wrap(b.duplicate().order(ByteOrder.nativeOrder()), new int[] {n},
                                DType.FLOAT32)) {
                    kv.async().push("a", seven);
                    CompletableFuture<Void> pulled = kv.async().pull("a", first);
                    kv.pull("b", second);
                    pulled.get(30, TimeUnit.SECONDS);
                    assertArrayEquals(filled(n, 5), read(b, 0, n), "round " + round + ": the later pull's value");
                    kv.async().push("a", seven);
                    pulled = kv.async().pull("a", first);
                    kv.push("c", second);
                    pulled.get(30, TimeUnit.SECONDS);
                    try (NDArray c = kv.pull("c")) {
                        assertArrayEquals(filled(n, 7), c.toFloatArray(), "round " + round + ": the push read the pull's");
                    }
                }
            }
        }
    }

    @Test
    void aCallStillPendingWhenTheArrayIsClosedStillWritesTheBuffer() throws Exception {
        ByteBuffer value = floats(4, 4);
        ByteBuffer out = floats(0, 0);
        try (KVStore kv = KVStore.create("local");
                NDArray zeros = NDArray.zeros(2)) {
            kv.init("k", zeros);
            NDArray v = NDArray.wrap(value, new int[] {2}, DType.FLOAT32);
            NDArray o = NDArray.wrap(out, new int[] {2}, DType.FLOAT32);
            CompletableFuture<Void> pushed = kv.async().push("k", v);
            CompletableFuture<Void> pulled = kv.async().pull("k", o);
            v.close();
            o.close();
            pushed.get(30, TimeUnit.SECONDS);
            pulled.get(30, TimeUnit.SECONDS);
            kv.waitAll();
            assertArrayEquals(new float[] {4, 4}, read(out, 0, 2), "the call held the buffer it writes");
        }
    }

    @Test
    void onlyTheBytesBetweenPositionAndLimitAreTheArray() {
        ByteBuffer b = floats(-1, -1, -1, -1, -1, -1);
        b.position(8).limit(16);
        try (KVStore kv = KVStore.create("local");
                NDArray seven = NDArray.full(new int[] {2}, 7.0);
                NDArray a = NDArray.wrap(b, new int[] {2}, DType.FLOAT32)) {
            kv.init("k", seven);
            // Moving the buffer afterwards does not move the array.
            b.clear();
            kv.pull("k", a);
            assertArrayEquals(new float[] {-1, -1, 7, 7, -1, -1}, read(b, 0, 6));
        }
    }

    @Test
    void otherDtypesAreReadAndWrittenInNativeOrder() {
        ByteBuffer ints = ByteBuffer.allocateDirect(3 * Integer.BYTES).order(ByteOrder.nativeOrder());
        ints.putInt(0, 5).putInt(4, -6).putInt(8, 1 << 20);
        ByteBuffer doubles = ByteBuffer.allocateDirect(2 * Double.BYTES).order(ByteOrder.nativeOrder());
        doubles.putDouble(0, 0.25).putDouble(8, 1e300);
        // One-byte elements have no byte order: any order flag is accepted.
        ByteBuffer bytes = ByteBuffer.allocateDirect(3).order(otherOrder());
        bytes.put(0, (byte) 200).put(1, (byte) 1).put(2, (byte) 255);
        try (NDArray i = NDArray.wrap(ints, new int[] {3}, DType.INT32);
                NDArray d = NDArray.wrap(doubles, new int[] {2}, DType.FLOAT64);
                NDArray u = NDArray.wrap(bytes, new int[] {3}, DType.UINT8)) {
            assertArrayEquals(new int[] {5, -6, 1 << 20}, i.toIntArray());
            assertArrayEquals(new double[] {0.25, 1e300}, d.toDoubleArray());
            assertArrayEquals(new int[] {200, 1, 255}, u.toIntArray());
            u.addInPlace(1);
            assertArrayEquals(new byte[] {(byte) 201, 2, 0}, new byte[] {bytes.get(0), bytes.get(1), bytes.get(2)},
                    "uint8 wraps, in the buffer");
        }
    }

    @Test
    void anEmptyBufferWrapsAnEmptyArray() {
        try (NDArray e = NDArray.wrap(ByteBuffer.allocateDirect(0).order(ByteOrder.nativeOrder()), new int[] {0, 3},
                DType.FLOAT32)) {
            assertEquals(0, e.size());
            assertEquals(0, e.toFloatArray().length);
        }
    }

    @Test
    void aHeapBufferIsRefusedWithAnIllegalArgumentException() {
        ByteBuffer heap = ByteBuffer.allocate(16).order(ByteOrder.nativeOrder());
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> NDArray.wrap(heap, new int[] {4}, DType.FLOAT32));
        assertTrue(e.getMessage().contains("heap buffer") && e.getMessage().contains("allocateDirect"),
                e.getMessage());
        // The native side refuses it too, should it ever be called with one.
        KVStoreException n = assertCode(KVStoreException.Code.INVALID_ARGUMENT,
                () -> NDArray.nWrap(heap, 0, 16, true, new long[] {4}, DType.FLOAT32.code()));
        assertTrue(n.getMessage().contains("not a direct ByteBuffer"), n.getMessage());
    }

    @Test
    void aNonNativeByteOrderIsRefusedForDtypesWiderThanAByte() {
        ByteBuffer b = ByteBuffer.allocateDirect(16).order(otherOrder());
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> NDArray.wrap(b, new int[] {4}, DType.FLOAT32));
        assertTrue(e.getMessage().contains("byte order is " + otherOrder())
                && e.getMessage().contains("ByteOrder.nativeOrder()"), e.getMessage());
        assertThrows(IllegalArgumentException.class, () -> NDArray.wrap(b, new int[] {8}, DType.FLOAT16));
    }

    @Test
    void remainingBytesOtherThanTheShapesAreRefused() {
        ByteBuffer b = ByteBuffer.allocateDirect(16).order(ByteOrder.nativeOrder());
        b.limit(12);
        KVStoreException e = assertCode(KVStoreException.Code.INVALID_ARGUMENT,
                () -> NDArray.wrap(b, new int[] {4}, DType.FLOAT32));
        assertTrue(e.getMessage().contains("12 bytes remaining") && e.getMessage().contains("takes 16"),
                e.getMessage());
        b.limit(16);
        assertCode(KVStoreException.Code.INVALID_ARGUMENT, () -> NDArray.wrap(b, new int[] {2}, DType.FLOAT32));
        assertCode(KVStoreException.Code.INVALID_ARGUMENT, () -> NDArray.wrap(b, new int[] {2, -2}, DType.FLOAT32));
        assertCode(KVStoreException.Code.INVALID_ARGUMENT,
                () -> NDArray.wrap(b, new int[] {Integer.MAX_VALUE, Integer.MAX_VALUE, Integer.MAX_VALUE},
                        DType.FLOAT64));
    }

    @Test
    void aStartNotAlignedForTheDtypeIsRefused() {
        ByteBuffer b = ByteBuffer.allocateDirect(64).alignedSlice(8).order(ByteOrder.nativeOrder());
        b.position(2).limit(18);
        KVStoreException e = assertCode(KVStoreException.Code.INVALID_ARGUMENT,
                () -> NDArray.wrap(b, new int[] {4}, DType.FLOAT32));
        assertTrue(e.getMessage().contains("not aligned for float32") && e.getMessage().contains("alignedSlice"),
                e.getMessage());
        b.position(4).limit(20);
        assertCode(KVStoreException.Code.INVALID_ARGUMENT, () -> NDArray.wrap(b, new int[] {2}, DType.FLOAT64));
        try (NDArray a = NDArray.wrap(b, new int[] {4}, DType.FLOAT32);
                NDArray h = NDArray.wrap(b, new int[] {8}, DType.FLOAT16)) {
            assertEquals(4, a.size(), "aligned for its own dtype is enough");
            assertEquals(8, h.size());
        }
    }

    @Test
    void aSpanOutsideTheBufferIsRefusedByTheNativeSide() {
        // Only reachable through a buffer changed by another thread mid-call; never a crash.
        ByteBuffer b = ByteBuffer.allocateDirect(16).order(ByteOrder.nativeOrder());
        int f32 = DType.FLOAT32.code();
        assertCode(KVStoreException.Code.INVALID_ARGUMENT, () -> NDArray.nWrap(b, 8, 16, true, new long[] {4}, f32));
        assertCode(KVStoreException.Code.INVALID_ARGUMENT, () -> NDArray.nWrap(b, -4, 16, true, new long[] {4}, f32));
        assertCode(KVStoreException.Code.INVALID_ARGUMENT,
                () -> NDArray.nWrap(b, Integer.MAX_VALUE, 4, true, new long[] {1}, f32));
        assertCode(KVStoreException.Code.INVALID_ARGUMENT, () -> NDArray.nWrap(b, 0, -4, true, new long[] {1}, f32));
    }

    @Test
    void nullArgumentsAreNullPointerExceptionsNamingTheParameter() {
        ByteBuffer b = floats(1);
        assertNpe("buffer", () -> NDArray.wrap(null, new int[] {1}, DType.FLOAT32));
        assertNpe("shape", () -> NDArray.wrap(b, null, DType.FLOAT32));
        assertNpe("dtype", () -> NDArray.wrap(b, new int[] {1}, null));
    }

    @Test
    void aReadOnlyBufferMayBePushedButAPullIntoItFailsAndChangesNothing() {
        ByteBuffer b = floats(5, 5);
        ByteBuffer readOnly = b.asReadOnlyBuffer().order(ByteOrder.nativeOrder());
        try (KVStore kv = KVStore.create("local");
                NDArray seven = NDArray.full(new int[] {2}, 7.0);
                NDArray ro = NDArray.wrap(readOnly, new int[] {2}, DType.FLOAT32)) {
            kv.init("w", seven);
            KVStoreException e = assertCode(KVStoreException.Code.INVALID_ARGUMENT, () -> kv.pull("w", ro));
            assertTrue(e.getMessage().contains("read-only"), e.getMessage());
            assertArrayEquals(new float[] {5, 5}, read(b, 0, 2), "nothing written to the buffer");
            try (NDArray stored = kv.pull("w")) {
                assertArrayEquals(filled(2, 7), stored.toFloatArray(), "the key kept its value");
            }
            assertCode(KVStoreException.Code.INVALID_ARGUMENT, () -> ro.addInPlace(1));
            ExecutionException async = assertThrows(ExecutionException.class,
                    () -> kv.async().pull("w", ro).get(30, TimeUnit.SECONDS));
            KVStoreException cause = assertInstanceOf(KVStoreException.class, async.getCause());
            assertEquals(KVStoreException.Code.INVALID_ARGUMENT, cause.code());
            assertArrayEquals(new float[] {5, 5}, read(b, 0, 2));
            kv.push("w", ro);
            try (NDArray stored = kv.pull("w")) {
                assertArrayEquals(filled(2, 5), stored.toFloatArray(), "a read-only array is pushed");
            }
        }
    }

    @Test
    void theArrayKeepsTheBufferAliveUntilItIsClosed() throws InterruptedException {
        ByteBuffer b = floats(1, 2, 3, 4);
        WeakReference<ByteBuffer> ref = new WeakReference<>(b);
        NDArray a = NDArray.wrap(b, new int[] {4}, DType.FLOAT32);
        b = null;
        try {
            for (int i = 0; i < 5; i++) {
                System.gc();
                Thread.sleep(10);
            }
            assertNotNull(ref.get(), "the array holds the buffer");
            assertArrayEquals(new float[] {1, 2, 3, 4}, a.toFloatArray());
        } finally {
            a.close();
        }
        for (int i = 0; i < 200 && ref.get() != null; i++) {
            System.gc();
            Thread.sleep(10);
        }
        assertNull(ref.get(), "closing the array let go of the buffer");
    }

    /** {@code n} keys' slices of one direct buffer ({@code len} floats each), wrapped each on its own. */
    private static NDArray[] slices(ByteBuffer b, int n, int len, int[] of) {
        NDArray[] out = new NDArray[n];
        for (int i = 0; i < n; i++) {
            ByteBuffer s = b.duplicate().order(ByteOrder.nativeOrder());
            s.position(of[i] * len * Float.BYTES).limit((of[i] + 1) * len * Float.BYTES);
            out[i] = NDArray.wrap(s.slice().order(ByteOrder.nativeOrder()), new int[] {len}, DType.FLOAT32);
        }
        return out;
    }

    /**
     * A pushpull of 256 keys whose outs are other wraps of the bytes of other keys' values reads every
     * value before it writes any out, as when the outs are the values' own arrays: key 128 stored 0.0
     * (an out written before its value was read), not 128.0. And two views of the same bytes share
     * storage.
     */
    @Test
    void outsWrappedOverOtherKeysValuesAreWrittenAfterEveryValueIsRead() {
        final int n = 256;
        final int len = 16;
        String[] keys = new String[n];
        int[] own = new int[n];
        int[] across = new int[n];
        for (int i = 0; i < n; i++) {
            keys[i] = "k" + i;
            own[i] = i;
            across[i] = (i + n / 2) % n;
        }
        try (KVStore kv = KVStore.create("local")) {
            try (NDArray zero = NDArray.zeros(len)) {
                NDArray[] zeros = new NDArray[n];
                java.util.Arrays.fill(zeros, zero);
                kv.init(keys, zeros);
            }
            for (int round = 0; round < 30; round++) {
                ByteBuffer b = ByteBuffer.allocateDirect(n * len * Float.BYTES).order(ByteOrder.nativeOrder());
                for (int i = 0; i < n * len; i++) {
                    b.putFloat(i * Float.BYTES, i / len);
                }
                NDArray[] values = slices(b, n, len, own);
                NDArray[] outs = slices(b, n, len, across);
                try {
                    assertTrue(values[3].sameStorage(outs[(3 + n / 2) % n]), "two wraps of the same bytes");
                    assertTrue(!values[3].sameStorage(values[4]), "wraps of different bytes");
                    kv.pushpull(keys, values, outs);
                    for (int k = 0; k < n; k += 37) {
                        try (NDArray stored = kv.pull(keys[k])) {
                            assertArrayEquals(filled(len, k), stored.toFloatArray(), "round " + round + ": key " + k);
                        }
                        // Slice j is key (j + n/2) % n's out: it holds that key's value.
                        assertArrayEquals(filled(len, (k + n / 2) % n), read(b, k * len * Float.BYTES, len),
                                "round " + round + ": slice " + k);
                    }
                } finally {
                    for (int i = 0; i < n; i++) {
                        values[i].close();
                        outs[i].close();
                    }
                }
            }
        }
    }
}
