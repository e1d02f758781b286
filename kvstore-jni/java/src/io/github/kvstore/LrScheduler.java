package io.github.kvstore;

import java.util.Objects;

/**
 * A learning-rate schedule, as MXNet 1.9.1's {@code mxnet.lr_scheduler}: the rate of update
 * number {@code n} (counted over all keys, MXNet's {@code num_update}) for an
 * {@link Optimizer}. Immutable: the withers return a new schedule. It is checked when the
 * optimizer that uses it is built ({@link Optimizer.Builder#build()}), with a
 * {@link KVStoreException} of code {@code INVALID_ARGUMENT} naming the problem.
 *
 * <pre>{@code
 * Optimizer sgd = Optimizer.sgd()
 *         .learningRate(0.1)
 *         .lrScheduler(LrScheduler.factor(100, 0.5).stopFactorLr(1e-4).warmup(10, 0.01, true))
 *         .build();
 * }</pre>
 *
 * <p>Factor and multi-factor schedules start from the optimizer's learning rate (MXNet
 * replaces the scheduler's {@code base_lr} with it); poly and cosine schedules decay from
 * their own {@link #baseLr(double)} (default 0.01), which is also where a warm-up ends, as
 * in MXNet.
 *
 * <p>A null argument is a {@link NullPointerException} naming the parameter.
 */
public final class LrScheduler {
    private final String type;
    private final long step;
    private final long[] steps;
    private final double factor;
    private final long maxUpdate;
    private final double pwr;
    private final double finalLr;
    private final Double stopFactorLr;
    private final Double baseLr;
    private final Long warmupSteps;
    private final Double warmupBeginLr;
    private final Boolean warmupLinear;

    private LrScheduler(String type, long step, long[] steps, double factor, long maxUpdate, double pwr,
            double finalLr, Double stopFactorLr, Double baseLr, Long warmupSteps, Double warmupBeginLr,
            Boolean warmupLinear) {
        this.type = type;
        this.step = step;
        this.steps = steps;
        this.factor = factor;
        this.maxUpdate = maxUpdate;
        this.pwr = pwr;
        this.finalLr = finalLr;
        this.stopFactorLr = stopFactorLr;
        this.baseLr = baseLr;
        this.warmupSteps = warmupSteps;
        this.warmupBeginLr = warmupBeginLr;
        this.warmupLinear = warmupLinear;
    }

    /**
     * Multiplies the rate by {@code factor} every {@code step} updates, down to
     * {@link #stopFactorLr(double)} (default 1e-8): MXNet's {@code FactorScheduler}.
     *
     * @param step updates between two reductions, at least 1
     * @param factor the reduction, at most 1
     * @return the schedule
     */
    public static LrScheduler factor(long step, double factor) {
        return new LrScheduler("factor", step, null, factor, 0, 0, 0, null, null, null, null, null);
    }

    /**
     * Multiplies the rate by {@code factor} after each update count in {@code steps}:
     * MXNet's {@code MultiFactorScheduler}.
     *
     * @param steps increasing update counts, the first at least 1
     * @param factor the reduction, at most 1
     * @return the schedule
     * @throws NullPointerException if {@code steps} is null
     */
    public static LrScheduler multiFactor(long[] steps, double factor) {
        Objects.requireNonNull(steps, "steps");
        return new LrScheduler("multifactor", 0, steps.clone(), factor, 0, 0, 0, null, null, null, null, null);
    }

    /**
     * Polynomial decay from the base rate to {@code finalLr} at update {@code maxUpdate}:
     * MXNet's {@code PolyScheduler} (its default {@code pwr} is 2).
     *
     * @param maxUpdate the update at which the rate reaches {@code finalLr}, at least 1
     * @param pwr the power of the decay
     * @param finalLr the rate from {@code maxUpdate} on
     * @return the schedule
     */
    public static LrScheduler poly(long maxUpdate, double pwr, double finalLr) {
        return new LrScheduler("poly", 0, null, 0, maxUpdate, pwr, finalLr, null, null, null, null, null);
    }

    /**
     * Half-cosine decay from the base rate to {@code finalLr} at update
     * {@code maxUpdate}: MXNet's {@code CosineScheduler}.
     *
     * @param maxUpdate the update at which the rate reaches {@code finalLr}, at least 1
     * @param finalLr the rate from {@code maxUpdate} on
     * @return the schedule
     */
    public static LrScheduler cosine(long maxUpdate, double finalLr) {
        return new LrScheduler("cosine", 0, null, 0, maxUpdate, 0, finalLr, null, null, null, null, null);
    }

