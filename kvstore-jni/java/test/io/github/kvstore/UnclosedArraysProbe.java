package io.github.kvstore;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * A tiny program that {@link ChildJvmTest} runs in a fresh JVM with a small heap: allocates
 * {@code args[0]} arrays of {@code args[1]} MiB each, filled (so that their pages are
 * touched), and closes none of them (with {@code args[2]} = {@code keep}, it also keeps them
 * all reachable); then prints how many it made, how many the Cleaner freed, how many
 * collections the native memory count asked for, and the process's peak resident size
 * ({@code VmHWM} of /proc/self/status).
 */
public final class UnclosedArraysProbe {
    private UnclosedArraysProbe() {}

    /**
     * Entry point.
     *
     * @param args the number of arrays, their size in MiB, and optionally {@code keep}
     * @throws IOException if /proc/self/status cannot be read
     */
    public static void main(String[] args) throws IOException {
        int count = Integer.parseInt(args[0]);
        int mib = Integer.parseInt(args[1]);
        boolean keep = args.length > 2 && args[2].equals("keep");
        int[] shape = {mib * 1024 * 1024 / Float.BYTES};
        List<NDArray> kept = new ArrayList<>();
        double sum = 0;
        long start = System.nanoTime();
        for (int i = 0; i < count; i++) {
            NDArray a = NDArray.full(shape, 1.0);
            sum += a.size();
            if (keep) {
                kept.add(a);
            }
        }
        long ms = (System.nanoTime() - start) / 1_000_000;
        System.out.println("allocated: " + count + " arrays, " + (long) sum + " elements in " + ms + " ms");
        System.out.println("freed: " + NDArray.freedCount());
        System.out.println("kept: " + kept.size());
        System.out.println("collections: " + NativeMemory.collections());
        for (String line : Files.readAllLines(Path.of("/proc/self/status"), StandardCharsets.UTF_8)) {
            if (line.startsWith("VmHWM:")) {
                // "VmHWM:    123456 kB"
                System.out.println("peak-rss-kb: " + line.replaceAll("[^0-9]", ""));
            }
        }
    }
}
