package io.github.kvstore;

import java.lang.ref.Cleaner;
import java.lang.ref.Reference;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Objects;

/**
 * An n-dimensional array in native memory: a shape, a {@link DType}, a {@link Context} and a
 * buffer, as MXNet's {@code NDArray}. {@link KVStore#pull(String, NDArray)} writes into the
 * caller's arrays in place.
 *
 * <p>Only what users of a store need is here: constructors, copies out to Java arrays,
 * element-wise {@code + - * /} with a scalar or an array of the same shape and dtype,
 * {@link #copyTo(Context)} and {@link #asType(DType)}. It is not a tensor library.
 *
 * <p>An array holds native memory until {@link #close()} (try-with-resources); a
 * {@link Cleaner} frees arrays that become unreachable unclosed once the garbage collector
 * finds them. So that a program that forgets {@code close()} still runs in bounded memory,
 * the native bytes of the arrays not yet freed are counted: when they pass a threshold,
 * making an array first asks for a garbage collection ({@link System#gc()}) and waits
 * briefly for the Cleaner to free the unreachable ones (as the JDK does for direct
 * buffers). The threshold is the system property {@code kvstore.nativeMemoryThreshold}
 * (bytes, or with a {@code k}, {@code m} or {@code g} suffix: {@code -Dkvstore.nativeMemoryThreshold=512m};
 * {@code 0} turns this off), by default a quarter of the maximum heap
 * ({@code -Xmx}) and at least 64 MiB; after each collection it rises to twice what is still
 * live, so a program that really holds many arrays is not slowed by collections on every
 * allocation. It never makes a call fail. Closing arrays explicitly remains the cheapest.
 * An array over a direct buffer ({@link #wrap(ByteBuffer, int[], DType)}) uses the buffer's
 * memory and counts nothing.
 *
 * <p>After {@code close()} every method but {@link #close()}, {@link #isClosed()} and
 * {@link #toString()} (which says {@code <NDArray closed>}) throws a
 * {@link KVStoreException} with code {@link KVStoreException.Code#DISPOSED}, the shape and
 * dtype accessors included. Arrays are safe to use from several threads; a concurrent
 * {@code close()} makes the calls that follow it fail with {@code DISPOSED}.
 *
 * <p>Element-wise operations with a scalar convert the scalar to the array's dtype first
 * (as MXNet); integer arithmetic wraps, integer division by zero is
 * {@link KVStoreException.Code#INVALID_ARGUMENT}.
 *
 * <p>A null argument is a {@link NullPointerException} naming the parameter
 * ({@code "shape"}, {@code "other"}, ...), thrown before any native call.
 */
public final class NDArray extends NativeObject implements AutoCloseable {
    static {
        NativeLibrary.load();
    }

    /** How arrays are freed, and how many were (for tests). */
    private static final Kind KIND = new Kind("NDArray", NDArray::nFree);

    private static final int OP_ADD = 0;
    private static final int OP_SUB = 1;
    private static final int OP_MUL = 2;
    private static final int OP_DIV = 3;

    private final int[] shape;
    private final DType dtype;
    private final Context context;

    /** What an array's native info says: read before the array exists. */
    private static final class Meta {
        private final int[] shape;
        private final DType dtype;
        private final Context context;

        private Meta(int[] shape, DType dtype, Context context) {
            this.shape = shape;
            this.dtype = dtype;
            this.context = context;
        }

        /** The native bytes of the array's elements. */
        long bytes() {
            return size(shape) * dtype.elementBytes();
        }

        /** Reads {@code handle}'s info; frees the handle if it cannot be represented. */
        static Meta of(long handle) {
            try {
                long[] info = nInfo(handle);
                if (info == null || info.length < 4 || info[3] != info.length - 4) {
                    throw new KVStoreException(KVStoreException.Code.INTERNAL, "malformed native array info");
                }
                DType dtype = DType.fromCode(info[0]);
                Context context = Context.fromCodes(info[1], info[2]);
                int[] shape = new int[(int) info[3]];
                for (int i = 0; i < shape.length; i++) {
                    if (info[4 + i] < 0 || info[4 + i] > Integer.MAX_VALUE) {
                        throw new KVStoreException(KVStoreException.Code.INTERNAL,
                                "array dimension " + info[4 + i] + " does not fit an int");
                    }
                    shape[i] = (int) info[4 + i];
                }
                return new Meta(shape, dtype, context);
            } catch (RuntimeException | Error e) {
                // Never leak a handle we were given but cannot represent.
                if (handle != 0) {
                    try {
                        nFree(handle);
                    } catch (RuntimeException suppressed) {
                        e.addSuppressed(suppressed);
                    }
                }
                throw e;
            }
        }
    }

