package io.github.kvstore;

import java.util.Objects;
import java.util.OptionalLong;

/**
 * An error of a store or array operation, thrown by the native library with a stable
 * {@link Code} (Rust's {@code ErrorKind}). Match on {@link #code()}, never on the message:
 * messages are for people and may change.
 *
 * <p>Besides its code, an exception thrown by the native library carries the error's data:
 * the {@link #key()} concerned ({@link Code#KEY_NOT_INITIALIZED},
 * {@link Code#ALREADY_INITIALIZED}, and a shape or dtype mismatch of a store operation),
 * the shapes ({@link #expectedShape()}, {@link #gotShape()}) of a
 * {@link Code#SHAPE_MISMATCH}, the dtypes ({@link #expectedDType()}, {@link #gotDType()})
 * of a {@link Code#DTYPE_MISMATCH}, and the lengths ({@link #expectedLength()},
 * {@link #gotLength()}) of a {@link Code#LENGTH_MISMATCH}. What does not apply is
 * {@code null} (or an empty {@link OptionalLong}); an exception built in Java carries none.
 *
 * <p>Misuse that Java can see by itself is reported the Java way instead: a {@code null}
 * argument is a {@link NullPointerException} naming the parameter, a negative device id an
 * {@link IllegalArgumentException}.
 */
