package io.github.kvstore;

/** Natives that exist for tests only (see {@code kvstore-jni/NATIVES.md}). */
final class Native {
    static {
        NativeLibrary.load();
    }

    private Native() {}

    /** Rust's {@code ErrorKind::ALL} codes, in order; must equal {@link KVStoreException.Code}'s names. */
    static native String[] nErrorCodes();

    /** Panics in Rust: must surface as a {@link KVStoreException} with code INTERNAL. */
    static native void nDebugPanic();
}