    /**
     * Wraps a native handle, taking ownership of it: the array is freed by {@link #close()}
     * or the Cleaner, and its bytes count towards the collection threshold (see the class
     * docs), which may make this constructor wait for a garbage collection first.
     */
    NDArray(long handle) {
        this(handle, Meta.of(handle), true);
    }

    /**
     * An array an {@link Updater} gets: a view of the store's memory whose handle the native
     * side frees when the call returns; {@link #release()} marks it closed then. Not counted,
     * not registered with the Cleaner.
     */
    static NDArray borrowed(long handle) {
        return new NDArray(handle, Meta.of(handle), false);
    }

    /**
     * Wraps the handle of an array over memory the library did not allocate (a direct
     * buffer, {@link #wrap(ByteBuffer, int[], DType)}): owned and registered with the
     * Cleaner, but its bytes are not counted towards the collection threshold, since
     * freeing the handle frees none of them.
     */
    private static NDArray wrapped(long handle) {
        return new NDArray(handle, Meta.of(handle), true, 0);
    }

    private NDArray(long handle, Meta meta, boolean owned) {
        this(handle, meta, owned, meta.bytes());
    }

    private NDArray(long handle, Meta meta, boolean owned, long bytes) {
        super(KIND, handle, bytes, owned);
        this.shape = meta.shape;
        this.dtype = meta.dtype;
        this.context = meta.context;
    }

    // ----- factories -----

    /**
     * Same as {@link #zeros(int[], Context, DType)} on {@code cpu(0)} with
     * {@link DType#FLOAT32}.
     *
     * @param shape the dimensions, each at least 0
     * @return the array
     */
    public static NDArray zeros(int... shape) {
        return zeros(shape, Context.defaultContext(), DType.FLOAT32);
    }

    /**
     * An array of zeros.
     *
     * @param shape the dimensions, each at least 0
     * @param ctx the context
     * @param dtype the element type
     * @return the array
     * @throws KVStoreException {@code INVALID_ARGUMENT} for a negative dimension or a size
     *     too large to allocate; {@code DEVICE_UNAVAILABLE} for a device no backend serves
     */
    public static NDArray zeros(int[] shape, Context ctx, DType dtype) {
        return full(shape, 0.0, ctx, dtype);
    }

    /**
     * Same as {@link #ones(int[], Context, DType)} on {@code cpu(0)} with
     * {@link DType#FLOAT32}.
     *
     * @param shape the dimensions
     * @return the array
     */
    public static NDArray ones(int... shape) {
        return ones(shape, Context.defaultContext(), DType.FLOAT32);
    }

    /**
     * An array of ones.
     *
     * @param shape the dimensions
     * @param ctx the context
     * @param dtype the element type
     * @return the array
     * @throws KVStoreException as {@link #zeros(int[], Context, DType)}
     */
    public static NDArray ones(int[] shape, Context ctx, DType dtype) {
        return full(shape, 1.0, ctx, dtype);
    }

    /**
     * Same as {@link #full(int[], double, Context, DType)} on {@code cpu(0)} with
     * {@link DType#FLOAT32}.
     *
     * @param shape the dimensions
     * @param value the value
     * @return the array
     */
    public static NDArray full(int[] shape, double value) {
        return full(shape, value, Context.defaultContext(), DType.FLOAT32);
    }

    /**
     * An array filled with {@code value}, converted to {@code dtype} (floats to integers
     * truncate toward zero and saturate).
     *
     * @param shape the dimensions
     * @param value the value
     * @param ctx the context
     * @param dtype the element type
     * @return the array
     * @throws KVStoreException as {@link #zeros(int[], Context, DType)}
     */
    public static NDArray full(int[] shape, double value, Context ctx, DType dtype) {
        long[] dims = dims(shape);
        Objects.requireNonNull(ctx, "ctx");
        Objects.requireNonNull(dtype, "dtype");
        return new NDArray(nNew(dims, dtype.code(), ctx.typeCode(), ctx.deviceId(), value));
    }

