package io.github.kvstore;

import static io.github.kvstore.Fixtures.assertCode;
import static io.github.kvstore.GoldenTest.list;
import static io.github.kvstore.GoldenTest.obj;
import static io.github.kvstore.GoldenTest.str;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.kvstore.KVStoreException.Code;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * Row-sparse arrays and keys from Java: {@link RowSparse}, {@link KVStore#initRowSparse},
 * {@link KVStore#pushRowSparse}, {@link KVStore#rowSparsePull}, and MXNet 1.9.1's recorded
 * results ({@code tests/golden/mxnet_row_sparse.json}) replayed bit for bit.
 */
class RowSparseTest {
    static final Path GOLDEN = Path.of("tests", "golden", "mxnet_row_sparse.json");

    private static RowSparse rsp(long[] rows, float[] data, int... shape) {
        int[] dataShape = shape.clone();
        dataShape[0] = rows.length;
        return RowSparse.of(NDArray.array(data, dataShape), rows, shape);
    }

    private static float[] dense(KVStore kv, String key) {
        try (NDArray a = kv.pull(key)) {
            return a.toFloatArray();
        }
    }

    @Test
    void arraysConvertAndCheckTheirIndices() {
        try (RowSparse a = rsp(new long[] {0, 2}, new float[] {1, 2, 3, 4}, 4, 2);
                NDArray d = a.toDense();
                RowSparse back = RowSparse.fromDense(d);
                RowSparse z = RowSparse.zeros(new int[] {5, 3}, DType.FLOAT64)) {
            assertArrayEquals(new float[] {1, 2, 0, 0, 3, 4, 0, 0}, d.toFloatArray());
            assertArrayEquals(new long[] {0, 2}, back.indices());
            assertArrayEquals(new int[] {4, 2}, back.shape());
            assertArrayEquals(new int[] {0, 3}, z.data().shape());
            assertEquals(DType.FLOAT64, z.dtype());
            assertTrue(a.toString().contains("rows=[0, 2]"), a.toString());
        }
        try (NDArray data = NDArray.ones(2, 2)) {
            assertCode(Code.INVALID_ARGUMENT, () -> RowSparse.of(data, new long[] {1, 0}, 3, 2));
            assertCode(Code.INVALID_ARGUMENT, () -> RowSparse.of(data, new long[] {1, 1}, 3, 2));
            assertCode(Code.INVALID_ARGUMENT, () -> RowSparse.of(data, new long[] {0, 3}, 3, 2));
            assertCode(Code.INVALID_ARGUMENT, () -> RowSparse.of(data, new long[] {0}, 3, 2));
            assertCode(Code.INVALID_ARGUMENT, () -> RowSparse.of(data, new long[] {0, 1}, 3, 3));
            assertCode(Code.INVALID_ARGUMENT, () -> RowSparse.zeros(new int[0], DType.FLOAT32));
            assertThrows(NullPointerException.class, () -> RowSparse.of(null, new long[0], 1));
            assertThrows(NullPointerException.class, () -> RowSparse.of(data, null, 1));
        }
    }

    @Test
    void aClosedArrayPrintsAsClosed() {
        RowSparse a = rsp(new long[] {1}, new float[] {1, 2}, 3, 2);
        assertEquals("RowSparse[3, 2] " + DType.FLOAT32 + " rows=[1]", a.toString());
        a.close();
        assertEquals("<RowSparse closed>", a.toString());
        // Closed through its data array, as sparse/close and NDArray.close do.
        RowSparse b = rsp(new long[] {0}, new float[] {1, 2}, 3, 2);
        b.data().close();
        assertEquals("<RowSparse closed>", b.toString());
        assertEquals("<RowSparse closed>", String.valueOf(b));
        // Everything else of a closed array is still DISPOSED.
        assertCode(Code.DISPOSED, a::dtype);
        assertCode(Code.DISPOSED, a::toDense);
    }

    @Test
    void mxnetsExamplePushesSumRowWiseAndPullsOnlyTheRowsAsked() {
        try (KVStore kv = KVStore.create("local");
                NDArray ones = NDArray.ones(3, 2);
                RowSparse init = RowSparse.fromDense(ones)) {
            kv.initRowSparse("e", init);
            assertEquals("row_sparse", kv.stype("e"));
            try (RowSparse got = kv.rowSparsePull("e", new long[] {2, 0, 2})) {
                assertArrayEquals(new long[] {0, 2}, got.indices());
                assertArrayEquals(new int[] {3, 2}, got.shape());
                assertArrayEquals(new float[] {1, 1, 1, 1}, got.data().toFloatArray());
            }
            try (RowSparse a = rsp(new long[] {0}, new float[] {1, 1}, 3, 2);
                    RowSparse b = rsp(new long[] {0, 2}, new float[] {2, 2, 3, 3}, 3, 2)) {
                kv.pushRowSparse("e", a, b);
            }
            assertArrayEquals(new float[] {3, 3, 0, 0, 3, 3}, dense(kv, "e"));
            try (RowSparse none = kv.rowSparsePull("e", new long[0])) {
                assertEquals(0, none.indices().length);
            }
            // Several keys; a key given twice has its values summed.
            kv.initRowSparse(new String[] {"x", "y"},
                    new RowSparse[] {RowSparse.zeros(new int[] {4, 1}, DType.FLOAT32), RowSparse.zeros(new int[] {2, 2}, DType.FLOAT32)});
            kv.pushRowSparse(new String[] {"x", "y", "x"}, new RowSparse[] {
                rsp(new long[] {3}, new float[] {1}, 4, 1),
                rsp(new long[] {1}, new float[] {2, 2}, 2, 2),
                rsp(new long[] {0, 3}, new float[] {4, 5}, 4, 1)}, 0);
            assertArrayEquals(new float[] {4, 0, 0, 6}, dense(kv, "x"));
            assertArrayEquals(new float[] {0, 0, 2, 2}, dense(kv, "y"));
        }
    }

    @Test
    void lazySgdChangesOnlyThePushedRows() {
        try (KVStore kv = KVStore.create("local"); NDArray w = NDArray.ones(3, 2)) {
            kv.init("w", w);
            assertEquals("default", kv.stype("w"));
            kv.setOptimizer(Optimizer.sgd().learningRate(1).param("wd", 0.1).build());
            try (RowSparse g = rsp(new long[] {1}, new float[] {0.5f, 0.5f}, 3, 2)) {
                kv.pushRowSparse("w", g);
            }
            float r = 0.9f - 0.5f;
            assertArrayEquals(new float[] {1, 1, r, r, 1, 1}, dense(kv, "w"));
        }
    }

    @Test
    void badCallsAreClearErrorsAndChangeNothing() {
        try (KVStore kv = KVStore.create("local"); NDArray ones = NDArray.ones(3, 2); NDArray d = NDArray.ones(3)) {
            kv.initRowSparse("e", RowSparse.fromDense(ones));
            kv.init("d", d);
            float[] before = dense(kv, "e");
            RowSparse good = rsp(new long[] {0}, new float[] {9, 9}, 3, 2);
            RowSparse wide = rsp(new long[] {0}, new float[] {1, 1, 1}, 3, 3);
            assertCode(Code.SHAPE_MISMATCH, () -> kv.pushRowSparse(new String[] {"e", "e"}, new RowSparse[] {good, wide}, 0));
            assertCode(Code.KEY_NOT_INITIALIZED, () -> kv.pushRowSparse(new String[] {"e", "nope"}, new RowSparse[] {good, good}, 0));
            assertCode(Code.LENGTH_MISMATCH, () -> kv.pushRowSparse(new String[] {"e", "e"}, new RowSparse[] {good}, 0));
            assertArrayEquals(before, dense(kv, "e"), "a refused push changed nothing");
            assertCode(Code.INVALID_ARGUMENT, () -> kv.rowSparsePull("d", new long[] {0}));
            assertCode(Code.INVALID_ARGUMENT, () -> kv.rowSparsePull("e", new long[] {3}));
            assertCode(Code.KEY_NOT_INITIALIZED, () -> kv.rowSparsePull("nope", new long[] {0}));
            assertCode(Code.ALREADY_INITIALIZED, () -> kv.initRowSparse(new String[] {"f", "e"}, new RowSparse[] {good, good}));
            assertEquals(2, kv.keys().length, "a refused init added no key");
            assertThrows(NullPointerException.class, () -> kv.pushRowSparse("e", (RowSparse) null));
            good.close();
            assertCode(Code.DISPOSED, () -> kv.pushRowSparse("e", good));
            wide.close();
        }
    }

    @Test
    void mxnetsRecordedRowSparseResultsReplayBitForBit() throws IOException {
        Map<String, Object> golden = obj(JsonReader.parse(Files.readString(GOLDEN, StandardCharsets.UTF_8)));
        assertEquals("1.9.1", golden.get("mxnet_version"));
        List<Object> cases = list(golden.get("cases"));
        assertTrue(cases.size() >= 12);
        for (Object o : cases) {
            Map<String, Object> c = obj(o);
            String name = str(c, "name");
            int[] shape = GoldenTest.ints(c.get("shape"));
            try (KVStore kv = KVStore.create("local");
                    NDArray init = NDArray.array(floats(c.get("init")), shape)) {
                kv.initRowSparse("w", RowSparse.fromDense(init));
                if (c.get("optimizer") != null) {
                    List<Object> spec = list(c.get("optimizer"));
                    Optimizer.Named b = Optimizer.builder((String) spec.get(0));
                    for (Map.Entry<String, Object> p : obj(spec.get(1)).entrySet()) {
                        Object v = p.getValue();
                        b.param(p.getKey(), v instanceof Boolean f ? (f ? 1 : 0) : ((Number) v).doubleValue());
                    }
                    kv.setOptimizer(b.build());
                }
                int s = 0;
                for (Object so : list(c.get("steps"))) {
                    Map<String, Object> step = obj(so);
                    List<Object> vs = list(step.get("values"));
                    RowSparse[] values = new RowSparse[vs.size()];
                    for (int i = 0; i < values.length; i++) {
                        Map<String, Object> v = obj(vs.get(i));
                        values[i] = rsp(longs(v.get("rows")), floats(v.get("data")), shape);
                    }
                    kv.pushRowSparse("w", values);
                    String where = name + ", step " + s++;
                    assertArrayEquals(bits(floats(step.get("dense"))), bits(dense(kv, "w")), where + ": dense pull");
                    try (RowSparse got = kv.rowSparsePull("w", longs(step.get("row_ids")))) {
                        assertArrayEquals(longs(step.get("pulled_indices")), got.indices(), where);
                        assertArrayEquals(bits(floats(step.get("pulled_data"))), bits(got.data().toFloatArray()),
                                where + ": rowSparsePull");
                    }
                    for (RowSparse v : values) {
                        v.close();
                    }
                }
            }
        }
    }

    private static float[] floats(Object o) {
        List<Object> l = list(o);
        float[] out = new float[l.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = (float) ((Number) l.get(i)).doubleValue();
        }
        return out;
    }

    private static long[] longs(Object o) {
        return list(o).stream().mapToLong(x -> ((Number) x).longValue()).toArray();
    }

    private static int[] bits(float[] v) {
        int[] out = new int[v.length];
        for (int i = 0; i < v.length; i++) {
            out[i] = Float.floatToRawIntBits(v[i]);
        }
        return out;
    }
}
