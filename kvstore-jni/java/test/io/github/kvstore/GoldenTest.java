package io.github.kvstore;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.github.kvstore.KVStoreException.Code;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/**
 * The golden cases recorded from MXNet 1.9.1 by {@code tests/golden/generate.py} into
 * {@code tests/golden/mxnet_local.json} (format: {@code tests/golden/README.md}), replayed
 * through the public Java API, one dynamic test per case: every pulled value, every error
 * code and every updater call (key and input) must match. The Rust suite
 * ({@code tests/tests/golden.rs}, the reference for these semantics) and the Python suite
 * ({@code kvstore-py/tests/test_golden.py}) replay the same file.
 *
 * <p>Each op is replayed in the Java form that matches the Python call MXNet recorded
 * ({@code form}): {@code single} as {@code (String, NDArray)}, {@code one_key_many_values}
 * as {@code (String, NDArray[])}, {@code list} and {@code nested} as the list form
 * {@code (String[], NDArray[])} with the flattened keys (a repeated key gets the sum of
 * its arrays, as MXNet's nested form). One kind of op has no Java form: a list
 * {@code pushpull} or {@code broadcast} whose outs go with other keys than its values
 * ({@code out_keys} differs from {@code keys}, as in {@code pushpull([1, 2], [[a, b], [c]],
 * out=[[x], [y, z]])}), since the Java list forms pair {@code outs[i]} with
 * {@code keys[i]}. Such an op is replayed as one call per key, each in the one-key form
 * ({@code pushpull(key, values, outs)}, {@code broadcast(key, value, outs)}), which is what
 * MXNet's nested call does key by key; only ops that succeed and cases without an updater
 * may take this path (one call's all-or-nothing failure, and one push's update order
 * across keys, cannot be split), and the replay fails if any other does.
 */
class GoldenTest {
    /** Relative to the repository root, where scripts/test-java.sh runs the suite. */
    static final Path GOLDEN = Path.of("tests", "golden", "mxnet_local.json");

    /**
     * Cases where the store deliberately differs from MXNet, with the reason (as in
     * golden.rs): their updater calls are checked against the store's own rule instead.
     */
    static final Map<String, String> UPDATE_ORDER_DIFFERS = Map.of(
            "updater_call_order_int_keys_sorted",
            "keys are strings here, so updates run in first-init order; MXNet sorted int keys numerically");

    /** One updater call: the key and the merged value it received. */
    record Call(String key, List<Integer> shape, DType dtype, List<Double> data) {}

    @SuppressWarnings("unchecked")
    static Map<String, Object> obj(Object o) {
        return (Map<String, Object>) o;
    }

    @SuppressWarnings("unchecked")
    static List<Object> list(Object o) {
        return (List<Object>) o;
    }

    static String str(Map<String, Object> m, String field) {
        Object v = m.get(field);
        assertTrue(v instanceof String, () -> "'" + field + "' is not a string: " + v);
        return (String) v;
    }

    static Map<String, Object> golden() {
        if (!Files.isRegularFile(GOLDEN)) {
            fail(GOLDEN + " not found (looked in " + Path.of("").toAbsolutePath()
                    + "): the suite must run from the repository root, as scripts/test-java.sh does");
        }
        try {
            return obj(JsonReader.parse(Files.readString(GOLDEN, StandardCharsets.UTF_8)));
        } catch (IOException e) {
            throw new AssertionError("cannot read " + GOLDEN, e);
        }
    }

    static List<Map<String, Object>> cases(Map<String, Object> golden) {
        List<Map<String, Object>> cases = new ArrayList<>();
        for (Object c : list(golden.get("cases"))) {
            cases.add(obj(c));
        }
        return cases;
    }

    @TestFactory
    Stream<DynamicTest> everyGoldenCaseRecordedFromMxnetReplaysExactly() {
        Map<String, Object> golden = golden();
        assertEquals("1.9.1", golden.get("mxnet_version"));
        List<Map<String, Object>> cases = cases(golden);
        assertTrue(cases.size() >= 40, "only " + cases.size() + " golden cases");
        return cases.stream().map(c -> DynamicTest.dynamicTest(str(c, "name"), () -> replay(c)));
    }

