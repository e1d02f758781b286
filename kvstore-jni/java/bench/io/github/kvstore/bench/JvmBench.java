package io.github.kvstore.bench;

import io.github.kvstore.Context;
import io.github.kvstore.DType;
import io.github.kvstore.KVStore;
import io.github.kvstore.NDArray;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.CompletableFuture;

/**
 * The Java rows of {@code make bench}: the same operations as the Rust report's, timed
 * from Java, written as JSON for the report to hold against the Rust rows of the same run.
 *
 * <p>Usage: {@code java -cp kvstore.jar:classes io.github.kvstore.bench.JvmBench OUT.json}.
 */
public final class JvmBench {
    private static final int BIG = 4 << 20;
    private static final int DEVICES = 4;

    private JvmBench() {}

    /** Median seconds per call of {@code body}, over {@code runs} timings of {@code reps} calls. */
    private static double medianPerCall(int runs, int reps, Runnable body) {
        for (int i = 0; i < reps; i++) {
            body.run(); // warm-up: lets the JIT compile the path
        }
        double[] t = new double[runs];
        for (int r = 0; r < runs; r++) {
            long start = System.nanoTime();
            for (int i = 0; i < reps; i++) {
                body.run();
            }
            t[r] = (System.nanoTime() - start) / 1e9 / reps;
        }
        Arrays.sort(t);
        return t[runs / 2];
    }

    private static String row(String name, double medianS) {
        return String.format(Locale.ROOT, "{\"name\": \"%s\", \"median_s\": %.9e}", name, medianS);
    }

    public static void main(String[] args) throws IOException {
        if (args.length != 1) {
            throw new IllegalArgumentException("usage: JvmBench OUT.json");
        }
        int runs = Integer.getInteger("kvstore.bench.runs", 21);
        List<String> rows = new ArrayList<>();
        try (KVStore kv = KVStore.create("local");
                NDArray small = NDArray.ones(1024);
                NDArray smallOut = NDArray.zeros(1024)) {
            kv.init("s", small);
            rows.add(row("java: push+pull 1 Ki f32", medianPerCall(runs, 20000, () -> {
                kv.push("s", small);
                kv.pull("s", smallOut);
            })));

            // The engine's cost from Java: an async().push submit against a blocking push, per
            // call, over 1000 calls on 1000 keys (the futures joined after, not timed).
            String[] keys = new String[1000];
            NDArray[] zeros = new NDArray[keys.length];
            for (int i = 0; i < keys.length; i++) {
                keys[i] = "e" + i;
                zeros[i] = NDArray.zeros(1024);
            }
            kv.init(keys, zeros);
            rows.add(row("java: blocking push of 1 Ki f32 (per call)", medianPerCall(runs, 1, () -> {
                for (String k : keys) {
                    kv.push(k, small);
                }
            }) / keys.length));
            List<CompletableFuture<Void>> futures = new ArrayList<>(keys.length);
            double[] submits = new double[runs];
            for (int r = -3; r < runs; r++) {
                futures.clear();
                long start = System.nanoTime();
                for (String k : keys) {
                    futures.add(kv.async().push(k, small));
                }
                double s = (System.nanoTime() - start) / 1e9 / keys.length;
                for (CompletableFuture<Void> f : futures) {
                    f.join();
                }
                if (r >= 0) {
                    submits[r] = s;
                }
            }
            Arrays.sort(submits);
            rows.add(row("java: async().push submit of 1 Ki f32 (per call)", submits[runs / 2]));
            for (NDArray z : zeros) {
                z.close();
            }

            NDArray[] vals = new NDArray[DEVICES];
            NDArray[] outs = new NDArray[DEVICES];
            for (int i = 0; i < DEVICES; i++) {
                vals[i] = NDArray.full(new int[] {BIG}, i, Context.cpu(i), DType.FLOAT32);
                outs[i] = NDArray.zeros(new int[] {BIG}, Context.cpu(i), DType.FLOAT32);
            }
            kv.init("big", vals[0]);
            rows.add(row("java: push 4 x 4 Mi f32", medianPerCall(runs, 3, () -> kv.push("big", vals))));
            rows.add(row("java: pull 4 Mi f32 into 4 outs", medianPerCall(runs, 3, () -> kv.pull("big", outs))));

            float[] data = new float[BIG];
            Arrays.fill(data, 1.5f);
            int[] shape = {BIG};
            rows.add(row("java: float[4 Mi] into an existing NDArray", medianPerCall(runs, 3, () -> outs[2].copyFrom(data))));
            float[] dst = new float[BIG];
            rows.add(row("java: NDArray of 4 Mi f32 into an existing float[]",
                    medianPerCall(runs, 3, () -> vals[1].toFloatArray(dst))));
            rows.add(row("java: float[4 Mi] into a new NDArray", medianPerCall(runs, 3, () -> {
                try (NDArray a = NDArray.array(data, shape)) {
                    if (a.size() != BIG) {
                        throw new AssertionError("size");
                    }
                }
            })));
            rows.add(row("java: NDArray of 4 Mi f32 to float[]", medianPerCall(runs, 3, () -> {
                if (vals[1].toFloatArray().length != BIG) {
                    throw new AssertionError("length");
                }
            })));
            for (int i = 0; i < DEVICES; i++) {
                vals[i].close();
                outs[i].close();
            }
        }
        Files.writeString(Path.of(args[0]), "[\n" + String.join(",\n", rows) + "\n]\n", StandardCharsets.UTF_8);
    }
}