    /**
     * Same as {@link #array(float[], int[], Context, DType)} on {@code cpu(0)} with
     * {@link DType#FLOAT32}.
     *
     * @param data the elements; {@code data.length} must be the size of {@code shape}
     * @param shape the dimensions
     * @return the array
     */
    public static NDArray array(float[] data, int[] shape) {
        return array(data, shape, Context.defaultContext(), DType.FLOAT32);
    }

    /**
     * An array holding {@code data} (row-major) converted to {@code dtype} (into float32 it
     * is one straight copy).
     *
     * @param data the elements; {@code data.length} must be the size of {@code shape}
     * @param shape the dimensions
     * @param ctx the context
     * @param dtype the element type
     * @return the array
     * @throws KVStoreException {@code SHAPE_MISMATCH} if the lengths differ;
     *     {@code INVALID_ARGUMENT} for a bad shape; {@code DEVICE_UNAVAILABLE}
     */
    public static NDArray array(float[] data, int[] shape, Context ctx, DType dtype) {
        Objects.requireNonNull(data, "data");
        long[] dims = dims(shape);
        Objects.requireNonNull(ctx, "ctx");
        Objects.requireNonNull(dtype, "dtype");
        return new NDArray(nFromFloats(data, dims, dtype.code(), ctx.typeCode(), ctx.deviceId()));
    }

    /**
     * Same as {@link #array(double[], int[], Context, DType)} on {@code cpu(0)} with
     * {@link DType#FLOAT64}.
     *
     * @param data the elements
     * @param shape the dimensions
     * @return the array
     */
    public static NDArray array(double[] data, int[] shape) {
        return array(data, shape, Context.defaultContext(), DType.FLOAT64);
    }

    /**
     * An array holding {@code data} (row-major) converted to {@code dtype}.
     *
     * @param data the elements
     * @param shape the dimensions
     * @param ctx the context
     * @param dtype the element type
     * @return the array
     * @throws KVStoreException as {@link #array(float[], int[], Context, DType)}
     */
    public static NDArray array(double[] data, int[] shape, Context ctx, DType dtype) {
        Objects.requireNonNull(data, "data");
        long[] dims = dims(shape);
        Objects.requireNonNull(ctx, "ctx");
        Objects.requireNonNull(dtype, "dtype");
        return new NDArray(nFromDoubles(data, dims, dtype.code(), ctx.typeCode(), ctx.deviceId()));
    }

    /**
     * Same as {@link #array(int[], int[], Context, DType)} on {@code cpu(0)} with
     * {@link DType#INT32}.
     *
     * @param data the elements
     * @param shape the dimensions
     * @return the array
     */
    public static NDArray array(int[] data, int[] shape) {
        return array(data, shape, Context.defaultContext(), DType.INT32);
    }

    /**
     * An array holding {@code data} (row-major) converted to {@code dtype} (into narrower
     * integers it wraps).
     *
     * @param data the elements
     * @param shape the dimensions
     * @param ctx the context
     * @param dtype the element type
     * @return the array
     * @throws KVStoreException as {@link #array(float[], int[], Context, DType)}
     */
    public static NDArray array(int[] data, int[] shape, Context ctx, DType dtype) {
        Objects.requireNonNull(data, "data");
        long[] dims = dims(shape);
        Objects.requireNonNull(ctx, "ctx");
        Objects.requireNonNull(dtype, "dtype");
        return new NDArray(nFromInts(data, dims, dtype.code(), ctx.typeCode(), ctx.deviceId()));
    }

    /**
     * Same as {@link #array(long[], int[], Context, DType)} on {@code cpu(0)} with
     * {@link DType#INT64}.
     *
     * @param data the elements
     * @param shape the dimensions
     * @return the array
     */
    public static NDArray array(long[] data, int[] shape) {
        return array(data, shape, Context.defaultContext(), DType.INT64);
    }

