package io.github.kvstore;

import static io.github.kvstore.Fixtures.assertAll;
import static io.github.kvstore.Fixtures.assertCode;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.kvstore.KVStoreException.Code;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/** Custom updaters: what they may call, how deep pushes nest, and who keeps them alive. */
class UpdaterTest {
    /** {@code n} stores; store {@code i}'s updater pushes its merged value on to store {@code i + 1}. */
    private static List<KVStore> chain(int n, NDArray init) {
        List<KVStore> stores = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            stores.add(KVStore.create().init("k", init));
        }
        for (int i = 0; i < n; i++) {
            KVStore next = i + 1 < n ? stores.get(i + 1) : null;
            stores.get(i).setUpdater((key, index, merged, stored) -> {
                if (next != null) {
                    next.push("k", merged);
                }
                stored.copyFrom(merged);
            });
        }
        return stores;
    }

    @Test
    void pushesNestThroughAtMostEightUpdatersOnOneThread() {
        try (NDArray zero = NDArray.zeros(2);
                NDArray three = NDArray.full(new int[] {2}, 3);
                NDArray out = NDArray.zeros(2)) {
            // Eight updaters deep: every store of the chain gets the value.
            List<KVStore> eight = chain(8, zero);
            eight.get(0).push("k", three);
            eight.get(7).pull("k", out);
            assertAll(3f, out);
            eight.forEach(KVStore::close);

            // Nine: the ninth updater call is refused, and every push of the chain fails.
            List<KVStore> nine = chain(9, zero);
            KVStoreException e = assertCode(Code.BACKEND, () -> nine.get(0).push("k", three));
            Throwable innermost = e;
            while (innermost.getCause() != null) {
                innermost = innermost.getCause();
            }
            KVStoreException refused = assertInstanceOf(KVStoreException.class, innermost);
            assertEquals(Code.INVALID_ARGUMENT, refused.code());
            assertTrue(refused.getMessage().contains("nest too deeply"), refused.getMessage());
            for (KVStore kv : nine) {
                kv.pull("k", out);
                assertAll(0f, out);
            }
            // The thread's count went back to zero: the chain of eight works again.
            nine.get(1).push("k", three).pull("k", out);
            assertAll(3f, out);
            nine.forEach(KVStore::close);
        }
    }

    @Test
    void anUpdaterThatOverflowsTheStackFailsThePushWithItsErrorAsCause() {
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(2);
                NDArray out = NDArray.zeros(2)) {
            kv.init("k", ones).setUpdater((key, index, merged, stored) -> recurse(0));
            KVStoreException e = assertCode(Code.BACKEND, () -> kv.push("k", ones));
            assertInstanceOf(StackOverflowError.class, e.getCause());
            // A fixed message: the native side calls no method (toString) on the exception.
            assertTrue(e.getMessage().endsWith("key \"k\": the updater threw; see the cause"), e.getMessage());
            try (NDArray five = ones.mul(5)) {
                kv.setUpdater(null).push("k", five).pull("k", out);
            }
            assertAll(5f, out);
        }
    }

    private static int recurse(int depth) {
        return recurse(depth + 1) + 1;
    }

    @Test
    void storesWhoseUpdatersCaptureThemAreStillFreedByTheCleaner() throws InterruptedException {
        long before = KVStore.freedCount();
        int n = 200;
        for (int i = 0; i < n; i++) {
            KVStore kv = KVStore.create();
            NDArray one = NDArray.ones(1);
            kv.init("k", one);
            // The updater refers to its own store: a cycle the GC must be able to free.
            kv.setUpdater((key, index, merged, stored) -> {
                kv.numWorkers();
                stored.copyFrom(merged);
            });
            kv.push("k", one);
            one.close();
        }
        long deadline = System.nanoTime() + 30_000_000_000L;
        while (KVStore.freedCount() - before < n && System.nanoTime() < deadline) {
            System.gc();
            Thread.sleep(50);
        }
        assertTrue(KVStore.freedCount() - before >= n,
                "the Cleaner freed " + (KVStore.freedCount() - before) + " of " + n
                        + " abandoned stores whose updaters capture them");
    }

    @Test
    void aReachableStoreKeepsItsUpdaterThroughGarbageCollections() throws InterruptedException {
        try (KVStore kv = KVStore.create();
                NDArray ones = NDArray.ones(2);
                NDArray out = NDArray.zeros(2)) {
            // Only the store refers to this updater (a fresh object, not a cached lambda).
            kv.init("k", ones).setUpdater(new Updater() {
                @Override
                public void update(String key, int index, NDArray merged, NDArray stored) {
                    stored.addInPlace(merged.mul(2));
                }
            });
            for (int i = 0; i < 3; i++) {
                System.gc();
                Thread.sleep(20);
            }
            kv.push("k", ones).pull("k", out);
            assertAll(3f, out);
            assertNull(kv.optimizerName());
        }
    }

    @Test
    void anUpdaterMayCallAnotherStoreButNotItsOwn() {
        try (KVStore kv = KVStore.create();
                KVStore log = KVStore.create();
                NDArray ones = NDArray.ones(2);
                NDArray out = NDArray.zeros(2)) {
            log.init("seen", out);
            kv.init("k", ones).setUpdater((key, index, merged, stored) -> {
                log.push("seen", merged);
                stored.copyFrom(merged);
            });
            try (NDArray four = ones.mul(4)) {
                kv.push("k", four);
            }
            log.pull("seen", out);
            assertAll(4f, out);
            kv.setUpdater((key, index, merged, stored) -> kv.pull("k", merged));
            KVStoreException e = assertCode(Code.BACKEND, () -> kv.push("k", ones));
            KVStoreException cause = assertInstanceOf(KVStoreException.class, e.getCause());
            assertEquals(Code.INVALID_ARGUMENT, cause.code());
        }
    }
}
