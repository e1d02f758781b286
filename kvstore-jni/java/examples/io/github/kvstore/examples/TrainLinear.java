package io.github.kvstore.examples;

import io.github.kvstore.Context;
import io.github.kvstore.DType;
import io.github.kvstore.KVStore;
import io.github.kvstore.KVStoreException;
import io.github.kvstore.NDArray;
import io.github.kvstore.Optimizer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

/**
 * The store from Java, end to end: first {@code init}, {@code push} and {@code pull} of one
 * key (and what a {@link KVStoreException} looks like), then data-parallel training of a
 * linear regression with SGD with momentum over two workers on {@code cpu(0)} and
 * {@code cpu(1)} (the same demo in Clojure is {@code clojure/examples/train_linear.clj}).
 *
 * <p>Each step, every worker computes the gradient of the squared error on its half of a
 * minibatch, from its own copy of the weights; both gradients are pushed to one key (the
 * store sums them), the store's optimizer updates the weights (rescale-grad 1 / batch size
 * turns the sum into the mean), and every worker pulls the new weights back. The program
 * checks its own result and ends with one line, {@code TrainLinear: ok (...)} with exit
 * status 0, or {@code TrainLinear: FAILED (...)} with exit status 1.
 *
 * <pre>
 * javac --release 17 -cp target/kvstore.jar -d target/examples \
 *     kvstore-jni/java/examples/io/github/kvstore/examples/TrainLinear.java
 * java -cp target/kvstore.jar:target/examples io.github.kvstore.examples.TrainLinear
 * </pre>
 */
public final class TrainLinear {
    private static final int FEATURES = 8;
    /** The weights and the bias, in one key. */
    private static final int PARAMS = FEATURES + 1;
    private static final int SAMPLES = 1024;
    private static final int BATCH = 64;
    private static final int EPOCHS = 12;
    private static final int WORKERS = 2;
    private static final double NOISE_SD = 0.1;
    /** The loss the training must get below: the noise floor is NOISE_SD^2 = 0.01. */
    private static final double MAX_LOSS = 0.015;
    /** How far a learned parameter may be from the true one. */
    private static final double TOLERANCE = 0.05;

    /** The samples, one row of FEATURES values each, and their targets. */
    private final double[][] x = new double[SAMPLES][FEATURES];
    private final double[] y = new double[SAMPLES];
    /** The weights the data were made with, then the bias. */
    private final double[] truth = new double[PARAMS];

    private TrainLinear(long seed) {
        Random random = new Random(seed);
        for (int j = 0; j < FEATURES; j++) {
            truth[j] = 0.5 * (j + 1) * (j % 2 == 0 ? 1 : -1);
        }
        truth[FEATURES] = 0.7;
        for (int i = 0; i < SAMPLES; i++) {
            for (int j = 0; j < FEATURES; j++) {
                x[i][j] = 2 * random.nextDouble() - 1;
            }
            y[i] = predict(truth, i) + NOISE_SD * random.nextGaussian();
        }
    }

    private double predict(double[] params, int i) {
        double p = params[FEATURES];
        for (int j = 0; j < FEATURES; j++) {
            p += params[j] * x[i][j];
        }
        return p;
    }

    /** The mean squared error over every sample. */
    private double loss(double[] params) {
        double sum = 0;
        for (int i = 0; i < SAMPLES; i++) {
            double e = predict(params, i) - y[i];
            sum += e * e;
        }
        return sum / SAMPLES;
    }

    /** The gradient of the summed squared error over samples [from, to). */
    private float[] gradient(double[] params, int from, int to) {
        double[] g = new double[PARAMS];
        for (int i = from; i < to; i++) {
            double e = 2 * (predict(params, i) - y[i]);
            for (int j = 0; j < FEATURES; j++) {
                g[j] += e * x[i][j];
            }
            g[FEATURES] += e;
        }
        float[] out = new float[PARAMS];
        for (int j = 0; j < PARAMS; j++) {
            out[j] = (float) g[j];
        }
        return out;
    }

    private static double[] doubles(NDArray a) {
        return a.toDoubleArray();
    }

    /**
     * One key through the store: init, push, pull into an array and into a new one, and
     * two errors, caught as a caller would. Returns what went wrong, or null.
     */
    private static String basics() {
        try (KVStore kv = KVStore.create("local");
                NDArray ones = NDArray.ones(2, 3);
                NDArray four = ones.mul(4);
                NDArray out = NDArray.zeros(2, 3)) {
            kv.init("3", ones).pull("3", out);
            System.out.println("init 3 with ones, pull:      " + Arrays.toString(out.toFloatArray()));
            // With no updater or optimizer, the pushed sum replaces the value.
            kv.push("3", new NDArray[] {four, ones}).pull("3", out);
            System.out.println("push 4 + 1 to 3, pull:       " + Arrays.toString(out.toFloatArray()));
            try (NDArray value = kv.pull("3")) {
                System.out.println("pull 3 into a new array:     " + Arrays.toString(value.shape()) + " "
                        + value.dtype().mxnetName() + " " + Arrays.toString(value.toFloatArray()));
                if (!Arrays.equals(value.toFloatArray(), new float[] {5, 5, 5, 5, 5, 5})) {
                    return "pull of key 3 gave " + Arrays.toString(value.toFloatArray()) + ", not 5s";
                }
            }
            System.out.println("the store:                   " + kv);

            // Errors of the store are KVStoreExceptions: switch on the code, not the message.
            try (NDArray wrong = NDArray.ones(3, 2)) {
                kv.push("3", wrong);
                return "a push of the wrong shape was accepted";
            } catch (KVStoreException e) {
                if (e.code() != KVStoreException.Code.SHAPE_MISMATCH) {
                    throw e;
                }
                System.out.println("caught " + e.code() + ": " + e.getMessage());
            }
            try (NDArray missing = kv.pull("9")) {
                return "a pull of a key never initialised gave " + missing;
            } catch (KVStoreException e) {
                if (e.code() != KVStoreException.Code.KEY_NOT_INITIALIZED) {
                    throw e;
                }
                System.out.println("caught " + e.code() + ": " + e.getMessage());
            }
        }
        return null;
    }

