package io.github.kvstore;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.Arrays;
import org.junit.jupiter.api.function.Executable;

/** Helpers shared by the test classes. */
final class Fixtures {
    private Fixtures() {}

    /** {@code n} copies of {@code v}. */
    static float[] filled(int n, float v) {
        float[] a = new float[n];
        Arrays.fill(a, v);
        return a;
    }

    /** Asserts every element of {@code a} is {@code v}. */
    static void assertAll(float v, NDArray a) {
        assertArrayEquals(filled((int) a.size(), v), a.toFloatArray(), () -> "values of " + a);
    }

    /** Runs {@code call}, asserts it throws a KVStoreException with {@code code}, returns it. */
    static KVStoreException assertCode(KVStoreException.Code code, Executable call) {
        KVStoreException e = assertThrows(KVStoreException.class, call);
        assertEquals(code, e.code(), () -> "code of \"" + e.getMessage() + "\"");
        return e;
    }

    /** Asserts {@code call} throws a NullPointerException whose message is {@code name}. */
    static void assertNpe(String name, Executable call) {
        NullPointerException e = assertThrows(NullPointerException.class, call);
        assertEquals(name, e.getMessage());
    }

    /** Closes every array, ignoring nulls. */
    static void closeAll(NDArray... arrays) {
        for (NDArray a : arrays) {
            if (a != null) {
                a.close();
            }
        }
    }
}