    /**
     * This schedule with the base rate {@code lr} (MXNet's {@code base_lr}, default 0.01):
     * where poly and cosine decay from and where a warm-up ends.
     *
     * @param lr the base rate
     * @return a new schedule
     */
    public LrScheduler baseLr(double lr) {
        return new LrScheduler(type, step, steps, factor, maxUpdate, pwr, finalLr, stopFactorLr, lr, warmupSteps,
                warmupBeginLr, warmupLinear);
    }

    /**
     * This factor schedule with the lowest rate {@code lr} (MXNet's {@code stop_factor_lr},
     * default 1e-8). Only factor schedules have one: on another, {@code build()} of the
     * optimizer is {@code INVALID_ARGUMENT}.
     *
     * @param lr the lowest rate
     * @return a new schedule
     */
    public LrScheduler stopFactorLr(double lr) {
        return new LrScheduler(type, step, steps, factor, maxUpdate, pwr, finalLr, lr, baseLr, warmupSteps,
                warmupBeginLr, warmupLinear);
    }

    /**
     * This schedule with a warm-up over the first {@code steps} updates, from
     * {@code beginLr} up to the base rate (linear) or at {@code beginLr} throughout
     * (constant). Set {@link #baseLr(double)} first if the base rate is not 0.01: the
     * warm-up must begin below it.
     *
     * @param steps the updates the warm-up lasts (for poly and cosine, fewer than
     *     {@code maxUpdate})
     * @param beginLr the rate at update 0
     * @param linear true for a linear rise, false for a constant rate
     * @return a new schedule
     */
    public LrScheduler warmup(long steps, double beginLr, boolean linear) {
        return new LrScheduler(type, step, this.steps, factor, maxUpdate, pwr, finalLr, stopFactorLr, baseLr, steps,
                beginLr, linear);
    }

    /**
     * The kind: {@code "factor"}, {@code "multifactor"}, {@code "poly"} or {@code "cosine"}.
     *
     * @return the kind
     */
    public String type() {
        return type;
    }

    /**
     * This schedule as the JSON object that {@link Optimizer#toJson()} embeds.
     *
     * @return the JSON text
     */
    public String toJson() {
        StringBuilder out = new StringBuilder();
        appendJson(out);
        return out.toString();
    }

    void appendJson(StringBuilder out) {
        out.append('{');
        Json.name(out, "type");
        Json.string(out, type);
        switch (type) {
            case "factor" -> {
                out.append(", \"step\": ").append(step).append(", \"factor\": ");
                Json.number(out, factor);
            }
            case "multifactor" -> {
                out.append(", \"steps\": [");
                for (int i = 0; i < steps.length; i++) {
                    out.append(i == 0 ? "" : ", ").append(steps[i]);
                }
                out.append("], \"factor\": ");
                Json.number(out, factor);
            }
            case "poly" -> {
                out.append(", \"max_update\": ").append(maxUpdate).append(", \"pwr\": ");
                Json.number(out, pwr);
                out.append(", \"final_lr\": ");
                Json.number(out, finalLr);
            }
            default -> {
                out.append(", \"max_update\": ").append(maxUpdate).append(", \"final_lr\": ");
                Json.number(out, finalLr);
            }
        }
        optional(out, "stop_factor_lr", stopFactorLr);
        optional(out, "base_lr", baseLr);
        if (warmupSteps != null) {
            out.append(", \"warmup_steps\": ").append(warmupSteps.longValue());
            optional(out, "warmup_begin_lr", warmupBeginLr);
            out.append(", \"warmup_mode\": ").append(warmupLinear ? "\"linear\"" : "\"constant\"");
        }
        out.append('}');
    }

    private static void optional(StringBuilder out, String name, Double value) {
        if (value != null) {
            out.append(", ");
            Json.name(out, name);
            Json.number(out, value);
        }
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof LrScheduler other && toJson().equals(other.toJson());
    }

    @Override
    public int hashCode() {
        return toJson().hashCode();
    }

    @Override
    public String toString() {
        return "LrScheduler" + toJson();
    }
}