    @Test
    void theKnownDifferencesNameRecordedCases() {
        List<String> names = cases(golden()).stream().map(c -> str(c, "name")).toList();
        UPDATE_ORDER_DIFFERS.forEach((name, why) ->
                assertTrue(names.contains(name), name + " (" + why + ") is not in the golden file"));
    }

    @Test
    void errorNamesConvertToTheJavaCodes() {
        assertEquals(Code.KEY_NOT_INITIALIZED, code("KeyNotInitialized"));
        assertEquals(Code.DTYPE_MISMATCH, code("DTypeMismatch"));
        assertEquals(Code.IO, code("Io"));
        assertEquals(Code.RESOURCE_EXHAUSTED, code("ResourceExhausted"));
    }

    /** Rust's {@code ErrorKind} name (CamelCase) as the Java code (UPPER_SNAKE). */
    static Code code(String kind) {
        String snake = kind.replaceAll("([a-z0-9])([A-Z])", "$1_$2").toUpperCase(java.util.Locale.ROOT);
        try {
            return Code.valueOf(snake);
        } catch (IllegalArgumentException e) {
            throw new AssertionError("the golden error '" + kind + "' has no KVStoreException.Code (" + snake + ")");
        }
    }

    static int[] ints(Object o) {
        return list(o).stream().mapToInt(x -> ((Number) x).intValue()).toArray();
    }

    static double[] doubles(Object o) {
        return list(o).stream().mapToDouble(x -> ((Number) x).doubleValue()).toArray();
    }

    /** An ARRAY (with its data) or an ARRAY_SPEC (zeros), owned by {@code owned}. */
    static NDArray array(Object spec, boolean withData, List<NDArray> owned) {
        Map<String, Object> s = obj(spec);
        int[] shape = ints(s.get("shape"));
        DType dtype = DType.fromName(str(s, "dtype"));
        Context ctx = Context.cpu(((Number) s.get("ctx")).intValue());
        NDArray a = withData ? NDArray.array(doubles(s.get("data")), shape, ctx, dtype) : NDArray.zeros(shape, ctx, dtype);
        owned.add(a);
        return a;
    }

    static NDArray[] arrays(Object specs, boolean withData, List<NDArray> owned) {
        return list(specs).stream().map(s -> array(s, withData, owned)).toArray(NDArray[]::new);
    }

    static String[] keys(Object o) {
        return list(o).stream().map(k -> (String) k).toArray(String[]::new);
    }

    /** The one key of a {@code single} or {@code one_key_many_values} op. */
    static String oneKey(String where, String[] keys) {
        if (keys.length == 0 || Arrays.stream(keys).anyMatch(k -> !k.equals(keys[0]))) {
            fail(where + ": a one-key form with keys " + Arrays.toString(keys));
        }
        return keys[0];
    }

    static NDArray single(String where, NDArray[] arrays) {
        assertEquals(1, arrays.length, where + ": a single form with " + arrays.length + " arrays");
        return arrays[0];
    }

