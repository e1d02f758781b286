package io.github.kvstore;

import java.lang.ref.Reference;
import java.util.Arrays;
import java.util.Objects;

/**
 * A row-sparse array (MXNet's {@code row_sparse} storage): a logical shape
 * {@code [rows, ...]} of which only the rows {@link #indices()} are stored, as one dense
 * block {@link #data()} of shape {@code [indices.length, ...]}; every other row is zero.
 * Embeddings push and pull a few rows at a time with it:
 *
 * <pre>{@code
 * try (KVStore kv = KVStore.create("local");
 *      RowSparse init = RowSparse.zeros(new int[] {1000, 8}, DType.FLOAT32);
 *      RowSparse grad = RowSparse.of(NDArray.ones(2, 8), new long[] {3, 7}, 1000, 8)) {
 *     kv.initRowSparse("emb", init);
 *     kv.pushRowSparse("emb", grad);                      // only rows 3 and 7 are sent
 *     try (RowSparse rows = kv.rowSparsePull("emb", new long[] {7, 3, 7})) {
 *         rows.indices();                                  // {3, 7}
 *     }
 * }
 * }</pre>
 *
 * <p>The indices are strictly increasing and within the rows; the data has the array's
 * dtype. A row-sparse array owns its data array: {@link #close()} closes it (an array
 * made by {@link #of} uses the given array as its data, without a copy).
 */
public final class RowSparse implements AutoCloseable {
    static {
        NativeLibrary.load();
    }

    private final NDArray data;
    private final long[] indices;
    private final int[] shape;

    private RowSparse(NDArray data, long[] indices, int[] shape) {
        this.data = data;
        this.indices = indices;
        this.shape = shape;
    }

    /**
     * The row-sparse array of shape {@code shape} whose rows {@code indices} are
     * {@code data} (no copy: the array is its data from now on).
     *
     * @param data the rows, of shape {@code [indices.length, shape[1], ...]}
     * @param indices the row numbers, strictly increasing, each in {@code [0, shape[0])}
     * @param shape the whole array's shape, at least one dimension
     * @return the array
     * @throws KVStoreException {@code INVALID_ARGUMENT} for indices not strictly
     *     increasing or out of range, or data of another shape; {@code DISPOSED} for a
     *     closed data array
     */
    public static RowSparse of(NDArray data, long[] indices, int... shape) {
        Objects.requireNonNull(data, "data");
        Objects.requireNonNull(indices, "indices");
        Objects.requireNonNull(shape, "shape");
        RowSparse r = new RowSparse(data, indices.clone(), shape.clone());
        try {
            nCheck(data.handle(), r.describe());
        } finally {
            Reference.reachabilityFence(data);
        }
        return r;
    }

    /**
     * A row-sparse array of shape {@code shape} with no rows stored (all zero), on
     * {@code cpu(0)}.
     *
     * @param shape the shape, at least one dimension
     * @param dtype the elements' type
     * @return the array
     */
    public static RowSparse zeros(int[] shape, DType dtype) {
        Objects.requireNonNull(shape, "shape");
        Objects.requireNonNull(dtype, "dtype");
        if (shape.length == 0) {
            throw new KVStoreException(KVStoreException.Code.INVALID_ARGUMENT,
                    "a row-sparse array has at least one dimension (its rows)");
        }
        int[] dataShape = shape.clone();
        dataShape[0] = 0;
        return of(NDArray.zeros(dataShape, Context.cpu(), dtype), new long[0], shape);
    }

    /**
     * The rows of {@code dense} that hold a non-zero element, as a row-sparse array
     * (MXNet's {@code tostype("row_sparse")}); the data is a copy.
     *
     * @param dense a host array of at least one dimension
     * @return the array
     */
    public static RowSparse fromDense(NDArray dense) {
        Objects.requireNonNull(dense, "dense");
        try {
            return fromJava(nFromDense(dense.handle()));
        } finally {
            Reference.reachabilityFence(dense);
        }
    }

    /** A row-sparse array from the native {@code [data handle, rows, indices...]}. */
    static RowSparse fromJava(long[] got) {
        NDArray data = new NDArray(got[0]);
        int[] shape = data.shape().clone();
        shape[0] = (int) got[1];
        return new RowSparse(data, Arrays.copyOfRange(got, 2, got.length), shape);
    }

    /**
     * The whole array, dense: a new array (zero in the rows not stored) the caller owns.
     *
     * @return the dense array
     */
    public NDArray toDense() {
        try {
            return new NDArray(nToDense(data.handle(), describe()));
        } finally {
            Reference.reachabilityFence(data);
        }
    }

    /**
     * The stored rows (the array itself, not a copy).
     *
     * @return the data array, of shape {@code [indices().length, shape()[1], ...]}
     */
    public NDArray data() {
        return data;
    }

    /**
     * The row numbers of the stored rows, strictly increasing.
     *
     * @return a copy of the indices
     */
    public long[] indices() {
        return indices.clone();
    }

    /**
     * The whole array's shape.
     *
     * @return a copy of the shape
     */
    public int[] shape() {
        return shape.clone();
    }

    /**
     * The elements' type.
     *
     * @return the data's dtype
     */
    public DType dtype() {
        return data.dtype();
    }

    /**
     * Closes the data array (idempotent). Then what reads the data ({@link #dtype()},
     * {@link #toDense()}, a store call given the array) throws {@link KVStoreException}
     * {@code DISPOSED}, and {@link #toString()} says {@code <RowSparse closed>}.
     */
    @Override
    public void close() {
        data.close();
    }

    /**
     * {@code RowSparse[1000, 8] FLOAT32 rows=[3, 7]} (the whole shape, the dtype, the
     * stored rows); {@code "<RowSparse closed>"} once its data array is closed. Never
     * throws {@code DISPOSED}.
     */
    @Override
    public String toString() {
        DType dtype;
        try {
            dtype = data.dtype();
        } catch (KVStoreException e) {
            if (e.code() == KVStoreException.Code.DISPOSED) {
                // Closed, here or by another thread: printing says so, as for an NDArray.
                return "<RowSparse closed>";
            }
            throw e;
        }
        return "RowSparse" + Arrays.toString(shape) + " " + dtype + " rows=" + Arrays.toString(indices);
    }

    /** This array's native description: {@code ndim, shape..., n, indices...}. */
    long[] describe() {
        long[] d = new long[2 + shape.length + indices.length];
        d[0] = shape.length;
        for (int i = 0; i < shape.length; i++) {
            d[1 + i] = shape[i];
        }
        d[1 + shape.length] = indices.length;
        System.arraycopy(indices, 0, d, 2 + shape.length, indices.length);
        return d;
    }

    /** The data handles (0 for closed data) and concatenated descriptions of {@code values}. */
    static long[][] describe(RowSparse[] values, String name) {
        Objects.requireNonNull(values, name);
        long[] handles = new long[values.length];
        int total = 0;
        long[][] parts = new long[values.length][];
        for (int i = 0; i < values.length; i++) {
            Objects.requireNonNull(values[i], name + "[" + i + "]");
            // 0 once closed: the store call's refused form (see Args.handles).
            handles[i] = values[i].data.handleOrZero();
            parts[i] = values[i].describe();
            total += parts[i].length;
        }
        long[] desc = new long[total];
        int at = 0;
        for (long[] p : parts) {
            System.arraycopy(p, 0, desc, at, p.length);
            at += p.length;
        }
        return new long[][] {handles, desc};
    }

    static native void nCheck(long data, long[] desc);

    static native long[] nFromDense(long dense);

    static native long nToDense(long data, long[] desc);
}
