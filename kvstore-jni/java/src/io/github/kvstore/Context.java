package io.github.kvstore;

/**
 * A device: {@code cpu(id)} or {@code gpu(id)}, as MXNet's {@code Context}.
 *
 * <p>CPU ids are logical devices (MXNet's {@code cpu(i)}): every one of them lives in host
 * memory, so arrays "on" {@code cpu(0)} to {@code cpu(3)} can stand for the four devices of
 * a data-parallel step on a machine without GPUs. Instances are immutable values.
 *
 * <p>A null argument is a {@link NullPointerException} naming the parameter, as everywhere
 * in this package ({@link #equals(Object)} answers false instead); a negative device id is an
 * {@link IllegalArgumentException}.
 */
public final class Context {
    /** MXNet's device-type code of a CPU context (the code that crosses JNI). */
    static final int CPU_CODE = 1;
    /** MXNet's device-type code of a GPU context. */
    static final int GPU_CODE = 2;

    private static final Context CPU0 = new Context(CPU_CODE, 0);

    private final int typeCode;
    private final int deviceId;

    private Context(int typeCode, int deviceId) {
        if (deviceId < 0) {
            throw new IllegalArgumentException("device id must be >= 0, got " + deviceId);
        }
        this.typeCode = typeCode;
        this.deviceId = deviceId;
    }

    /**
     * {@code cpu(0)}.
     *
     * @return the context
     */
    public static Context cpu() {
        return CPU0;
    }

    /**
     * {@code cpu(id)}, a logical CPU device.
     *
     * @param id the device id, at least 0
     * @return the context
     * @throws IllegalArgumentException if {@code id} is negative
     */
    public static Context cpu(int id) {
        return id == 0 ? CPU0 : new Context(CPU_CODE, id);
    }

    /**
     * Same as {@link #gpu(int)} with device {@code 0}.
     *
     * @return the context
     */
    public static Context gpu() {
        return gpu(0);
    }

    /**
     * {@code gpu(id)}. Creating the context always works; arrays on it need a build and a
     * machine with a GPU backend, else they fail with
     * {@link KVStoreException.Code#DEVICE_UNAVAILABLE}.
     *
     * @param id the device id, at least 0
     * @return the context
     * @throws IllegalArgumentException if {@code id} is negative
     */
    public static Context gpu(int id) {
        return new Context(GPU_CODE, id);
    }

    /**
     * The default context, {@code cpu(0)} (MXNet's {@code default-context}).
     *
     * @return {@code cpu(0)}
     */
    public static Context defaultContext() {
        return CPU0;
    }

    /** The context with the given native codes; used when reading an array's info. */
    static Context fromCodes(long typeCode, long deviceId) {
        if (deviceId < 0 || deviceId > Integer.MAX_VALUE) {
            throw new KVStoreException(KVStoreException.Code.INTERNAL, "native reported device id " + deviceId);
        }
        if (typeCode == CPU_CODE) {
            return cpu((int) deviceId);
        }
        if (typeCode == GPU_CODE) {
            return gpu((int) deviceId);
        }
        throw new KVStoreException(KVStoreException.Code.INTERNAL, "native reported device type " + typeCode);
    }

    /**
     * The device type: {@code "cpu"} or {@code "gpu"}.
     *
     * @return the device type name
     */
    public String deviceType() {
        return typeCode == CPU_CODE ? "cpu" : "gpu";
    }

    /**
     * The device id.
     *
     * @return the id, at least 0
     */
    public int deviceId() {
        return deviceId;
    }

    /** MXNet's device-type code: 1 for CPU, 2 for GPU. */
    int typeCode() {
        return typeCode;
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof Context && ((Context) o).typeCode == typeCode && ((Context) o).deviceId == deviceId;
    }

    @Override
    public int hashCode() {
        return 31 * typeCode + deviceId;
    }

    /** {@code "cpu(0)"}, {@code "gpu(1)"}: the form MXNet prints and the array repr uses. */
    @Override
    public String toString() {
        return deviceType() + "(" + deviceId + ")";
    }
}