    /**
     * An array holding {@code data} (row-major) converted to {@code dtype}.
     *
     * @param data the elements
     * @param shape the dimensions
     * @param ctx the context
     * @param dtype the element type
     * @return the array
     * @throws KVStoreException as {@link #array(float[], int[], Context, DType)}
     */
    public static NDArray array(long[] data, int[] shape, Context ctx, DType dtype) {
        Objects.requireNonNull(data, "data");
        long[] dims = dims(shape);
        Objects.requireNonNull(ctx, "ctx");
        Objects.requireNonNull(dtype, "dtype");
        return new NDArray(nFromLongs(data, dims, dtype.code(), ctx.typeCode(), ctx.deviceId()));
    }

    /**
     * An array over the bytes of a direct {@link ByteBuffer}, in place: no copy is made. The
     * elements, row-major, are the buffer's bytes from its {@linkplain ByteBuffer#position()
     * position} to its {@linkplain ByteBuffer#limit() limit}, which must be exactly the
     * shape's size times the dtype's element size; the array is on {@code cpu(0)}. The store
     * reads pushed values straight from the buffer and writes pulls straight into it; later
     * changes to the buffer's position, limit or order do not move the array.
     *
     * <p><b>Byte order.</b> Elements are read and written in the platform's byte order,
     * {@link ByteOrder#nativeOrder()}. For a dtype wider than a byte the buffer's order must
     * therefore be the native one, else this throws (a buffer from
     * {@link ByteBuffer#allocateDirect(int)} starts big-endian: call
     * {@code buffer.order(ByteOrder.nativeOrder())} before filling it or making views such as
     * {@code asFloatBuffer()}). Only the flag can be checked: bytes written through a view of
     * another order are read as they lie.
     *
     * <p><b>Read-only buffers</b> ({@link ByteBuffer#isReadOnly()}) give a read-only array:
     * it may be pushed and read, but every write to it (a pull into it, an in-place
     * operation, {@link #copyFrom(NDArray)}) fails with {@code INVALID_ARGUMENT} and changes
     * nothing.
     *
     * <p><b>Lifetime.</b> The array keeps the buffer reachable (a JNI global reference) for
     * as long as it or a call using it lives, so the garbage collector cannot free the
     * memory under it. Memory freed explicitly is the caller's to keep alive until the array
     * is closed and its calls are done: do not close the {@code Arena} of a
     * {@code MemorySegment} whose {@code asByteBuffer()} is wrapped, call a buffer's cleaner,
     * or free the memory of a buffer made by other native code before then.
     *
     * <p><b>Accesses through the buffer</b> are invisible to the store, so ordering them is
     * the caller's responsibility, as for the numpy arrays that the Python binding lends:
     * while a non-blocking call that uses the array is pending (from
     * {@link AsyncKVStore#push(String, NDArray)} or {@link AsyncKVStore#pull(String, NDArray)}
     * until its future completes), Java code must not write the buffer, nor read it while a
     * pull into it is pending. Accesses through this array ({@link #toFloatArray()},
     * {@link #addInPlace(double)}, ...) are ordered by the store as for any array.
     *
     * @param buffer a direct buffer holding the elements between its position and limit
     * @param shape the dimensions
     * @param dtype the element type
     * @return the array, over the buffer's memory
     * @throws IllegalArgumentException for a heap (non-direct) buffer, which has no fixed
     *     address; for a buffer whose order is not the native one when {@code dtype} is wider
     *     than a byte
     * @throws KVStoreException {@code INVALID_ARGUMENT} if the remaining bytes are not the
     *     shape's, if the bytes at the position are not aligned for {@code dtype} (use
     *     {@link ByteBuffer#alignedSlice(int)}), or for a negative dimension
     */
    public static NDArray wrap(ByteBuffer buffer, int[] shape, DType dtype) {
        Objects.requireNonNull(buffer, "buffer");
        long[] dims = dims(shape);
        Objects.requireNonNull(dtype, "dtype");
        if (!buffer.isDirect()) {
            throw new IllegalArgumentException("NDArray.wrap: the buffer is a heap buffer, which has no fixed address"
                    + " for the store to use in place: allocate it with ByteBuffer.allocateDirect, or copy the data"
                    + " with NDArray.array");
        }
        if (dtype.elementBytes() > 1 && buffer.order() != ByteOrder.nativeOrder()) {
            throw new IllegalArgumentException("NDArray.wrap: the buffer's byte order is " + buffer.order()
                    + ", but the store reads and writes " + dtype.mxnetName() + " elements in the native order, "
                    + ByteOrder.nativeOrder() + ": call buffer.order(ByteOrder.nativeOrder()) before filling it");
        }
        // One read of each: the native side checks them against the buffer's capacity, so a
        // concurrent change is an error, never an access outside the buffer.
        int position = buffer.position();
        int limit = buffer.limit();
        return wrapped(nWrap(buffer, position, limit - position, !buffer.isReadOnly(), dims, dtype.code()));
    }