    static void replay(Map<String, Object> c) {
        String name = str(c, "name");
        List<NDArray> owned = new ArrayList<>();
        List<Call> calls = Collections.synchronizedList(new ArrayList<>());
        try (KVStore kv = KVStore.create(str(c, "store"))) {
            Object updater = c.get("updater");
            if (updater != null) {
                assertEquals("add_twice", updater, name + ": unknown updater");
                kv.setUpdater((key, index, merged, stored) -> {
                    calls.add(new Call(key, Arrays.stream(merged.shape()).boxed().toList(), merged.dtype(),
                            Arrays.stream(merged.toDoubleArray()).boxed().toList()));
                    try (NDArray twice = merged.mul(2)) {
                        stored.addInPlace(twice);
                    }
                });
            }
            List<Object> ops = list(c.get("ops"));
            for (int i = 0; i < ops.size(); i++) {
                Map<String, Object> op = obj(ops.get(i));
                String where = name + " op " + i + " (" + op.get("op") + ", " + op.get("form") + ")";
                NDArray[] got;
                try {
                    got = run(kv, op, where, updater != null, owned);
                } catch (KVStoreException e) {
                    Object want = op.get("error");
                    if (want == null) {
                        throw new AssertionError(where + ": unexpected error " + e.code() + ": " + e.getMessage(), e);
                    }
                    assertEquals(code((String) want), e.code(), where + ": " + e.getMessage());
                    continue;
                }
                if (op.containsKey("error")) {
                    fail(where + ": MXNet raised " + op.get("error") + ", the store did not");
                }
                if (op.containsKey("expect")) {
                    List<Object> expect = list(op.get("expect"));
                    assertEquals(expect.size(), got.length, where + ": number of results");
                    for (int j = 0; j < got.length; j++) {
                        Map<String, Object> e = obj(expect.get(j));
                        String at = where + " result " + j;
                        assertArrayEquals(ints(e.get("shape")), got[j].shape(), at + ": shape");
                        assertEquals(DType.fromName(str(e, "dtype")), got[j].dtype(), at + ": dtype");
                        assertArrayEquals(doubles(e.get("data")), got[j].toDoubleArray(), at + ": values");
                    }
                }
            }
            checkCalls(kv, name, c, calls);
        } finally {
            owned.forEach(NDArray::close);
        }
    }

    static void checkCalls(KVStore kv, String name, Map<String, Object> c, List<Call> calls) {
        List<Call> expected = new ArrayList<>();
        for (Object o : list(c.get("updater_calls"))) {
            Map<String, Object> call = obj(o);
            Map<String, Object> input = obj(call.get("input"));
            expected.add(new Call(str(call, "key"), Arrays.stream(ints(input.get("shape"))).boxed().toList(),
                    DType.fromName(str(input, "dtype")), Arrays.stream(doubles(input.get("data"))).boxed().toList()));
        }
        List<Call> got = new ArrayList<>(calls);
        if (UPDATE_ORDER_DIFFERS.containsKey(name)) {
            List<String> order = got.stream().map(Call::key).toList();
            List<String> initOrder = Arrays.stream(kv.keys()).filter(order::contains).toList();
            assertEquals(initOrder, order, name + ": updates must run in first-init order");
            expected.sort(Comparator.comparing(Call::key));
            got.sort(Comparator.comparing(Call::key));
            assertEquals(expected, got, name + ": updater calls (as a set)");
        } else {
            assertEquals(expected, got, name + ": updater calls");
        }
    }

