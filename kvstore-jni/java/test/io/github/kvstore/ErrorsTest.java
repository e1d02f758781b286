package io.github.kvstore;

import static io.github.kvstore.Fixtures.assertAll;
import static io.github.kvstore.Fixtures.assertCode;
import static io.github.kvstore.Fixtures.assertNpe;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.kvstore.KVStoreException.Code;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Every {@link KVStoreException.Code} but {@code INTERNAL} from a real situation (
 * {@code INTERNAL} stands for a bug, so it comes from a deliberate panic in a test-only
 * native), and everything a caller can pass that must be an exception, never a crash.
 */
class ErrorsTest {
    private static final int[] SHAPE = {2, 3};

    @Test
    void nativeErrorCodesEqualTheJavaEnumInOrder() {
        String[] java = Arrays.stream(Code.values()).map(Enum::name).toArray(String[]::new);
        assertArrayEquals(java, Native.nErrorCodes());
        assertEquals(14, java.length);
        assertEquals(Code.INTERNAL, Code.values()[13]);
        assertEquals(Code.RESOURCE_EXHAUSTED, Code.values()[12]);
    }

    @Test
    void pullOfAnUnknownKeyIsKeyNotInitialized() {
        try (KVStore kv = KVStore.create();
                NDArray out = NDArray.zeros(SHAPE)) {
            KVStoreException e = assertCode(Code.KEY_NOT_INITIALIZED, () -> kv.pull("nope", out));
            assertTrue(e.getMessage().contains("nope"), e.getMessage());
            assertCode(Code.KEY_NOT_INITIALIZED, () -> kv.push("nope", out));
            assertCode(Code.KEY_NOT_INITIALIZED, () -> kv.pushpull("nope", out));
        }
    }