    /**
     * A one-dimensional array of evenly spaced values in {@code [start, stop)}, with numpy's
     * semantics: {@code ceil((stop - start) / step)} elements (none if that is not
     * positive), element {@code i} being {@code start + i * step} computed in float64 and
     * then converted to {@code dtype}.
     *
     * @param start the first value
     * @param stop the end, exclusive
     * @param step the spacing, not 0
     * @param ctx the context
     * @param dtype the element type
     * @return the array
     * @throws KVStoreException {@code INVALID_ARGUMENT} for a zero or non-finite step, a
     *     non-finite bound, or more than {@code Integer.MAX_VALUE} elements;
     *     {@code RESOURCE_EXHAUSTED} if the Java heap cannot hold the values while they are
     *     computed (8 bytes each)
     */
    public static NDArray arange(double start, double stop, double step, Context ctx, DType dtype) {
        Objects.requireNonNull(ctx, "ctx");
        Objects.requireNonNull(dtype, "dtype");
        if (step == 0 || !Double.isFinite(step) || !Double.isFinite(start) || !Double.isFinite(stop)) {
            throw new KVStoreException(KVStoreException.Code.INVALID_ARGUMENT,
                    "arange(" + start + ", " + stop + ", " + step + "): start, stop and step must be finite"
                            + " and step must not be 0");
        }
        double n = Math.ceil((stop - start) / step);
        if (n > Integer.MAX_VALUE) {
            throw new KVStoreException(KVStoreException.Code.INVALID_ARGUMENT,
                    "arange(" + start + ", " + stop + ", " + step + "): " + n + " elements is too many");
        }
        int len = n > 0 ? (int) n : 0;
        double[] data = javaDoubles(len, "arange(" + start + ", " + stop + ", " + step + ")");
        for (int i = 0; i < len; i++) {
            data[i] = start + i * step;
        }
        return array(data, new int[] {len}, ctx, dtype);
    }

    /**
     * Same as {@link #arange(double, double, double, Context, DType)} on {@code cpu(0)} with
     * {@link DType#FLOAT32}.
     *
     * @param start the first value
     * @param stop the end, exclusive
     * @param step the spacing, not 0
     * @return the array
     */
    public static NDArray arange(double start, double stop, double step) {
        return arange(start, stop, step, Context.defaultContext(), DType.FLOAT32);
    }

    /**
     * A new {@code double[len]} for {@code what}: {@code RESOURCE_EXHAUSTED}, not an
     * {@link OutOfMemoryError}, when the heap cannot hold it (checked against the maximum
     * heap first, so that a hopeless request does not make the collector run in vain).
     */
    private static double[] javaDoubles(int len, String what) {
        long bytes = (long) len * Double.BYTES;
        long max = Runtime.getRuntime().maxMemory();
        if (bytes > max) {
            throw new KVStoreException(KVStoreException.Code.RESOURCE_EXHAUSTED,
                    what + ": " + len + " values take " + bytes + " bytes of Java heap, more than its maximum, "
                            + max + " bytes (-Xmx)");
        }
        try {
            return new double[len];
        } catch (OutOfMemoryError e) {
            throw new KVStoreException(KVStoreException.Code.RESOURCE_EXHAUSTED,
                    what + ": the Java heap cannot hold " + len + " values (" + bytes + " bytes): " + e.getMessage(), e);
        }
    }

    private static long[] dims(int[] shape) {
        Objects.requireNonNull(shape, "shape");
        long[] dims = new long[shape.length];
        for (int i = 0; i < shape.length; i++) {
            // Negative dimensions go through as they are: the native side reports them
            // (INVALID_ARGUMENT) with the rest of the shape checks.
            dims[i] = shape[i];
        }
        return dims;
    }

    // ----- accessors -----

    /** Native arrays freed so far, explicitly or by the Cleaner. */
    static long freedCount() {
        return KIND.freedCount();
    }