    /**
     * Trains the regression through a store and prints its progress. Returns the verdict:
     * {@code ok (...)} or {@code FAILED (...)}.
     */
    private String train() throws InterruptedException, ExecutionException {
        Context[] devices = new Context[WORKERS];
        NDArray[] weights = new NDArray[WORKERS];
        ExecutorService pool = Executors.newFixedThreadPool(WORKERS);
        try (KVStore kv = KVStore.create("local");
                NDArray init = NDArray.zeros(new int[] {PARAMS}, Context.cpu(), DType.FLOAT32)) {
            for (int k = 0; k < WORKERS; k++) {
                devices[k] = Context.cpu(k);
                weights[k] = NDArray.zeros(new int[] {PARAMS}, devices[k], DType.FLOAT32);
            }
            Optimizer sgd = Optimizer.sgd().learningRate(0.05).momentum(0.9).rescaleGrad(1.0 / BATCH).build();
            kv.init("w", init).setOptimizer(sgd);
            System.out.printf("linear regression: %d samples, %d features, noise sd %s (loss floor %.4f);"
                    + " %d workers on cpu(0..%d)%n", SAMPLES, FEATURES, NOISE_SD, NOISE_SD * NOISE_SD, WORKERS,
                    WORKERS - 1);
            System.out.println("optimizer: " + kv.optimizerName() + ", learning rate 0.05, momentum 0.9,"
                    + " rescale-grad 1/" + BATCH);

            double first = loss(doubles(weights[0]));
            System.out.printf("epoch %2d  loss %.6f%n", 0, first);
            int share = BATCH / WORKERS;
            double last = first;
            for (int epoch = 1; epoch <= EPOCHS; epoch++) {
                for (int start = 0; start < SAMPLES; start += BATCH) {
                    // Each worker computes its gradient on its own thread, from its own weights.
                    List<Future<NDArray>> pending = new ArrayList<>();
                    for (int k = 0; k < WORKERS; k++) {
                        int worker = k;
                        int from = start + k * share;
                        pending.add(pool.submit(() -> NDArray.array(gradient(doubles(weights[worker]), from,
                                from + share), new int[] {PARAMS}, devices[worker], DType.FLOAT32)));
                    }
                    NDArray[] grads = new NDArray[WORKERS];
                    try {
                        for (int k = 0; k < WORKERS; k++) {
                            grads[k] = pending.get(k).get();
                        }
                        // One key, one gradient per worker: summed, then the optimizer's step.
                        kv.push("w", grads).pull("w", weights);
                    } finally {
                        for (NDArray g : grads) {
                            if (g != null) {
                                g.close();
                            }
                        }
                    }
                }
                last = loss(doubles(weights[0]));
                System.out.printf("epoch %2d  loss %.6f%n", epoch, last);
            }

            double[] learned = doubles(weights[0]);
            double worst = 0;
            for (int j = 0; j < PARAMS; j++) {
                System.out.printf("%-5s %9.4f %9.4f%n", j < FEATURES ? "w[" + j + "]" : "b", learned[j], truth[j]);
                worst = Math.max(worst, Math.abs(learned[j] - truth[j]));
            }
            if (!Arrays.equals(weights[0].toFloatArray(), weights[1].toFloatArray())) {
                return "FAILED (the workers' weights differ after the last pull)";
            }
            if (!(last < first) || !(last < MAX_LOSS)) {
                return String.format("FAILED (the loss went from %.6f to %.6f, not below %s)", first, last,
                        MAX_LOSS);
            }
            if (!(worst <= TOLERANCE)) {
                return String.format("FAILED (a learned parameter is %.4f from the true one, tolerance %s)", worst,
                        TOLERANCE);
            }
            return String.format("ok (loss %.6f -> %.6f < %s, parameters within %.4f <= %s of the true ones)",
                    first, last, MAX_LOSS, worst, TOLERANCE);
        } finally {
            pool.shutdown();
            for (NDArray w : weights) {
                if (w != null) {
                    w.close();
                }
            }
        }
    }

    /**
     * Runs the example; exits with status 1 if a check failed.
     *
     * @param args none
     * @throws Exception if the example cannot run at all
     */
    public static void main(String[] args) throws Exception {
        System.out.println("kvstore " + KVStore.version());
        String verdict;
        try {
            String wrong = basics();
            verdict = wrong != null ? "FAILED (" + wrong + ")" : new TrainLinear(42).train();
        } catch (KVStoreException e) {
            // An error the example did not expect: say which, and fail.
            verdict = "FAILED (" + e.code() + ": " + e.getMessage() + ")";
        }
        System.out.println("TrainLinear: " + verdict);
        System.exit(verdict.startsWith("ok") ? 0 : 1);
    }
}
