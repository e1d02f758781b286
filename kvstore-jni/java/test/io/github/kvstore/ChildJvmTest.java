package io.github.kvstore;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/**
 * What only a fresh JVM shows: the process's peak memory when arrays are never closed,
 * and what a panic leaves on stderr.
 */
class ChildJvmTest {
    private static final long MIB = 1024 * 1024;

    /** The number after {@code label} on a line of the child's stdout. */
    private static long number(ChildJvm.Result run, String label) {
        Matcher m = Pattern.compile("(?m)^" + Pattern.quote(label) + " (\\d+)").matcher(run.out);
        assertTrue(m.find(), () -> "the child printed \"" + label + "\": " + run);
        return Long.parseLong(m.group(1));
    }

    /**
     * Issue 11, item 11: 3000 arrays of 1 MiB that nobody closes, under a 256 MiB heap. The
     * Java objects are tiny, so without native memory counting the heap never fills, the
     * Cleaner never runs, and the process grows to 3 GiB.
     */
    @Test
    void unclosedArraysInALoopRunInBoundedMemory() throws Exception {
        ChildJvm.Result run = ChildJvm.run(UnclosedArraysProbe.class, List.of("-Xmx256m"), Map.of(), 300,
                "3000", "1");
        assertEquals(0, run.exit, run::toString);
        assertTrue(run.out.contains("allocated: 3000 arrays, 786432000 elements"), run::toString);
        long peak = number(run, "peak-rss-kb:") * 1024;
        assertTrue(peak < 1024 * MIB, () -> "peak resident size " + peak / MIB + " MiB is not under 1 GiB: " + run);
        // The memory was freed by the Cleaner, not merely never touched.
        long freed = number(run, "freed:");
        assertTrue(freed >= 2000, () -> "the Cleaner freed " + freed + " of 3000 arrays: " + run);
    }

    /** The same loop with a threshold set by the system property, far below the default. */
    @Test
    void theThresholdPropertyLowersThePeak() throws Exception {
        ChildJvm.Result run = ChildJvm.run(UnclosedArraysProbe.class,
                List.of("-Xmx256m", "-Dkvstore.nativeMemoryThreshold=16m"), Map.of(), 300, "1000", "1");
        assertEquals(0, run.exit, run::toString);
        long peak = number(run, "peak-rss-kb:") * 1024;
        // The JVM itself takes 100-200 MiB of the peak; 1000 live arrays would be 1000 MiB.
        assertTrue(peak < 512 * MIB, () -> "peak resident size " + peak / MIB + " MiB: " + run);
    }

    /**
     * A program that really holds its arrays (400 MiB live, a 16 MiB threshold) is not slowed
     * by a collection on every allocation: the threshold rises with what stays live, so
     * collections are about log2(400 / 16), not hundreds.
     */
    @Test
    void liveArraysRaiseTheThresholdInsteadOfCollectingOnEveryAllocation() throws Exception {
        ChildJvm.Result run = ChildJvm.run(UnclosedArraysProbe.class,
                List.of("-Xmx256m", "-Dkvstore.nativeMemoryThreshold=16m"), Map.of(), 300, "400", "1", "keep");
        assertEquals(0, run.exit, run::toString);
        assertEquals(400, number(run, "kept:"), run::toString);
        assertEquals(0, number(run, "freed:"), run::toString);
        long collections = number(run, "collections:");
        assertTrue(collections >= 3 && collections <= 12, () -> collections + " collections: " + run);
    }

    /**
     * "No Rust backtrace is printed to stderr by default for errors that reach the caller": a
     * panic reaches Java as an INTERNAL exception carrying the panic's message, and nothing is
     * printed, even with RUST_BACKTRACE set.
     */
    @Test
    void aPanicIsAnInternalExceptionAndPrintsNothing() throws Exception {
        Map<String, String> env = new HashMap<>();
        env.put("RUST_BACKTRACE", "1");
        env.put("KVSTORE_DEBUG", null);
        ChildJvm.Result run = ChildJvm.run(PanicProbe.class, List.of(), env, 120);
        assertEquals(0, run.exit, run::toString);
        assertTrue(run.out.contains("code: INTERNAL"), run::toString);
        assertTrue(run.out.contains("nDebugPanic was called"), () -> "the message is the panic's: " + run);
        assertTrue(run.out.contains("size after the panic: 2"), run::toString);
        assertEquals("", run.err, () -> "nothing on stderr: " + run);
    }

    /** KVSTORE_DEBUG brings Rust's own report of the panic back on stderr. */
    @Test
    void kvstoreDebugPrintsThePanicOnStderr() throws Exception {
        Map<String, String> env = new HashMap<>();
        env.put("RUST_BACKTRACE", null);
        env.put("KVSTORE_DEBUG", "1");
        ChildJvm.Result run = ChildJvm.run(PanicProbe.class, List.of(), env, 120);
        assertEquals(0, run.exit, run::toString);
        assertTrue(run.out.contains("code: INTERNAL"), run::toString);
        assertTrue(run.err.contains("panicked") && run.err.contains("nDebugPanic was called"), run::toString);
    }
}