    /** Throws {@code DISPOSED} once closed: the metadata of a closed array is gone too. */
    private void checkOpen() {
        handle();
    }

    private static long size(int[] shape) {
        long n = 1;
        for (int d : shape) {
            n *= d;
        }
        return n;
    }

    /**
     * The dimensions (a copy).
     *
     * @return the shape
     * @throws KVStoreException {@code DISPOSED} if closed
     */
    public int[] shape() {
        checkOpen();
        return shape.clone();
    }

    /**
     * The number of dimensions.
     *
     * @return the number of dimensions (0 for a scalar)
     * @throws KVStoreException {@code DISPOSED} if closed
     */
    public int ndim() {
        checkOpen();
        return shape.length;
    }

    /**
     * The number of elements.
     *
     * @return the product of the dimensions
     * @throws KVStoreException {@code DISPOSED} if closed
     */
    public long size() {
        checkOpen();
        return size(shape);
    }

    /**
     * The element type.
     *
     * @return the dtype
     * @throws KVStoreException {@code DISPOSED} if closed
     */
    public DType dtype() {
        checkOpen();
        return dtype;
    }

    /**
     * The context the array lives on.
     *
     * @return the context
     * @throws KVStoreException {@code DISPOSED} if closed
     */
    public Context context() {
        checkOpen();
        return context;
    }

    // ----- data out -----