    /** Runs one op in its Java form; returns the arrays that {@code expect} describes. */
    static NDArray[] run(KVStore kv, Map<String, Object> op, String where, boolean hasUpdater, List<NDArray> owned) {
        String kind = str(op, "op");
        String[] keys = keys(op.get("keys"));
        // MXNet's one-key forms with no arrays flatten to no keys: the list form says the same.
        String form = keys.length == 0 ? "list" : str(op, "form");
        boolean listForm = form.equals("list") || form.equals("nested");
        if (!listForm && !form.equals("single") && !form.equals("one_key_many_values")) {
            fail(where + ": unknown form " + form);
        }
        if (kind.equals("pull")) {
            NDArray[] outs = arrays(op.get("outs"), false, owned);
            if (listForm) {
                kv.pull(keys, outs);
            } else if (form.equals("single")) {
                kv.pull(oneKey(where, keys), single(where, outs));
            } else {
                kv.pull(oneKey(where, keys), outs);
            }
            return outs;
        }
        NDArray[] values = arrays(op.get("values"), true, owned);
        switch (kind) {
            case "init" -> {
                if (listForm) {
                    kv.init(keys, values);
                } else if (form.equals("single")) {
                    kv.init(oneKey(where, keys), single(where, values));
                } else {
                    fail(where + ": init has no one-key-many-values form");
                }
                return new NDArray[0];
            }
            case "push" -> {
                if (listForm) {
                    kv.push(keys, values);
                } else if (form.equals("single")) {
                    kv.push(oneKey(where, keys), single(where, values));
                } else {
                    kv.push(oneKey(where, keys), values);
                }
                return new NDArray[0];
            }
            case "pushpull", "broadcast" -> {
                if (op.get("outs") == null) {
                    assertEquals("pushpull", kind, where + ": only pushpull writes back into its values");
                    if (listForm) {
                        kv.pushpull(keys, values);
                    } else if (form.equals("single")) {
                        kv.pushpull(oneKey(where, keys), single(where, values));
                    } else {
                        kv.pushpull(oneKey(where, keys), values);
                    }
                    return values;
                }
                NDArray[] outs = arrays(op.get("outs"), false, owned);
                String[] outKeys = keys(op.get("out_keys"));
                boolean pushpull = kind.equals("pushpull");
                if (listForm && Arrays.equals(keys, outKeys)) {
                    if (pushpull) {
                        kv.pushpull(keys, values, outs);
                    } else {
                        kv.broadcast(keys, values, outs);
                    }
                } else if (listForm) {
                    byKey(kv, op, where, hasUpdater, keys, values, outKeys, outs);
                } else {
                    String key = oneKey(where, keys);
                    assertEquals(key, oneKey(where + " out_keys", outKeys), where + ": out_keys");
                    if (pushpull && form.equals("single") && values.length == 1 && outs.length == 1) {
                        kv.pushpull(key, values[0], outs[0]);
                    } else if (pushpull) {
                        kv.pushpull(key, values, outs);
                    } else if (outs.length == 1) {
                        kv.broadcast(key, single(where, values), outs[0]);
                    } else {
                        kv.broadcast(key, single(where, values), outs);
                    }
                }
                return outs;
            }
            default -> throw new AssertionError(where + ": unknown op " + kind);
        }
    }

    /**
     * A list pushpull or broadcast whose outs go with other keys than its values, which no
     * Java form expresses (see the class doc): one call per key in the one-key form, for
     * keys whose values and whose outs each come in one run, in the same key order.
     */
    static void byKey(KVStore kv, Map<String, Object> op, String where, boolean hasUpdater, String[] keys,
            NDArray[] values, String[] outKeys, NDArray[] outs) {
        if (op.containsKey("error") || hasUpdater) {
            fail(where + ": out_keys " + Arrays.toString(outKeys) + " differ from keys " + Arrays.toString(keys)
                    + " in an op that fails or runs an updater; one call per key cannot replay it");
        }
        Map<String, List<NDArray>> byValue = runs(where, keys, values);
        Map<String, List<NDArray>> byOut = runs(where, outKeys, outs);
        assertEquals(new ArrayList<>(byValue.keySet()), new ArrayList<>(byOut.keySet()),
                where + ": the keys of the values and of the outs");
        for (Map.Entry<String, List<NDArray>> e : byValue.entrySet()) {
            NDArray[] vs = e.getValue().toArray(NDArray[]::new);
            NDArray[] os = byOut.get(e.getKey()).toArray(NDArray[]::new);
            if (str(op, "op").equals("pushpull")) {
                kv.pushpull(e.getKey(), vs, os);
            } else {
                kv.broadcast(e.getKey(), single(where + " key " + e.getKey(), vs), os);
            }
        }
    }

    /** The arrays of each key, in key order, for keys that each come in one run. */
    static Map<String, List<NDArray>> runs(String where, String[] keys, NDArray[] arrays) {
        assertEquals(keys.length, arrays.length, where + ": keys and arrays");
        Map<String, List<NDArray>> runs = new LinkedHashMap<>();
        for (int i = 0; i < keys.length; i++) {
            if (runs.containsKey(keys[i]) && !(i > 0 && keys[i - 1].equals(keys[i]))) {
                fail(where + ": key " + keys[i] + " comes in two runs of " + Arrays.toString(keys));
            }
            runs.computeIfAbsent(keys[i], k -> new ArrayList<>()).add(arrays[i]);
        }
        return runs;
    }
}
