package io.github.kvstore;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Test;

/** The native memory count behind the collection threshold (the loops run in ChildJvmTest). */
class NativeMemoryTest {
    private static final long MIB = 1024 * 1024;

    @Test
    void thresholdValuesAreBytesWithAnOptionalSuffix() {
        assertEquals(536870912, NativeMemory.parseBytes("536870912"));
        assertEquals(512 * MIB, NativeMemory.parseBytes("512m"));
        assertEquals(2048 * MIB, NativeMemory.parseBytes(" 2G "));
        assertEquals(64 * 1024, NativeMemory.parseBytes("64k"));
        assertEquals(0, NativeMemory.parseBytes("0"));
        assertEquals(Long.MAX_VALUE, NativeMemory.parseBytes("999999999999999999g"));
        for (String bad : new String[] {"", "m", "-1", "1.5g", "12x", "lots", "1e9", "9999999999999999999"}) {
            assertEquals(-1, NativeMemory.parseBytes(bad), bad);
        }
    }

    @Test
    void theDefaultIsAQuarterOfTheHeapAndAtLeast64MiB() {
        assertEquals(64 * MIB, NativeMemory.defaultBase(256 * MIB));
        assertEquals(512 * MIB, NativeMemory.defaultBase(2048 * MIB));
        assertEquals(4096 * MIB, NativeMemory.defaultBase(Long.MAX_VALUE));
        assertEquals(NativeMemory.defaultBase(1024 * MIB), NativeMemory.base(null, 1024 * MIB));
        assertEquals(16 * MIB, NativeMemory.base("16m", 1024 * MIB));
        assertEquals(0, NativeMemory.base("0", 1024 * MIB));
        // Never an exception: an unparsable value falls back to the default.
        assertEquals(NativeMemory.defaultBase(1024 * MIB), NativeMemory.base("plenty", 1024 * MIB));
    }

    /** Collects until the Cleaner has freed every array that earlier tests dropped. */
    private static void drain() throws InterruptedException {
        long last = -1;
        for (int stable = 0; stable < 3;) {
            System.gc();
            Thread.sleep(30);
            long now = NativeMemory.live();
            stable = now == last ? stable + 1 : 0;
            last = now;
        }
    }

    @Test
    void arraysCountTheirBytesUntilClosedAndUpdaterArraysDoNot() throws InterruptedException {
        drain();
        long before = NativeMemory.live();
        NDArray a = NDArray.zeros(new int[] {1000}, Context.cpu(), DType.FLOAT64);
        NDArray b = NDArray.zeros(new int[] {10, 10}, Context.cpu(), DType.UINT8);
        assertEquals(before + 8100, NativeMemory.live());
        long withBoth = NativeMemory.live();
        a.close();
        a.close();
        assertEquals(withBoth - 8000, NativeMemory.live(), "closing twice subtracts once");
        b.close();
        assertEquals(withBoth - 8100, NativeMemory.live());
        try (KVStore kv = KVStore.create(); NDArray w = NDArray.ones(1 << 16)) {
            kv.init("w", w).setUpdater((key, index, merged, stored) -> stored.copyFrom(merged));
            long beforePush = NativeMemory.live();
            kv.push("w", w);
            assertEquals(beforePush, NativeMemory.live(), "an updater's arrays are the store's memory");
        }
    }
}