    /**
     * The elements, row-major, converted to float.
     *
     * @return a new Java array
     * @throws KVStoreException {@code DISPOSED} if closed
     */
    public float[] toFloatArray() {
        try {
            return nToFloats(handle());
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * Copies the elements, row-major, into {@code dst} (converted to float): one copy,
     * straight from the native buffer, with no allocation.
     *
     * @param dst a Java array of this array's size
     * @return {@code dst}
     * @throws KVStoreException {@code SHAPE_MISMATCH} if the lengths differ; {@code DISPOSED}
     */
    public float[] toFloatArray(float[] dst) {
        Objects.requireNonNull(dst, "dst");
        try {
            nCopyToFloats(handle(), dst);
        } finally {
            Reference.reachabilityFence(this);
        }
        return dst;
    }

    /**
     * The elements, row-major, converted to double (exact for every dtype but int64 values
     * beyond 2^53).
     *
     * @return a new Java array
     * @throws KVStoreException {@code DISPOSED} if closed
     */
    public double[] toDoubleArray() {
        try {
            return nToDoubles(handle());
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * The elements, row-major, converted to int (floats truncate toward zero and saturate;
     * int64 wraps).
     *
     * @return a new Java array
     * @throws KVStoreException {@code DISPOSED} if closed
     */
    public int[] toIntArray() {
        try {
            return nToInts(handle());
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * The elements, row-major, converted to long (floats truncate toward zero and saturate).
     *
     * @return a new Java array
     * @throws KVStoreException {@code DISPOSED} if closed
     */
    public long[] toLongArray() {
        try {
            return nToLongs(handle());
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    // ----- arithmetic -----

    private NDArray binary(int op, NDArray other) {
        Objects.requireNonNull(other, "other");
        try {
            return new NDArray(nBinary(handle(), op, other.handle()));
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(other);
        }
    }

    private NDArray binary(int op, double value) {
        try {
            return new NDArray(nBinaryScalar(handle(), op, value));
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    private NDArray assign(int op, NDArray other) {
        Objects.requireNonNull(other, "other");
        try {
            nAssign(handle(), op, other.handle());
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(other);
        }
        return this;
    }

    private NDArray assign(int op, double value) {
        try {
            nAssignScalar(handle(), op, value);
        } finally {
            Reference.reachabilityFence(this);
        }
        return this;
    }

    /**
     * {@code this + other} as a new array.
     *
     * @param other an array of the same shape and dtype
     * @return the sum
     * @throws KVStoreException {@code SHAPE_MISMATCH}, {@code DTYPE_MISMATCH}, {@code DISPOSED}
     */
    public NDArray add(NDArray other) {
        return binary(OP_ADD, other);
    }

    /**
     * {@code this + value} as a new array.
     *
     * @param value the scalar, converted to the array's dtype
     * @return the sum
     * @throws KVStoreException {@code DISPOSED}
     */
    public NDArray add(double value) {
        return binary(OP_ADD, value);
    }

    /**
     * {@code this - other} as a new array.
     *
     * @param other an array of the same shape and dtype
     * @return the difference
     * @throws KVStoreException as {@link #add(NDArray)}
     */
    public NDArray sub(NDArray other) {
        return binary(OP_SUB, other);
    }

    /**
     * {@code this - value} as a new array.
     *
     * @param value the scalar
     * @return the difference
     * @throws KVStoreException {@code DISPOSED}
     */
    public NDArray sub(double value) {
        return binary(OP_SUB, value);
    }

    /**
     * {@code this * other} (element-wise) as a new array.
     *
     * @param other an array of the same shape and dtype
     * @return the product
     * @throws KVStoreException as {@link #add(NDArray)}
     */
    public NDArray mul(NDArray other) {
        return binary(OP_MUL, other);
    }

    /**
     * {@code this * value} as a new array.
     *
     * @param value the scalar
     * @return the product
     * @throws KVStoreException {@code DISPOSED}
     */
    public NDArray mul(double value) {
        return binary(OP_MUL, value);
    }

    /**
     * {@code this / other} (element-wise) as a new array.
     *
     * @param other an array of the same shape and dtype
     * @return the quotient
     * @throws KVStoreException as {@link #add(NDArray)}; {@code INVALID_ARGUMENT} for an
     *     integer division by zero
     */
    public NDArray div(NDArray other) {
        return binary(OP_DIV, other);
    }

    /**
     * {@code this / value} as a new array.
     *
     * @param value the scalar
     * @return the quotient
     * @throws KVStoreException {@code INVALID_ARGUMENT} for an integer division by zero
     */
    public NDArray div(double value) {
        return binary(OP_DIV, value);
    }

    /**
     * {@code this += other}.
     *
     * @param other an array of the same shape and dtype
     * @return this array
     * @throws KVStoreException as {@link #add(NDArray)}; on error nothing changes
     */
    public NDArray addInPlace(NDArray other) {
        return assign(OP_ADD, other);
    }

    /**
     * {@code this += value}.
     *
     * @param value the scalar
     * @return this array
     * @throws KVStoreException {@code DISPOSED}
     */
    public NDArray addInPlace(double value) {
        return assign(OP_ADD, value);
    }

    /**
     * {@code this -= other}.
     *
     * @param other an array of the same shape and dtype
     * @return this array
     * @throws KVStoreException as {@link #add(NDArray)}
     */
    public NDArray subInPlace(NDArray other) {
        return assign(OP_SUB, other);
    }

    /**
     * {@code this -= value}.
     *
     * @param value the scalar
     * @return this array
     * @throws KVStoreException {@code DISPOSED}
     */
    public NDArray subInPlace(double value) {
        return assign(OP_SUB, value);
    }

    /**
     * {@code this *= other}.
     *
     * @param other an array of the same shape and dtype
     * @return this array
     * @throws KVStoreException as {@link #add(NDArray)}
     */
    public NDArray mulInPlace(NDArray other) {
        return assign(OP_MUL, other);
    }

    /**
     * {@code this *= value}.
     *
     * @param value the scalar
     * @return this array
     * @throws KVStoreException {@code DISPOSED}
     */
    public NDArray mulInPlace(double value) {
        return assign(OP_MUL, value);
    }

    /**
     * {@code this /= other}.
     *
     * @param other an array of the same shape and dtype
     * @return this array
     * @throws KVStoreException as {@link #div(NDArray)}
     */
    public NDArray divInPlace(NDArray other) {
        return assign(OP_DIV, other);
    }

    /**
     * {@code this /= value}.
     *
     * @param value the scalar
     * @return this array
     * @throws KVStoreException as {@link #div(double)}
     */
    public NDArray divInPlace(double value) {
        return assign(OP_DIV, value);
    }

    // ----- copies -----

    /**
     * A copy of this array on {@code ctx}.
     *
     * @param ctx the context
     * @return the copy
     * @throws KVStoreException {@code DEVICE_UNAVAILABLE}, {@code DISPOSED}
     */
    public NDArray copyTo(Context ctx) {
        Objects.requireNonNull(ctx, "ctx");
        try {
            return new NDArray(nCopyTo(handle(), ctx.typeCode(), ctx.deviceId()));
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * A copy converted to {@code dtype}: floats to integers truncate toward zero
     * (saturating), integers to narrower integers wrap, floats round to nearest.
     *
     * @param dtype the element type
     * @return the copy
     * @throws KVStoreException {@code DISPOSED}
     */
    public NDArray asType(DType dtype) {
        Objects.requireNonNull(dtype, "dtype");
        try {
            return new NDArray(nAsType(handle(), dtype.code()));
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * Overwrites this array with {@code src} (same shape; the dtype is converted as in
     * {@link #asType(DType)}).
     *
     * @param src the source
     * @return this array
     * @throws KVStoreException {@code SHAPE_MISMATCH}, {@code DISPOSED}
     */
    public NDArray copyFrom(NDArray src) {
        Objects.requireNonNull(src, "src");
        try {
            nCopyFrom(handle(), src.handle());
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(src);
        }
        return this;
    }

    /**
     * Overwrites this array with {@code data} (row-major): one copy, straight into the
     * native buffer, with no allocation for a float32 array (other dtypes convert).
     *
     * @param data the elements; {@code data.length} must be this array's size
     * @return this array
     * @throws KVStoreException {@code SHAPE_MISMATCH} if the lengths differ; {@code DISPOSED}
     */
    public NDArray copyFrom(float[] data) {
        Objects.requireNonNull(data, "data");
        try {
            nCopyFromFloats(handle(), data);
        } finally {
            Reference.reachabilityFence(this);
        }
        return this;
    }

    /**
     * Whether both arrays use some of the same memory: views of one native buffer, or arrays
     * that {@link #wrap(ByteBuffer, int[], DType)} made over overlapping bytes (views of one
     * direct buffer). The store tells such arrays apart the same way: a call whose outs share
     * memory writes them in key order, as if one array were given for each.
     *
     * @param other the other array
     * @return true if they share memory
     * @throws KVStoreException {@code DISPOSED}
     */
    public boolean sameStorage(NDArray other) {
        Objects.requireNonNull(other, "other");
        try {
            return nSameStorage(handle(), other.handle());
        } finally {
            Reference.reachabilityFence(this);
            Reference.reachabilityFence(other);
        }
    }

    // ----- lifecycle -----

    /**
     * MXNet's repr: the values (large arrays summarised), then a line
     * {@code <NDArray 2x3 float32 @cpu(0)>}; {@code "<NDArray closed>"} once closed.
     */
    @Override
    public String toString() {
        long h = handleOrZero();
        if (h == 0) {
            return "<NDArray closed>";
        }
        try {
            return nToString(h);
        } catch (KVStoreException e) {
            if (e.code() == KVStoreException.Code.DISPOSED) {
                // Closed by another thread, or an updater's array after its call.
                return "<NDArray closed>";
            }
            throw e;
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    // ----- natives (kvstore-jni/src/ndarray.rs; contract in kvstore-jni/NATIVES.md) -----

    static native long nNew(long[] shape, int dtype, int devType, int devId, double fill);

    static native long nFromFloats(float[] data, long[] shape, int dtype, int devType, int devId);

    static native long nFromDoubles(double[] data, long[] shape, int dtype, int devType, int devId);

    static native long nFromInts(int[] data, long[] shape, int dtype, int devType, int devId);

    static native long nFromLongs(long[] data, long[] shape, int dtype, int devType, int devId);

    static native long nWrap(ByteBuffer buffer, int position, int remaining, boolean writable, long[] shape, int dtype);

    static native float[] nToFloats(long h);

    static native double[] nToDoubles(long h);

    static native int[] nToInts(long h);

    static native long[] nToLongs(long h);

    static native void nCopyFromFloats(long h, float[] data);

    static native void nCopyToFloats(long h, float[] dst);

    static native long[] nInfo(long h);

    static native long nBinary(long h, int op, long other);

    static native long nBinaryScalar(long h, int op, double value);

    static native void nAssign(long h, int op, long other);

    static native void nAssignScalar(long h, int op, double value);

    static native long nCopyTo(long h, int devType, int devId);

    static native long nAsType(long h, int dtype);

    static native void nCopyFrom(long h, long src);

    static native boolean nSameStorage(long a, long b);

    static native String nToString(long h);


    static native void nFree(long h);
}
