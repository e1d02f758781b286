package io.github.kvstore;

import java.lang.ref.Cleaner;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.LongConsumer;

/**
 * A Java object that owns a native handle: what {@link KVStore} and {@link NDArray} share
 * (as opendal's {@code NativeObject} in {@code bindings/java}). It holds the handle, frees
 * it exactly once, by {@link #close()} or, for an object that became unreachable unclosed,
 * by its class's {@link Cleaner}, and says whether that happened ({@link #isClosed()}).
 *
 * <p>The fenced call. {@link #handle()} is the handle for a native call, or
 * {@code DISPOSED} once closed. Once the handle is read, the method may not use the object
 * again, so the collector could find it unreachable and the Cleaner free the handle while
 * the native call still runs on it; every native call therefore keeps the object
 * reachable until the call returns:
 *
 * <pre>{@code
 * try {
 *     return nType(handle());
 * } finally {
 *     Reference.reachabilityFence(this);
 * }
 * }</pre>
 *
 * <p>This is written out at each call rather than taken as a lambda: a lambda's first call
 * links a class, which an {@link Updater} running on a thread short of stack (LowStackTest)
 * cannot afford, and a capturing one allocates on every push and pull.
 *
 * <p>Package-private: the public API is the subclasses' {@code close()} and
 * {@code isClosed()}. Those two are not final on purpose: javac then puts public bridge
 * methods for them into each subclass, so that reflection (Clojure's interop among it)
 * finds them on a public class, not on this non-public one.
 */
abstract class NativeObject implements AutoCloseable {
    /**
     * One per subclass, in a static field: its name (in the {@code DISPOSED} message), its
     * native free, its own Cleaner and how many of its handles were freed so far.
     */
    static final class Kind {
        private final String name;
        private final LongConsumer free;
        private final Cleaner cleaner = Cleaner.create();
        private final AtomicLong freed = new AtomicLong();

        /**
         * @param name the class's name, as the {@code DISPOSED} message says it
         * @param free the class's native free ({@code nFree})
         */
        Kind(String name, LongConsumer free) {
            this.name = name;
            this.free = free;
        }

        /** Native handles of this kind freed so far, by close() or by the Cleaner. */
        long freedCount() {
            return freed.get();
        }
    }

    /**
     * The native handle, freed exactly once. Static and holding no reference to the object,
     * so the Cleaner can run it after the object itself became unreachable.
     */
    private static final class Handle implements Runnable {
        private final AtomicLong value;
        private final Kind kind;
        /** The native bytes counted in {@link NativeMemory} for this object (0: not counted). */
        private final long bytes;

        Handle(long value, Kind kind, long bytes) {
            this.value = new AtomicLong(value);
            this.kind = kind;
            this.bytes = bytes;
        }

        @Override
        public void run() {
            long h = value.getAndSet(0);
            if (h != 0) {
                kind.freed.incrementAndGet();
                if (bytes > 0) {
                    NativeMemory.freed(bytes);
                }
                try {
                    kind.free.accept(h);
                } catch (KVStoreException e) {
                    // Already freed natively (an updater's array after its call): nothing
                    // is left to free, and close() never throws.
                }
            }
        }
    }

    private final Kind kind;
    private final Handle handle;
    /** Null for a borrowed handle, which the native side frees (see {@link #release()}). */
    private final Cleaner.Cleanable cleanable;

    /**
     * Wraps {@code handle}. An owned handle is freed by {@link #close()} or the Cleaner, and
     * {@code bytes} native bytes count in {@link NativeMemory} until then (which may make
     * this constructor wait for a garbage collection first). A borrowed one (an updater's
     * array) is freed by the native side: not counted, not registered with the Cleaner;
     * {@link #release()} marks it closed.
     *
     * @param kind the subclass's kind
     * @param handle the native handle, not 0
     * @param bytes the native bytes to count (ignored unless owned), 0 for none
     * @param owned whether this object frees the handle
     */
    NativeObject(Kind kind, long handle, long bytes, boolean owned) {
        this.kind = kind;
        if (owned) {
            this.handle = new Handle(handle, kind, bytes);
            this.cleanable = kind.cleaner.register(this, this.handle);
            NativeMemory.allocated(bytes);
        } else {
            this.handle = new Handle(handle, kind, 0);
            this.cleanable = null;
        }
    }

    /**
     * The handle for a native call; {@code DISPOSED} once closed. The caller must keep this
     * object reachable until the native call returns (see the class docs).
     */
    final long handle() {
        long h = handle.value.get();
        if (h == 0) {
            throw new KVStoreException(KVStoreException.Code.DISPOSED, kind.name + " was used after it was closed");
        }
        return h;
    }

    /** The handle, or 0 once closed; never throws (for {@code toString}). */
    final long handleOrZero() {
        return handle.value.get();
    }

    /** Marks the object closed without freeing its handle: the native side frees it. */
    final void release() {
        handle.value.set(0);
    }

    /**
     * Frees the native object (a store's values with it). Idempotent; never throws. Calls
     * already running on it finish; the calls that follow throw {@link KVStoreException}
     * with code {@link KVStoreException.Code#DISPOSED}.
     */
    @Override
    public void close() {
        if (cleanable != null) {
            cleanable.clean();
        } else {
            release();
        }
    }

    /**
     * Whether {@link #close()} was called (or the object was freed otherwise).
     *
     * @return true once closed
     */
    public boolean isClosed() {
        return handle.value.get() == 0;
    }
}
