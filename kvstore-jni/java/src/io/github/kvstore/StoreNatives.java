package io.github.kvstore;

/**
 * The natives of {@link KVStore} and {@link AsyncKVStore} ({@code kvstore-jni/src/store.rs},
 * {@code pending.rs}, {@code sparse.rs}; their contract is {@code kvstore-jni/NATIVES.md}).
 */
final class StoreNatives {
    static {
        NativeLibrary.load();
    }

    private StoreNatives() {}

    static native long nCreate(String kind);

    static native void nFree(long h);

    static native String nVersion();

    static native boolean nMpiSupported();

    static native void nFinalizeMpi();

    static native String nType(long h);

    static native void nStartTimeline(long h, String path);

    static native String nStopTimeline(long h);

    static native void nCloseTimelineAtExit();

    static native void nCommit(long h, long step, byte[] extra);

    static native byte[] nRestored(long h);

    static native long[] nStats(long h);

    static native void nResetStats(long h);

    static native int nRank(long h);

    static native int nNumWorkers(long h);

    static native String[] nKeys(long h);

    static native int nNumKeys(long h);

    static native long nPullNew(long h, String key, int priority);

    static native void nInit(long h, String[] keys, long[] values);

    static native void nPush(long h, String[] keys, long[] values, int priority);

    static native void nPull(long h, String[] keys, long[] outs, int priority);

    static native void nPushKey(long h, String key, long[] values, int priority);

    static native void nInitRowSparse(long h, String[] keys, long[] datas, long[] desc);

    static native void nPushRowSparse(long h, String[] keys, long[] datas, long[] desc, int priority);

    static native long[] nRowSparsePull(long h, String key, long[] rowIds, int priority);

    static native int nStype(long h, String key);

    static native void nPullKey(long h, String key, long[] outs, int priority);

    static native void nPushPull(long h, String[] keys, long[] values, String[] outKeys, long[] outs, int priority);

    static native void nBroadcast(long h, String[] keys, long[] values, String[] outKeys, long[] outs, int priority);

    static native void nSubmit(
            long h, long id, int op, String[] keys, long[] values, String[] outKeys, long[] outs, int priority);

    static native void nSubmitKey(long h, long id, int op, String key, long[] arrays, int priority);

    static native int nTakeDone(long[] ids, int timeoutMs);

    static native void nRelease(long id);

    static native void nResult(long id);

    static native void nWaitAll(long h);

    static native void nSetUpdater(long h, Updater updater);

    static native void nBarrier(long h);

    static native int nNumDeadNode(long h, int nodeId);

    static native void nSetBarrierBeforeExit(long h, boolean barrierBeforeExit);

    static native void nSendCommandToServers(long h, int head, String body);

    static native void nSetGradientCompression(long h, String[] keysAndValues);

    static native boolean nIsCapable(long h, String capability);

    static native void nSetOptimizer(long h, String optimizerJson);

    static native void nSaveOptimizerStates(long h, String path);

    static native void nLoadOptimizerStates(long h, String path);

    static native void nSaveCheckpoint(long h, String path);

    static native void nLoadCheckpoint(long h, String path);

    static native String nOptimizerName(long h);
}