    @Test
    void secondInitOfAKeyIsAlreadyInitializedAndAddsNothing() {
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(SHAPE);
                NDArray out = NDArray.zeros(SHAPE)) {
            kv.init("k", ones);
            assertCode(Code.ALREADY_INITIALIZED, () -> kv.init("k", ones));
            assertCode(Code.ALREADY_INITIALIZED, () -> kv.broadcast("k", ones, out));
            // All or nothing: "fresh" must not be added by a call that fails on "k".
            assertCode(Code.ALREADY_INITIALIZED, () -> kv.init(new String[] {"fresh", "k"}, new NDArray[] {ones, ones}));
            assertCode(Code.KEY_NOT_INITIALIZED, () -> kv.pull("fresh", out));
            assertCode(Code.ALREADY_INITIALIZED, () -> kv.init(new String[] {"x", "x"}, new NDArray[] {ones, ones}));
        }
    }

    @Test
    void wrongShapesAreShapeMismatch() {
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(SHAPE);
                NDArray other = NDArray.ones(3, 2);
                NDArray out = NDArray.zeros(SHAPE)) {
            kv.init("k", ones);
            assertCode(Code.SHAPE_MISMATCH, () -> kv.push("k", other));
            assertCode(Code.SHAPE_MISMATCH, () -> kv.pull("k", other));
            assertCode(Code.SHAPE_MISMATCH, () -> kv.push("k", new NDArray[] {ones, other}));
            assertCode(Code.SHAPE_MISMATCH, () -> ones.add(other));
            assertCode(Code.SHAPE_MISMATCH, () -> ones.copyFrom(other));
            assertCode(Code.SHAPE_MISMATCH, () -> kv.broadcast("b", ones, other));
            kv.pull("k", out);
            assertAll(1f, out);
        }
    }

    @Test
    void pullIntoAnInt32OutIsDtypeMismatch() {
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(SHAPE);
                NDArray intOut = NDArray.zeros(SHAPE, Context.cpu(), DType.INT32);
                NDArray doubles = NDArray.ones(SHAPE, Context.cpu(), DType.FLOAT64)) {
            kv.init("k", ones);
            assertCode(Code.DTYPE_MISMATCH, () -> kv.pull("k", intOut));
            assertCode(Code.DTYPE_MISMATCH, () -> kv.push("k", doubles));
            assertCode(Code.DTYPE_MISMATCH, () -> ones.addInPlace(doubles));
        }
    }

    @Test
    void errorsCarryTheKeyAndWhatWasExpectedAndGot() {
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(SHAPE);
                NDArray other = NDArray.ones(3, 2);
                NDArray doubles = NDArray.ones(SHAPE, Context.cpu(), DType.FLOAT64)) {
            kv.init("k", ones);
            KVStoreException e = assertCode(Code.SHAPE_MISMATCH, () -> kv.push("k", other));
            assertEquals("k", e.key());
            assertArrayEquals(new long[] {2, 3}, e.expectedShape());
            assertArrayEquals(new long[] {3, 2}, e.gotShape());
            e.gotShape()[0] = 99;
            assertArrayEquals(new long[] {3, 2}, e.gotShape(), "the accessor returns a copy");
            assertNull(e.expectedDType());
            assertFalse(e.expectedLength().isPresent());

            e = assertCode(Code.DTYPE_MISMATCH, () -> kv.push("k", doubles));
            assertEquals("k", e.key());
            assertSame(DType.FLOAT32, e.expectedDType());
            assertSame(DType.FLOAT64, e.gotDType());
            assertNull(e.expectedShape());
            assertNull(e.gotShape());

            e = assertCode(Code.KEY_NOT_INITIALIZED, () -> kv.pull("nope", ones));
            assertEquals("nope", e.key());
            assertNull(e.expectedShape());
            assertNull(e.gotDType());
            assertEquals("k", assertCode(Code.ALREADY_INITIALIZED, () -> kv.init("k", ones)).key());

            e = assertCode(Code.LENGTH_MISMATCH, () -> kv.push(new String[] {"k", "k"}, new NDArray[] {ones}));
            assertNull(e.key());
            assertEquals(2, e.expectedLength().getAsLong());
            assertEquals(1, e.gotLength().getAsLong());

            // Array arithmetic concerns no key.
            e = assertCode(Code.SHAPE_MISMATCH, () -> ones.add(other));
            assertNull(e.key());
            assertArrayEquals(new long[] {2, 3}, e.expectedShape());
            e = assertCode(Code.DTYPE_MISMATCH, () -> ones.addInPlace(doubles));
            assertNull(e.key());
            assertSame(DType.FLOAT64, e.gotDType());
        }
        KVStoreException java = new KVStoreException(Code.IO, "made in Java");
        assertNull(java.key());
        assertNull(java.expectedShape());
        assertNull(java.expectedDType());
        assertFalse(java.gotLength().isPresent());
    }

    @Test
    void listsOfDifferentLengthsAreLengthMismatch() {
        try (KVStore kv = KVStore.create();
                NDArray a = NDArray.ones(SHAPE);
                NDArray b = NDArray.ones(SHAPE)) {
            String[] two = {"a", "b"};
            NDArray[] one = {a};
            assertCode(Code.LENGTH_MISMATCH, () -> kv.init(two, one));
            kv.init(two, new NDArray[] {a, b});
            assertCode(Code.LENGTH_MISMATCH, () -> kv.push(two, one));
            assertCode(Code.LENGTH_MISMATCH, () -> kv.push(two, new NDArray[] {a, b, a}, 2));
            assertCode(Code.LENGTH_MISMATCH, () -> kv.pull(two, one));
            assertCode(Code.LENGTH_MISMATCH, () -> kv.pushpull(two, new NDArray[] {a, b}, one));
            assertCode(Code.LENGTH_MISMATCH, () -> kv.pushpull(two, one));
            assertCode(Code.LENGTH_MISMATCH, () -> kv.broadcast(new String[] {"c", "d"}, one, one));
            assertCode(Code.LENGTH_MISMATCH, () -> kv.init(new String[] {}, one));
        }
    }

    @Test
    void unknownStoreKindIsUnknownStoreKind() {
        KVStoreException e = assertCode(Code.UNKNOWN_STORE_KIND, () -> KVStore.create("foo"));
        assertTrue(e.getMessage().contains("foo"), e.getMessage());
        assertCode(Code.UNKNOWN_STORE_KIND, () -> KVStore.create(""));
    }

    @Test
    void gpuArraysWithoutABackendAreDeviceUnavailable() {
        KVStoreException e = assertCode(Code.DEVICE_UNAVAILABLE,
                () -> NDArray.zeros(new int[] {2}, Context.gpu(0), DType.FLOAT32));
        assertTrue(e.getMessage().contains("gpu(0)"), e.getMessage());
        try (NDArray a = NDArray.ones(2)) {
            assertCode(Code.DEVICE_UNAVAILABLE, () -> a.copyTo(Context.gpu(1)));
            assertCode(Code.DEVICE_UNAVAILABLE,
                    () -> NDArray.array(new float[] {1, 2}, new int[] {2}, Context.gpu(0), DType.FLOAT32));
        }
    }

    @Test
    void distSyncAndGradientCompressionAreUnsupported() {
        // The suites run on the default jar, without MPI (kvstore-mpi/tests/jvm.rs runs the
        // MPI jar under mpirun).
        assertFalse(KVStore.mpiSupported());
        KVStoreException e = assertCode(Code.UNSUPPORTED, () -> KVStore.create("dist_sync"));
        // The JVM's route to MPI, not a Rust program's (Cargo) or Python's (the wheel).
        for (String kind : new String[] {"dist_sync", "dist_async"}) {
            String message = assertCode(Code.UNSUPPORTED, () -> KVStore.create(kind)).getMessage();
            assertTrue(message.contains("kvstore-mpi jar") && message.contains("make jar FEATURES=mpi"), message);
            assertFalse(message.contains("Cargo.toml") || message.contains("make python"), message);
        }
        KVStore.finalizeMpi(); // does nothing without MPI
        assertCode(Code.UNSUPPORTED, () -> KVStore.create("nccl"));
        try (KVStore kv = KVStore.create()) {
            Map<String, String> params = new HashMap<>();
            params.put("type", "2bit");
            params.put("threshold", "0.5");
            assertCode(Code.UNSUPPORTED, () -> kv.setGradientCompression(params));
            assertEquals("local", kv.type(), "the store still works");
        }
    }

    @Test
    void aStateFileThatCannotBeWrittenOrReadIsIo(@TempDir Path dir) throws IOException {
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(SHAPE)) {
            kv.init("w", ones).setOptimizer(Optimizer.sgd().momentum(0.9).build()).push("w", ones);
            KVStoreException e = assertCode(Code.IO,
                    () -> kv.saveOptimizerStates(dir.resolve("no/such/folder/w.states").toString()));
            assertTrue(e.getMessage().contains("w.states"), e.getMessage());
            Path notStates = dir.resolve("not.states");
            Files.writeString(notStates, "this is not an optimizer-state file");
            assertCode(Code.IO, () -> kv.loadOptimizerStates(notStates.toString()));
            assertCode(Code.IO, () -> kv.loadOptimizerStates(dir.resolve("absent.states").toString()));
            // Not a regular file: refused before it is opened.
            assertCode(Code.INVALID_ARGUMENT, () -> kv.loadOptimizerStates(dir.toString()));
        }
    }

    @Test
    void negativeDimensionsAndIntegerDivisionByZeroAreInvalidArgument() {
        assertCode(Code.INVALID_ARGUMENT, () -> NDArray.zeros(2, -1));
        assertCode(Code.INVALID_ARGUMENT, () -> NDArray.ones(new int[] {-5}, Context.cpu(), DType.INT8));
        assertCode(Code.INVALID_ARGUMENT, () -> NDArray.array(new float[] {}, new int[] {-1}));
        try (NDArray i = NDArray.array(new int[] {4, 6}, new int[] {2});
                NDArray zero = NDArray.zeros(new int[] {2}, Context.cpu(), DType.INT32)) {
            assertCode(Code.INVALID_ARGUMENT, () -> i.div(0));
            assertCode(Code.INVALID_ARGUMENT, () -> i.divInPlace(zero));
            assertCode(Code.INVALID_ARGUMENT, () -> i.div(zero));
            assertArrayEquals(new int[] {4, 6}, i.toIntArray(), "a failed division changes nothing");
        }
        try (KVStore kv = KVStore.create()) {
            assertCode(Code.INVALID_ARGUMENT, () -> kv.isCapable("teleport"));
        }
    }

    @Test
    void hugeShapesAreInvalidArgument() {
        int[] huge = {Integer.MAX_VALUE, Integer.MAX_VALUE, 8};
        assertCode(Code.INVALID_ARGUMENT, () -> NDArray.zeros(huge));
        assertCode(Code.INVALID_ARGUMENT, () -> NDArray.zeros(huge, Context.cpu(), DType.FLOAT64));
        assertCode(Code.INVALID_ARGUMENT, () -> NDArray.full(huge, 1.0, Context.cpu(), DType.UINT8));
        assertCode(Code.INVALID_ARGUMENT, () -> NDArray.array(new float[] {1}, huge));
        assertCode(Code.INVALID_ARGUMENT, () -> NDArray.array(new long[] {1}, huge));
    }

    @Test
    void memoryTheSystemRefusesIsResourceExhausted() {
        // 2^44 float32 elements: a size that exists, 64 TiB that no machine here gives.
        KVStoreException e = assertCode(Code.RESOURCE_EXHAUSTED, () -> NDArray.zeros(1 << 20, 1 << 20, 16));
        assertTrue(e.getMessage().contains("70368744177664 bytes"), e.getMessage());
        // A size beyond what can be represented stays INVALID_ARGUMENT.
        assertCode(Code.INVALID_ARGUMENT, () -> NDArray.zeros(1 << 30, 1 << 30, 4));
        // An arange whose values cannot fit the Java heap while they are computed.
        long heap = Runtime.getRuntime().maxMemory();
        double n = 2e9;
        if (n * Double.BYTES > heap) {
            assertCode(Code.RESOURCE_EXHAUSTED, () -> NDArray.arange(0, n, 1));
        } else {
            System.out.println("SKIP-PART: the heap (" + heap + " bytes) holds 2e9 doubles");
        }
    }

    @Test
    void dataOfAnotherLengthThanTheShapeIsShapeMismatch() {
        assertCode(Code.SHAPE_MISMATCH, () -> NDArray.array(new float[] {1, 2, 3}, new int[] {2, 2}));
        assertCode(Code.SHAPE_MISMATCH, () -> NDArray.array(new double[] {1}, new int[] {2}));
        assertCode(Code.SHAPE_MISMATCH, () -> NDArray.array(new int[] {1, 2}, new int[] {}));
        assertCode(Code.SHAPE_MISMATCH,
                () -> NDArray.array(new long[] {1, 2, 3}, new int[] {2}, Context.cpu(), DType.FLOAT16));
    }

    @Test
    void arraysFromJavaDataCheckTheLengthFirstAndKeepTheStoresOwnErrors() {
        // The converting path (float[] into float64, int[] into float32) keeps the error of
        // the device.
        assertCode(Code.DEVICE_UNAVAILABLE,
                () -> NDArray.array(new float[2], new int[] {2}, Context.gpu(0), DType.FLOAT64));
        assertCode(Code.DEVICE_UNAVAILABLE,
                () -> NDArray.array(new int[2], new int[] {2}, Context.gpu(0), DType.FLOAT32));
        // 2^63 elements: compared with the data's length, never allocated.
        int[] unallocatable = {Integer.MAX_VALUE, Integer.MAX_VALUE, 2};
        assertCode(Code.SHAPE_MISMATCH, () -> NDArray.array(new float[1], unallocatable));
        assertCode(Code.SHAPE_MISMATCH,
                () -> NDArray.array(new double[1], unallocatable, Context.cpu(), DType.FLOAT32));
        // 10 GB of float32 for one element.
        assertCode(Code.SHAPE_MISMATCH, () -> NDArray.array(new float[1], new int[] {100_000, 25_000}));
        try (NDArray ok = NDArray.array(new float[] {1, 2}, new int[] {2}, Context.cpu(), DType.FLOAT64)) {
            assertArrayEquals(new double[] {1, 2}, ok.toDoubleArray());
        }
    }

    @Test
    void stringsThatAreNotValidUtf16AreInvalidArgumentNotAnotherKey(@TempDir Path dir) throws IOException {
        try (KVStore kv = KVStore.create();
                NDArray seven = NDArray.full(new int[] {1}, 7);
                NDArray out = NDArray.zeros(1)) {
            KVStoreException e = assertCode(Code.INVALID_ARGUMENT, () -> kv.init("\uD800", seven));
            assertTrue(e.getMessage().contains("unpaired surrogate"), e.getMessage());
            // Unpaired surrogates never stand for one another (a lossy conversion made
            // U+D800 and U+DC00 the same key).
            kv.init("k", seven);
            assertCode(Code.INVALID_ARGUMENT, () -> kv.pull("\uDC00", out));
            assertCode(Code.INVALID_ARGUMENT, () -> kv.push("k\uDBFF", seven));
            assertCode(Code.INVALID_ARGUMENT, () -> kv.push(new String[] {"k", "\uDFFFk"}, new NDArray[] {seven, seven}));
            assertCode(Code.INVALID_ARGUMENT, () -> kv.pull(new String[] {"k", "\uD800"}, new NDArray[] {out, out}));
            assertCode(Code.INVALID_ARGUMENT, () -> kv.pushpull("\uD800", seven, out));
            assertCode(Code.INVALID_ARGUMENT, () -> kv.broadcast("\uDC00", seven, out));
            assertCode(Code.INVALID_ARGUMENT, () -> kv.isCapable("optimizer\uD800"));
            assertCode(Code.INVALID_ARGUMENT, () -> KVStore.create("local\uD800"));
            kv.setOptimizer(Optimizer.sgd().build());
            assertCode(Code.INVALID_ARGUMENT, () -> kv.saveOptimizerStates(dir + "/w\uD800.states"));
            try (var files = Files.list(dir)) {
                assertEquals(0, files.count(), "no file was written under another name");
            }
            // A surrogate pair is one character, and a key of its own.
            kv.setUpdater(null).init("\uD83D\uDE00", seven);
            kv.pull("\uD83D\uDE00", out);
            assertAll(7f, out);
            assertCode(Code.KEY_NOT_INITIALIZED, () -> kv.pull("\uD83D\uDE01", out));
        }
    }

    @Test
    void closedStoresAndArraysAreDisposed() {
        KVStore kv = KVStore.create();
        NDArray ones = NDArray.ones(SHAPE);
        NDArray closed = NDArray.ones(SHAPE);
        NDArray out = NDArray.zeros(SHAPE);
        kv.init("k", ones);
        closed.close();
        assertCode(Code.DISPOSED, () -> kv.push("k", closed));
        assertCode(Code.DISPOSED, () -> kv.pull("k", new NDArray[] {out, closed}));
        assertCode(Code.DISPOSED, () -> kv.init("j", closed));
        assertCode(Code.DISPOSED, () -> ones.add(closed));
        assertCode(Code.DISPOSED, () -> out.copyFrom(closed));
        assertCode(Code.DISPOSED, closed::toDoubleArray);
        kv.close();
        assertCode(Code.DISPOSED, () -> kv.push("k", ones));
        assertCode(Code.DISPOSED, () -> kv.pull("k", out));
        assertCode(Code.DISPOSED, kv::type);
        assertCode(Code.DISPOSED, kv::rank);
        assertCode(Code.DISPOSED, kv::numWorkers);
        assertCode(Code.DISPOSED, kv::barrier);
        assertCode(Code.DISPOSED, () -> kv.setUpdater(null));
        assertCode(Code.DISPOSED, () -> kv.isCapable("optimizer"));
        // Stale handles reach the native side as such: still DISPOSED, never a crash.
        assertCode(Code.DISPOSED, () -> StoreNatives.nType(0));
        assertCode(Code.DISPOSED, () -> StoreNatives.nPush(0, new String[] {"k"}, new long[] {0}, 0));
        assertCode(Code.DISPOSED, () -> NDArray.nToFloats(0));
        assertCode(Code.DISPOSED, () -> NDArray.nToFloats(Long.MAX_VALUE));
        assertCode(Code.DISPOSED, () -> NDArray.nInfo(-42));
        ones.close();
        out.close();
    }

    @Test
    void aThrowingUpdaterIsBackendWithItsExceptionAsCauseAndTheStoreKeepsItsValue() {
        IllegalStateException boom = new IllegalStateException("boom");
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(SHAPE);
                NDArray out = NDArray.zeros(SHAPE)) {
            kv.init(new String[] {"a", "b"}, new NDArray[] {ones, ones});
            kv.setUpdater((key, index, merged, stored) -> {
                stored.addInPlace(100);
                if (key.equals("b")) {
                    throw boom;
                }
            });
            KVStoreException e = assertCode(Code.BACKEND, () -> kv.push(new String[] {"a", "b"}, new NDArray[] {ones, ones}));
            assertSame(boom, e.getCause());
            // Neither key changed: "a"'s successful update is not committed either.
            kv.pull("a", out);
            assertAll(1f, out);
            kv.pull("b", out);
            assertAll(1f, out);
            try (NDArray two = ones.mul(2)) {
                kv.setUpdater(null).push("b", two).pull("b", out);
            }
            assertAll(2f, out);
        }
    }

    /**
     * The updater's exception is the cause wherever the updater ran: a blocking push queued behind a
     * running non-blocking call runs it on an engine thread, and a push of many keys may run it on the
     * comm's threads. It rides inside the store's error; before, a thread-local of the thread that ran
     * the updater held it, and the caller's exception said "see the cause" with no cause.
     */
    @Test
    void anUpdatersExceptionIsTheCauseWhateverThreadRanTheUpdater() throws Exception {
        try (KVStore kv = KVStore.create("local"); NDArray a = NDArray.ones(SHAPE)) {
            kv.init("k", a);
            java.util.concurrent.atomic.AtomicInteger calls = new java.util.concurrent.atomic.AtomicInteger();
            IllegalStateException boom = new IllegalStateException("second call");
            kv.setUpdater((key, index, merged, stored) -> {
                if (calls.incrementAndGet() == 1) {
                    try {
                        Thread.sleep(200);
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                    return;
                }
                throw boom;
            });
            java.util.concurrent.CompletableFuture<Void> first = kv.async().push("k", a);
            KVStoreException e = assertCode(Code.BACKEND, () -> kv.push("k", a));
            assertSame(boom, e.getCause(), "the blocking push queued behind a running call");
            first.get(10, java.util.concurrent.TimeUnit.SECONDS);
        }
        for (String kind : new String[] {"local", "device"}) {
            String[] keys = new String[256];
            NDArray[] values = new NDArray[256];
            try (KVStore kv = KVStore.create(kind)) {
                for (int i = 0; i < keys.length; i++) {
                    keys[i] = "k" + i;
                    values[i] = NDArray.ones(16);
                }
                kv.init(keys, values);
                kv.setUpdater((key, index, merged, stored) -> {
                    if (key.equals("k200")) {
                        throw new IllegalArgumentException("refused " + key);
                    }
                    stored.addInPlace(merged);
                });
                for (int round = 0; round < 20; round++) {
                    KVStoreException e = assertCode(Code.BACKEND, () -> kv.push(keys, values));
                    assertTrue(e.getCause() instanceof IllegalArgumentException c && c.getMessage().equals("refused k200"),
                            () -> kind + ": blocking, cause " + e.getCause());
                    java.util.concurrent.ExecutionException x = org.junit.jupiter.api.Assertions.assertThrows(
                            java.util.concurrent.ExecutionException.class,
                            () -> kv.async().push(keys, values).get(10, java.util.concurrent.TimeUnit.SECONDS));
                    Throwable cause = x.getCause().getCause();
                    assertTrue(cause instanceof IllegalArgumentException c && c.getMessage().equals("refused k200"),
                            () -> kind + ": non-blocking, cause " + x.getCause().getCause());
                }
            } finally {
                for (NDArray v : values) {
                    if (v != null) {
                        v.close();
                    }
                }
            }
        }
    }

    @Test
    void aRustPanicIsInternal() {
        KVStoreException e = assertCode(Code.INTERNAL, Native::nDebugPanic);
        assertNull(e.getCause());
        // The library still works after a panic.
        try (NDArray a = NDArray.ones(2)) {
            assertAll(1f, a);
        }
    }

    @Test
    void anUnknownCodeStringMapsToInternal() {
        KVStoreException e = new KVStoreException("NO_SUCH_CODE", "m");
        assertEquals(Code.INTERNAL, e.code());
        assertTrue(e.getMessage().contains("NO_SUCH_CODE"));
        assertEquals(Code.SHAPE_MISMATCH, new KVStoreException("SHAPE_MISMATCH", "m").code());
        assertEquals("m", new KVStoreException("IO", "m").getMessage());
        assertEquals(Code.IO, new KVStoreException("IO", "m").code());
        IllegalStateException cause = new IllegalStateException();
        assertSame(cause, new KVStoreException("BACKEND", "m", cause).getCause());
        assertEquals(Code.INTERNAL, new KVStoreException((String) null, "m").code());
    }

    @Test
    void nullArgumentsAreNullPointerExceptionsNamingTheParameter() {
        try (KVStore kv = KVStore.create();
                NDArray a = NDArray.ones(SHAPE)) {
            kv.init("k", a);
            assertNpe("kind", () -> KVStore.create(null));
            assertNpe("key", () -> kv.init((String) null, a));
            assertNpe("value", () -> kv.init("k2", (NDArray) null));
            assertNpe("keys", () -> kv.init((String[]) null, new NDArray[] {a}));
            assertNpe("keys[1]", () -> kv.push(new String[] {"k", null}, new NDArray[] {a, a}));
            assertNpe("values[2]", () -> kv.push(new String[] {"k", "k", "k"}, new NDArray[] {a, a, null}));
            assertNpe("values", () -> kv.push("k", (NDArray[]) null));
            assertNpe("values[0]", () -> kv.push("k", new NDArray[] {null}));
            assertNpe("out", () -> kv.pull("k", (NDArray) null));
            assertNpe("outs[1]", () -> kv.pull("k", new NDArray[] {a, null}));
            assertNpe("outs", () -> kv.pushpull("k", new NDArray[] {a}, null));
            assertNpe("value", () -> kv.pushpull("k", (NDArray) null));
            assertNpe("outs[0]", () -> kv.broadcast("z", a, new NDArray[] {null}));
            assertNpe("body", () -> kv.sendCommandToServers(0, null));
            assertNpe("params", () -> kv.setGradientCompression(null));
            assertNpe("capability", () -> kv.isCapable(null));
            assertNpe("shape", () -> NDArray.zeros((int[]) null));
            assertNpe("data", () -> NDArray.array((float[]) null, SHAPE));
            assertNpe("ctx", () -> NDArray.ones(SHAPE, null, DType.INT8));
            assertNpe("dtype", () -> NDArray.ones(SHAPE, Context.cpu(), null));
            assertNpe("other", () -> a.add((NDArray) null));
            assertNpe("src", () -> a.copyFrom((NDArray) null));
            // Nothing reached the store: the key still holds its value.
            try (NDArray out = NDArray.zeros(SHAPE)) {
                kv.pull("k", out);
                assertAll(1f, out);
            }
        }
    }

    @Test
    void nullsPassedStraightToTheNativesAreInvalidArgument() {
        try (KVStore kv = KVStore.create()) {
            long h = storeHandle(kv);
            assertCode(Code.INVALID_ARGUMENT, () -> StoreNatives.nPush(h, null, new long[] {}, 0));
            assertCode(Code.INVALID_ARGUMENT, () -> StoreNatives.nPull(h, new String[] {}, null, 0));
            assertCode(Code.INVALID_ARGUMENT, () -> StoreNatives.nInit(h, new String[] {null}, new long[] {1}));
            assertCode(Code.INVALID_ARGUMENT, () -> StoreNatives.nCreate(null));
            assertCode(Code.INVALID_ARGUMENT, () -> StoreNatives.nSetOptimizer(h, null));
            assertCode(Code.INVALID_ARGUMENT, () -> StoreNatives.nSetOptimizer(h, "{\"name\": \"sgd\""));
            assertCode(Code.INVALID_ARGUMENT, () -> StoreNatives.nSaveOptimizerStates(h, null));
            assertCode(Code.INVALID_ARGUMENT, () -> StoreNatives.nLoadOptimizerStates(h, null));
            assertNull(StoreNatives.nOptimizerName(h));
            assertCode(Code.INVALID_ARGUMENT, () -> NDArray.nNew(null, 0, 1, 0, 0));
            assertCode(Code.INVALID_ARGUMENT, () -> NDArray.nFromFloats(null, new long[] {1}, 0, 1, 0));
            assertCode(Code.INVALID_ARGUMENT, () -> NDArray.nNew(new long[] {1}, 99, 1, 0, 0));
            assertCode(Code.INVALID_ARGUMENT, () -> NDArray.nNew(new long[] {1}, 0, 7, 0, 0));
            assertCode(Code.INVALID_ARGUMENT, () -> NDArray.nNew(new long[] {1}, 0, 1, -1, 0));
            assertCode(Code.INVALID_ARGUMENT, () -> NDArray.nNew(new long[] {Long.MIN_VALUE}, 0, 1, 0, 0));
        }
    }

    /** The native handle of a live store (package-private, for tests and the natives). */
    private static long storeHandle(KVStore kv) {
        return kv.handle();
    }

    @Test
    void nanValuesAreStoredSummedAndPulledWithoutTrouble() {
        try (KVStore kv = KVStore.create();
                NDArray nan = NDArray.full(SHAPE, Double.NaN);
                NDArray ones = NDArray.ones(SHAPE);
                NDArray out = NDArray.zeros(SHAPE);
                NDArray intNan = NDArray.array(new float[] {Float.NaN}, new int[] {1}, Context.cpu(), DType.INT32)) {
            kv.init("n", ones).push("n", new NDArray[] {ones, nan}).pull("n", out);
            for (float v : out.toFloatArray()) {
                assertTrue(Float.isNaN(v));
            }
            assertTrue(out.toString().contains("nan") || out.toString().contains("NaN"), out.toString());
            assertArrayEquals(new int[] {0}, intNan.toIntArray());
            try (NDArray scaled = ones.mul(Double.NaN)) {
                assertTrue(Float.isNaN(scaled.toFloatArray()[0]));
            }
        }
    }
}
