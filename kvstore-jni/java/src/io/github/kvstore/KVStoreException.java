package io.github.kvstore;

import java.util.Objects;

/**
 * An error of a store or array operation, thrown by the native library with a stable
 * {@link Code} (Rust's {@code ErrorKind}). Match on {@link #code()}, never on the message:
 * messages are for people and may change.
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

    /**
     * The constructor the native library calls. An unknown code string (a native library
     * newer than these classes) becomes {@link Code#INTERNAL}, and the message keeps it.
     *
     * @param code the name of a {@link Code}
     * @param message the message
     */
    public KVStoreException(String code, String message) {
        super(messageFor(code, message));
        this.code = parse(code);
    }

    /**
     * As {@link #KVStoreException(String, String)}, with a cause.
     *
     * @param code the name of a {@link Code}
     * @param message the message
     * @param cause the cause
     */
    public KVStoreException(String code, String message, Throwable cause) {
        super(messageFor(code, message), cause);
        this.code = parse(code);
    }

    /**
     * An exception with the given code.
     *
     * @param code the code
     * @param message the message
     */
    public KVStoreException(Code code, String message) {
        super(message);
        this.code = Objects.requireNonNull(code, "code");
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
    }

    /**
     * The stable category of this error.
     *
     * @return the code
     */
    public Code code() {
        return code;
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
