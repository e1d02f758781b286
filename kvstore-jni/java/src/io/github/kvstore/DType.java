package io.github.kvstore;

import java.util.Locale;

/**
 * The element type of an array (MXNet's {@code dtype}). The declaration order is the
 * native code ({@link #code()}), shared with Rust's {@code DType::ALL}: never reorder.
 *
 * <p>Sums of {@link #FLOAT16} and {@link #BFLOAT16} accumulate in float32 and round once;
 * integer sums wrap.
 */
public enum DType {
    /** 32-bit float, the default. */
    FLOAT32("float32", "f32", 4),
    /** 64-bit float. */
    FLOAT64("float64", "f64", 8),
    /** IEEE 754 half precision. */
    FLOAT16("float16", "f16", 2),
    /** bfloat16 (8-bit exponent, 7-bit mantissa). */
    BFLOAT16("bfloat16", "bf16", 2),
    /** 32-bit signed integer. */
    INT32("int32", "i32", 4),
    /** 64-bit signed integer. */
    INT64("int64", "i64", 8),
    /** 8-bit signed integer. */
    INT8("int8", "i8", 1),
    /** 8-bit unsigned integer. */
    UINT8("uint8", "u8", 1);

    private static final DType[] VALUES = values();

    private final String mxnetName;
    private final String shortName;
    private final int bytes;

    DType(String mxnetName, String shortName, int bytes) {
        this.mxnetName = mxnetName;
        this.shortName = shortName;
        this.bytes = bytes;
    }

    /** The size of one element in bytes. */
    int elementBytes() {
        return bytes;
    }

    /**
     * MXNet's (numpy's) name: {@code "float32"}, {@code "bfloat16"}, {@code "uint8"}...
     *
     * @return the name
     */
    public String mxnetName() {
        return mxnetName;
    }

    /**
     * The code of this dtype across JNI (0 for float32 ... 7 for uint8).
     *
     * @return the code
     */
    public int code() {
        return ordinal();
    }

    /**
     * Parses a dtype name, case-insensitively: MXNet's names ({@code "float32"}), the short
     * forms ({@code "f32"}, {@code "bf16"}, {@code "u8"}), and the aliases Rust accepts
     * ({@code "float"}, {@code "double"}, {@code "half"}, {@code "int"}, {@code "long"}).
     *
     * @param name the name
     * @return the dtype
     * @throws IllegalArgumentException for an unknown name
     * @throws NullPointerException if {@code name} is null
     */
    public static DType fromName(String name) {
        java.util.Objects.requireNonNull(name, "name");
        String lower = name.toLowerCase(Locale.ROOT);
        for (DType d : VALUES) {
            if (d.mxnetName.equals(lower) || d.shortName.equals(lower)) {
                return d;
            }
        }
        switch (lower) {
            case "float":
                return FLOAT32;
            case "double":
                return FLOAT64;
            case "half":
                return FLOAT16;
            case "int":
                return INT32;
            case "long":
                return INT64;
            default:
                throw new IllegalArgumentException("unknown dtype \"" + name
                        + "\": expected one of float32, float64, float16, bfloat16, int32, int64, int8, uint8");
        }
    }

    /** The dtype of a native code. */
    static DType fromCode(long code) {
        if (code < 0 || code >= VALUES.length) {
            throw new KVStoreException(KVStoreException.Code.INTERNAL, "native reported dtype code " + code);
        }
        return VALUES[(int) code];
    }
}
