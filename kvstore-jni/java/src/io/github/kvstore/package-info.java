/**
 * The Java API of kvstore: Apache MXNet's KVStore, rebuilt in Rust, for the JVM.
 *
 * <p>A {@link io.github.kvstore.KVStore} holds one array per key. Training code
 * {@code init}s each parameter, {@code push}es gradients from every device (the store sums
 * them and merges the sum into the stored value through an {@link io.github.kvstore.Updater};
 * by default the sum replaces it), and {@code pull}s the result back into the arrays of every
 * device. {@link io.github.kvstore.NDArray} is the array type (native memory, a
 * {@link io.github.kvstore.DType} and a {@link io.github.kvstore.Context}); errors are
 * {@link io.github.kvstore.KVStoreException}s with a stable
 * {@link io.github.kvstore.KVStoreException.Code}.
 *
 * <p>MXNet's KVStore tutorial:
 * <pre>{@code
 * int[] shape = {2, 3};
 * try (KVStore kv = KVStore.create("local");
 *      NDArray ones = NDArray.ones(shape);
 *      NDArray a = NDArray.zeros(shape)) {
 *     try (NDArray two = ones.mul(2)) {
 *         kv.init("3", two).pull("3", a);              // a == 2
 *     }
 *     NDArray[] b = new NDArray[4];                     // one value per device
 *     for (int i = 0; i < 4; i++) {
 *         b[i] = NDArray.ones(shape, Context.cpu(i), DType.FLOAT32);
 *     }
 *     kv.push("3", b).pull("3", a);                     // a == 4: the values were summed
 *     kv.setUpdater((key, index, merged, stored) -> {   // stored += 2 * merged
 *         try (NDArray twice = merged.mul(2)) {
 *             stored.addInPlace(twice);
 *         }
 *     });
 *     kv.push("3", ones).pull("3", a);                  // a == 6
 *     for (NDArray x : b) {
 *         x.close();
 *     }
 * }
 * }</pre>
 *
 * <p>Every native-backed object is {@link java.lang.AutoCloseable}: close it (or use
 * try-with-resources) to free its native memory at once; a {@link java.lang.ref.Cleaner}
 * frees what becomes unreachable unclosed, and the native bytes of arrays count towards
 * garbage collections (see {@link io.github.kvstore.NDArray}, property
 * {@code kvstore.nativeMemoryThreshold}), so a loop that forgets {@code close} still runs in
 * bounded memory. Using a closed object is a
 * {@code KVStoreException} with code {@code DISPOSED}, never a crash: no argument, however
 * wrong, can crash the JVM. The native library is found by
 * {@link io.github.kvstore.NativeLibrary} ({@code -Dkvstore.native.path},
 * {@code java.library.path}, or the copy bundled in the jar).
 *
 * <p>Argument errors that Java can see by itself are reported the Java way, before any
 * native call: a null argument is a {@link java.lang.NullPointerException} whose message
 * names the parameter ({@code "keys"}, or {@code "keys[2]"} for an element of an array);
 * the only parameters that take {@code null} say so ({@code KVStore.setUpdater},
 * {@code Optimizer.Builder.lrScheduler}). Everything else is a
 * {@code KVStoreException}, whose {@code code()} says what went wrong:
 * <pre>{@code
 * try {
 *     kv.push("w", gradient);
 * } catch (KVStoreException e) {
 *     if (e.code() != KVStoreException.Code.KEY_NOT_INITIALIZED) {
 *         throw e;
 *     }
 *     kv.init("w", gradient);
 * }
 * }</pre>
 */
package io.github.kvstore;
