package io.github.kvstore;

import java.util.Locale;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The native bytes held by {@link NDArray} objects, and the collection pressure they put on
 * the JVM (as {@code java.nio.Bits.reserveMemory} does for direct buffers, and netty and
 * Arrow for theirs).
 *
 * <p>Why: an array's Java object is a few dozen bytes, its buffer is native. A program that
 * forgets {@code close()} in a loop fills no Java heap, so the garbage collector never runs,
 * the {@link java.lang.ref.Cleaner} never frees anything, and the process grows without
 * bound. So every array adds its bytes here when it is made and removes them when it is
 * closed or cleaned; when the live total passes a threshold, the allocating thread asks for
 * a collection ({@link System#gc()}) and waits briefly, with backoff, for the Cleaner to free
 * what became unreachable. Nothing here ever throws or refuses an allocation.
 *
 * <p>The threshold adapts: after a collection it is twice what is still live (and never
 * below the base), so a program that really holds many live arrays collects once each time
 * its live total doubles, not on every allocation; when the live total falls far below it,
 * it comes down again. The base is {@value #THRESHOLD_PROPERTY} (bytes, with an optional
 * {@code k}, {@code m} or {@code g} suffix; 0 turns the pressure off), by default a quarter
 * of the maximum heap and at least 64 MiB.
 */
final class NativeMemory {
    /** The system property that sets the base threshold. */
    static final String THRESHOLD_PROPERTY = "kvstore.nativeMemoryThreshold";

    private static final long MIB = 1024L * 1024;
    /** The smallest default base: a small heap still gets room for a working set of arrays. */
    private static final long MIN_DEFAULT = 64 * MIB;
    /** The longest single wait for the Cleaner, in milliseconds (1 + 2 + ... + 256 at most). */
    private static final int MAX_SLEEP_MS = 256;
    /** With no progress at all after waits this long, nothing more is coming. */
    private static final int GIVE_UP_MS = 32;

    private static final long BASE = base(System.getProperty(THRESHOLD_PROPERTY), Runtime.getRuntime().maxMemory());
    private static final AtomicLong LIVE = new AtomicLong();
    private static final AtomicLong COLLECTIONS = new AtomicLong();
    private static final Object COLLECTING = new Object();
    private static volatile long threshold = BASE;

    private NativeMemory() {}

    /** The default base for a heap of {@code maxHeap} bytes: a quarter of it, at least 64 MiB. */
    static long defaultBase(long maxHeap) {
        return Math.max(MIN_DEFAULT, maxHeap == Long.MAX_VALUE ? 4096 * MIB : maxHeap / 4);
    }

    /**
     * The base threshold for the property's value ({@code null}: the default); an unparsable
     * value is reported once on stderr and the default is used.
     */
    static long base(String property, long maxHeap) {
        if (property == null || property.isBlank()) {
            return defaultBase(maxHeap);
        }
        long parsed = parseBytes(property);
        if (parsed < 0) {
            System.err.println("kvstore: ignoring -D" + THRESHOLD_PROPERTY + "=" + property
                    + ": not a number of bytes (such as 536870912, 512m or 2g); using "
                    + defaultBase(maxHeap) + " bytes");
            return defaultBase(maxHeap);
        }
        return parsed;
    }

    /** {@code "512m"} as bytes; -1 if it is not a non-negative number with an optional k/m/g. */
    static long parseBytes(String s) {
        String t = s.trim().toLowerCase(Locale.ROOT);
        long unit = 1;
        if (!t.isEmpty()) {
            char last = t.charAt(t.length() - 1);
            int shift = last == 'k' ? 10 : last == 'm' ? 20 : last == 'g' ? 30 : 0;
            if (shift > 0) {
                unit = 1L << shift;
                t = t.substring(0, t.length() - 1);
            }
        }
        if (t.isEmpty() || !t.chars().allMatch(Character::isDigit) || t.length() > 18) {
            return -1;
        }
        long n = Long.parseLong(t);
        return n > Long.MAX_VALUE / unit ? Long.MAX_VALUE : n * unit;
    }

    /** An array of {@code bytes} native bytes was made; may collect first (see the class docs). */
    static void allocated(long bytes) {
        if (bytes <= 0) {
            return;
        }
        long live = LIVE.addAndGet(bytes);
        if (BASE > 0 && live > threshold) {
            collect();
        }
    }

    /** An array of {@code bytes} native bytes was freed. */
    static void freed(long bytes) {
        if (bytes <= 0) {
            return;
        }
        long live = LIVE.addAndGet(-bytes);
        long t = threshold;
        // Far below a raised threshold: the program let go of most of what it held.
        if (t > BASE && live < t / 4) {
            threshold = Math.max(BASE, 2 * Math.max(live, 0));
        }
    }

    /** The native bytes of arrays not closed or cleaned yet. */
    static long live() {
        return LIVE.get();
    }

    /** The collections asked for so far (for tests). */
    static long collections() {
        return COLLECTIONS.get();
    }

    /** The current threshold (for tests). */
    static long threshold() {
        return threshold;
    }

    private static void collect() {
        boolean interrupted = false;
        synchronized (COLLECTING) {
            // Another thread may have collected while this one waited for the lock.
            if (LIVE.get() <= threshold) {
                return;
            }
            COLLECTIONS.incrementAndGet();
            System.gc();
            long before = LIVE.get();
            boolean progressed = false;
            for (int ms = 1; ms <= MAX_SLEEP_MS && LIVE.get() > threshold / 2; ms <<= 1) {
                try {
                    Thread.sleep(ms);
                } catch (InterruptedException e) {
                    interrupted = true;
                    break;
                }
                long now = LIVE.get();
                if (now < before) {
                    progressed = true;
                } else if (progressed || ms >= GIVE_UP_MS) {
                    // The Cleaner freed what it could, or had nothing to free.
                    break;
                }
                before = now;
            }
            long still = LIVE.get();
            threshold = Math.max(BASE, still > Long.MAX_VALUE / 2 ? Long.MAX_VALUE : 2 * still);
        }
        if (interrupted) {
            Thread.currentThread().interrupt();
        }
    }
}