public final class KVStoreException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /**
     * The category of an error. The names and their order are the contract with the
     * native library ({@code ErrorKind::ALL} in Rust) and with the Clojure binding
     * ({@code :kvstore/error :shape-mismatch}): never rename or reorder.
     */
    public enum Code {
        /** A push or pull of a key that was never passed to init (or broadcast). */
        KEY_NOT_INITIALIZED,
        /** Init or broadcast of a key the store holds, or twice in one call. */
        ALREADY_INITIALIZED,
        /** An array has another shape than the one it must match. */
        SHAPE_MISMATCH,
        /** An array has another dtype than the one it must match. */
        DTYPE_MISMATCH,
        /** Parallel lists (keys and values, keys and outs) of different lengths. */
        LENGTH_MISMATCH,
        /** {@link KVStore#create(String)} with a kind no build knows. */
        UNKNOWN_STORE_KIND,
        /** A device context that no backend of this build or machine serves. */
        DEVICE_UNAVAILABLE,
        /** A feature this build or this store kind does not provide. */
        UNSUPPORTED,
        /** An argument invalid on its own: a negative dimension, a size that overflows, ... */
        INVALID_ARGUMENT,
        /** A store or array used after {@code close()}. */
        DISPOSED,
        /** A file could not be read or written. */
        IO,
        /** A backend failed, or a custom {@link Updater} threw (then it is the cause). */
        BACKEND,
        /**
         * The machine refused a resource: memory (an array, or a Java array the result of a
         * call needs, too large for what is free) or threads. Nothing was changed; the call
         * may succeed once resources are freed.
         */
        RESOURCE_EXHAUSTED,
        /** A bug in the library (a Rust panic lands here); please report it. */
        INTERNAL
    }

    /** The stable category; serialised with the exception. */
    private final Code code;

    /** The key concerned, or null. */
    private final String key;

    /** The shape required by a shape mismatch, or null. */
    private final long[] expectedShape;

    /** The shape given to a shape mismatch, or null. */
    private final long[] gotShape;

    /** The {@link DType#code()} required by a dtype mismatch, or -1. */
    private final int expectedDType;

    /** The {@link DType#code()} given to a dtype mismatch, or -1. */
    private final int gotDType;

    /** The length required by a length mismatch, or -1. */
    private final long expectedLength;

    /** The length given to a length mismatch, or -1. */
    private final long gotLength;

    /**
     * The constructor the native library calls. An unknown code string (a native library
     * newer than these classes) becomes {@link Code#INTERNAL}, and the message keeps it.
     *
     * @param code the name of a {@link Code}
     * @param message the message
     */
    public KVStoreException(String code, String message) {
        this(code, message, null);
    }

    /**
     * As {@link #KVStoreException(String, String)}, with a cause.
     *
     * @param code the name of a {@link Code}
     * @param message the message
     * @param cause the cause
     */
    public KVStoreException(String code, String message, Throwable cause) {
        this(code, message, cause, null, null, null, -1, -1, -1, -1);
    }

    /**
     * The constructor the native library calls, with the error's data. It does no more
     * than store its arguments (the thread may be short of stack): the arrays are the
     * native library's own, and dtypes are resolved by the accessors.
     *
     * @param code the name of a {@link Code}
     * @param message the message
     * @param cause the cause, or null
     * @param key the key, or null
     * @param expectedShape the shape required, or null
     * @param gotShape the shape given, or null
     * @param expectedDType the code of the dtype required, or -1
     * @param gotDType the code of the dtype given, or -1
     * @param expectedLength the length required, or -1
     * @param gotLength the length given, or -1
     */
    KVStoreException(String code, String message, Throwable cause, String key, long[] expectedShape,
            long[] gotShape, int expectedDType, int gotDType, long expectedLength, long gotLength) {
        super(messageFor(code, message), cause);
        this.code = parse(code);
        this.key = key;
        this.expectedShape = expectedShape;
        this.gotShape = gotShape;
        this.expectedDType = expectedDType;
        this.gotDType = gotDType;
        this.expectedLength = expectedLength;
        this.gotLength = gotLength;
    }

    /**
     * An exception with the given code.
     *
     * @param code the code
     * @param message the message
     */
    public KVStoreException(Code code, String message) {
        this(code, message, null);
    }

    /**
     * An exception with the given code and cause.
     *
     * @param code the code
     * @param message the message
     * @param cause the cause
     */
    public KVStoreException(Code code, String message, Throwable cause) {
        super(message, cause);
        this.code = Objects.requireNonNull(code, "code");
        this.key = null;
        this.expectedShape = null;
        this.gotShape = null;
        this.expectedDType = -1;
        this.gotDType = -1;
        this.expectedLength = -1;
        this.gotLength = -1;
    }

    /**
     * The stable category of this error.
     *
     * @return the code
     */
    public Code code() {
        return code;
    }

    /**
     * The key this error concerns: that of {@link Code#KEY_NOT_INITIALIZED} and
     * {@link Code#ALREADY_INITIALIZED}, and of a {@link Code#SHAPE_MISMATCH} or
     * {@link Code#DTYPE_MISMATCH} of a store operation (a push, pull, broadcast, an
     * optimizer's states); {@code null} for other errors and for array operations.
     *
     * @return the key, or null
     */
    public String key() {
        return key;
    }

    /**
     * The shape that was required, for a {@link Code#SHAPE_MISMATCH}; for an array built
     * from data, the shape asked for.
     *
     * @return a copy of the shape, or null for other errors
     */
    public long[] expectedShape() {
        return expectedShape == null ? null : expectedShape.clone();
    }

    /**
     * The shape that was given, for a {@link Code#SHAPE_MISMATCH}; for an array built from
     * data, the one-element shape of the data's length.
     *
     * @return a copy of the shape, or null for other errors
     */
    public long[] gotShape() {
        return gotShape == null ? null : gotShape.clone();
    }

    /**
     * The dtype that was required, for a {@link Code#DTYPE_MISMATCH}.
     *
     * @return the dtype, or null for other errors
     */
    public DType expectedDType() {
        return dtype(expectedDType);
    }

    /**
     * The dtype that was given, for a {@link Code#DTYPE_MISMATCH}.
     *
     * @return the dtype, or null for other errors
     */
    public DType gotDType() {
        return dtype(gotDType);
    }

    /**
     * The length that was required (the number of keys), for a
     * {@link Code#LENGTH_MISMATCH}.
     *
     * @return the length, or empty for other errors
     */
    public OptionalLong expectedLength() {
        return expectedLength < 0 ? OptionalLong.empty() : OptionalLong.of(expectedLength);
    }

    /**
     * The length that was given (the number of values or outs), for a
     * {@link Code#LENGTH_MISMATCH}.
     *
     * @return the length, or empty for other errors
     */
    public OptionalLong gotLength() {
        return gotLength < 0 ? OptionalLong.empty() : OptionalLong.of(gotLength);
    }

    private static DType dtype(int code) {
        DType[] all = DType.values();
        return code >= 0 && code < all.length ? all[code] : null;
    }

    private static Code parse(String code) {
        if (code != null) {
            for (Code c : Code.values()) {
                if (c.name().equals(code)) {
                    return c;
                }
            }
        }
        return Code.INTERNAL;
    }

    private static String messageFor(String code, String message) {
        return parse(code) == Code.INTERNAL && !Code.INTERNAL.name().equals(code)
                ? "(unknown error code " + code + ") " + message
                : message;
    }
}
