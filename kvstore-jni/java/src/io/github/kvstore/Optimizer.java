package io.github.kvstore;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;

/**
 * An optimizer for {@link KVStore#setOptimizer(Optimizer)}: once installed, each push of
 * gradients to a key updates the key's weight in place with MXNet 1.9.1's rule for this
 * optimizer (Python's rules and defaults, including {@code rescale_grad},
 * {@code clip_gradient}, {@code wd}, per-key {@code lr_mult} / {@code wd_mult} and a
 * learning-rate schedule). The per-key state (momentum, moments, ...) lives in the store,
 * next to the key, and is saved and loaded with
 * {@link KVStore#saveOptimizerStates(String)} / {@link KVStore#loadOptimizerStates(String)}.
 *
 * <pre>{@code
 * Optimizer sgd = Optimizer.sgd().learningRate(0.1).momentum(0.9).build();
 * kv.init("w", weights).setOptimizer(sgd);
 * kv.push("w", gradients).pull("w", weights);   // weights updated by SGD with momentum
 * }</pre>
 *
 * <p>An optimizer is a value: its name and hyper-parameters (immutable, holding no native
 * memory). One static factory per optimizer returns a builder with typed setters for the
 * options every optimizer has and for that optimizer's own; {@link Builder#param(String,
 * double)} sets any hyper-parameter by its MXNet name. Unset options keep MXNet's
 * defaults. {@link Builder#build()} checks the whole description in the native library,
 * so a bad name or value fails there, with the library's message.
 *
 * <p>A null argument is a {@link NullPointerException} naming the parameter, except for
 * {@link Builder#lrScheduler(LrScheduler)}, where {@code null} means no schedule.
 */
public final class Optimizer {
    static {
        NativeLibrary.load();
    }

    private final String name;
    private final Map<String, Double> params;
    private final LrScheduler scheduler;
    private final Map<String, Double> lrMult;
    private final Map<String, Double> wdMult;
    private final String json;

    private Optimizer(Builder<?> b) {
        this.name = b.name;
        this.params = Collections.unmodifiableMap(new LinkedHashMap<>(b.params));
        this.scheduler = b.scheduler;
        this.lrMult = Collections.unmodifiableMap(new LinkedHashMap<>(b.lrMult));
        this.wdMult = Collections.unmodifiableMap(new LinkedHashMap<>(b.wdMult));
        this.json = json(name, params, scheduler, lrMult, wdMult);
    }

    private static String json(String name, Map<String, Double> params, LrScheduler scheduler,
            Map<String, Double> lrMult, Map<String, Double> wdMult) {
        StringBuilder out = new StringBuilder("{");
        Json.name(out, "name");
        Json.string(out, name);
        out.append(", ");
        Json.name(out, "params");
        Json.numbers(out, params);
        out.append(", ");
        Json.name(out, "scheduler");
        if (scheduler == null) {
            out.append("null");
        } else {
            scheduler.appendJson(out);
        }
        out.append(", ");
        Json.name(out, "lr_mult");
        Json.numbers(out, lrMult);
        out.append(", ");
        Json.name(out, "wd_mult");
        Json.numbers(out, wdMult);
        return out.append('}').toString();
    }

    // ----- one factory per optimizer -----

    /**
     * A builder for the optimizer named {@code name} (MXNet's registry name, for example
     * {@code "sgd"} or {@code "adam"}; case-insensitive), with hyper-parameters set by
     * {@link Builder#param(String, double)}.
     *
     * @param name the optimizer's name
     * @return the builder
     * @throws NullPointerException if {@code name} is null
     */
    public static Named builder(String name) {
        return new Named(Objects.requireNonNull(name, "name"));
    }

    /**
     * SGD (MXNet {@code sgd}): learning rate 0.01, no momentum.
     *
     * @return the builder
     */
    public static Sgd sgd() {
        return new Sgd();
    }

    /**
     * SGD with Nesterov momentum (MXNet {@code nag}): learning rate 0.01, momentum 0.
     *
     * @return the builder
     */
    public static Nag nag() {
        return new Nag();
    }

    /**
     * Adam (MXNet {@code adam}): learning rate 0.001, beta1 0.9, beta2 0.999, epsilon 1e-8.
     *
     * @return the builder
     */
    public static Adam adam() {
        return new Adam();
    }

    /**
     * AdaGrad (MXNet {@code adagrad}): learning rate 0.01, epsilon 1e-7.
     *
     * @return the builder
     */
    public static AdaGrad adaGrad() {
        return new AdaGrad();
    }

    /**
     * RMSProp (MXNet {@code rmsprop}): learning rate 0.001, gamma1 0.9, gamma2 0.9, epsilon
     * 1e-8, not centered.
     *
     * @return the builder
     */
    public static RmsProp rmsProp() {
        return new RmsProp();
    }

    /**
     * AdaDelta (MXNet {@code adadelta}): rho 0.9, epsilon 1e-5; the learning rate is unused.
     *
     * @return the builder
     */
    public static AdaDelta adaDelta() {
        return new AdaDelta();
    }

    /**
     * FTRL (MXNet {@code ftrl}): learning rate 0.1, lamda1 0.01, beta 1.
     *
     * @return the builder
     */
    public static Ftrl ftrl() {
        return new Ftrl();
    }

    /**
     * Signum (MXNet {@code signum}): learning rate 0.01, momentum 0.9, wd_lh 0.
     *
     * @return the builder
     */
    public static Signum signum() {
        return new Signum();
    }

    /**
     * Stochastic gradient Langevin dynamics (MXNet {@code sgld}): learning rate 0.01.
     *
     * @return the builder
     */
    public static Sgld sgld() {
        return new Sgld();
    }

    /**
     * Delay-compensated asynchronous SGD (MXNet {@code dcasgd}): learning rate 0.01,
     * momentum 0, lamda 0.04.
     *
     * @return the builder
     */
    public static Dcasgd dcasgd() {
        return new Dcasgd();
    }

    /**
     * Adamax (MXNet {@code adamax}): learning rate 0.002, beta1 0.9, beta2 0.999.
     *
     * @return the builder
     */
    public static Adamax adamax() {
        return new Adamax();
    }

    /**
     * LBSGD, large-batch SGD (MXNet {@code lbsgd}): learning rate 0.01, momentum 0, warm-up
     * strategy {@code linear} over 5 epochs of 32 updates, batch scale 1. Each key's
     * gradients are summed over {@code batchScale} pushes; the push that completes a batch
     * updates the weight with their mean, the rate scaled by the warm-up multiplier (or,
     * for {@code lars}, the key's trust ratio).
     *
     * @return the builder
     */
    public static Lbsgd lbsgd() {
        return new Lbsgd();
    }

    /**
     * FTML, Follow the Moving Leader (MXNet {@code ftml}): learning rate 0.01, beta1 0.6,
     * beta2 0.999, epsilon 1e-8.
     *
     * @return the builder
     */
    public static Ftml ftml() {
        return new Ftml();
    }

    /**
     * Nadam (MXNet {@code nadam}): learning rate 0.001, beta1 0.9, beta2 0.999, epsilon
     * 1e-8, schedule decay 0.004.
     *
     * @return the builder
     */
    public static Nadam nadam() {
        return new Nadam();
    }

    /**
     * LAMB (MXNet {@code lamb}): learning rate 0.001, beta1 0.9, beta2 0.999, epsilon 1e-6,
     * no bounds, bias correction on.
     *
     * @return the builder
     */
    public static Lamb lamb() {
        return new Lamb();
    }

    /**
     * LARS (MXNet {@code lars}): learning rate 0.1, momentum 0, eta 0.001, epsilon 0,
     * momentum correction on.
     *
     * @return the builder
     */
    public static Lars lars() {
        return new Lars();
    }

    // ----- the value -----

    /**
     * The name the optimizer was built with (see {@link KVStore#optimizerName()} for the
     * canonical name once installed).
     *
     * @return the name
     */
    public String name() {
        return name;
    }

    /**
     * The hyper-parameters that were set, by MXNet name (booleans as 1 or 0); the others
     * keep MXNet's defaults.
     *
     * @return an unmodifiable map, in the order they were first set
     */
    public Map<String, Double> params() {
        return params;
    }

    /**
     * The learning-rate schedule, if any.
     *
     * @return the schedule
     */
    public Optional<LrScheduler> lrScheduler() {
        return Optional.ofNullable(scheduler);
    }

    /**
     * The per-key learning-rate multipliers.
     *
     * @return an unmodifiable map
     */
    public Map<String, Double> lrMult() {
        return lrMult;
    }

    /**
     * The per-key weight-decay multipliers.
     *
     * @return an unmodifiable map
     */
    public Map<String, Double> wdMult() {
        return wdMult;
    }

    /**
     * This optimizer as the JSON that the native library reads: {@code {"name": "sgd",
     * "params": {"learning_rate": 0.1}, "scheduler": null, "lr_mult": {}, "wd_mult": {}}}
     * (format in {@code kvstore-core/src/optimizer/spec.rs}).
     *
     * @return the JSON text
     */
    public String toJson() {
        return json;
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof Optimizer other && json.equals(other.json);
    }

    @Override
    public int hashCode() {
        return json.hashCode();
    }

    @Override
    public String toString() {
        return "Optimizer" + json;
    }

    // ----- builders -----

    /**
     * The options every optimizer has. {@code B} is the concrete builder, so that chained
     * calls keep the optimizer's own setters in reach. Not thread-safe; each
     * {@link #build()} takes a snapshot.
     *
     * @param <B> the concrete builder
     */
    public abstract static class Builder<B extends Builder<B>> {
        private final String name;
        private final Map<String, Double> params = new LinkedHashMap<>();
        private LrScheduler scheduler;
        private final Map<String, Double> lrMult = new LinkedHashMap<>();
        private final Map<String, Double> wdMult = new LinkedHashMap<>();

        Builder(String name) {
            this.name = name;
        }

        /**
         * This builder, as its concrete type.
         *
         * @return this builder
         */
        protected abstract B self();

        /**
         * Sets a hyper-parameter by its MXNet name ({@code "learning_rate"},
         * {@code "momentum"}, {@code "beta1"}, ...; booleans are 1 or 0). A name this
         * optimizer lacks, or a value out of range, fails at {@link #build()}.
         *
         * @param mxnetName the name
         * @param value the value
         * @return this builder
         * @throws NullPointerException if {@code mxnetName} is null
         */
        public B param(String mxnetName, double value) {
            params.put(Objects.requireNonNull(mxnetName, "mxnetName"), value);
            return self();
        }

        B flag(String mxnetName, boolean value) {
            return param(mxnetName, value ? 1 : 0);
        }

        /**
         * The learning rate (MXNet {@code learning_rate}; its default depends on the
         * optimizer).
         *
         * @param lr the rate, any finite number: as in MXNet, a negative rate is gradient
         *     ascent (SGD with {@code -1} and no weight decay adds each push to the weight)
         * @return this builder
         */
        public B learningRate(double lr) {
            return param("learning_rate", lr);
        }

        /**
         * The weight decay (L2 penalty; MXNet {@code wd}, default 0).
         *
         * @param wd the weight decay
         * @return this builder
         */
        public B wd(double wd) {
            return param("wd", wd);
        }

        /**
         * The factor every gradient is multiplied by first (MXNet {@code rescale_grad},
         * default 1; typically 1 / batch size).
         *
         * @param rescale the factor
         * @return this builder
         */
        public B rescaleGrad(double rescale) {
            return param("rescale_grad", rescale);
        }

        /**
         * Clips rescaled gradients to {@code [-clip, clip]} (MXNet {@code clip_gradient},
         * default: no clipping).
         *
         * @param clip the bound (MXNet's rules for a bound of 0 or less apply)
         * @return this builder
         */
        public B clipGradient(double clip) {
            return param("clip_gradient", clip);
        }

        /**
         * Whether float16 and bfloat16 weights are updated through a float32 master copy
         * (MXNet {@code multi_precision}, default false).
         *
         * @param on whether to keep a master copy
         * @return this builder
         */
        public B multiPrecision(boolean on) {
            return flag("multi_precision", on);
        }

        /**
         * The update count to start from (MXNet {@code begin_num_update}, default 0).
         *
         * @param n the count, a whole number from 0 to 2^53 (larger counts would wrap;
         *     {@link #build()} rejects them with {@code INVALID_ARGUMENT})
         * @return this builder
         */
        public B beginNumUpdate(long n) {
            return param("begin_num_update", n);
        }

        /**
         * The learning-rate schedule ({@code null}: none).
         *
         * @param schedule the schedule
         * @return this builder
         */
        public B lrScheduler(LrScheduler schedule) {
            this.scheduler = schedule;
            return self();
        }

        /**
         * Multiplies the learning rate of {@code key} by {@code mult}.
         *
         * @param key the key
         * @param mult the multiplier
         * @return this builder
         * @throws NullPointerException if {@code key} is null
         */
        public B lrMult(String key, double mult) {
            lrMult.put(Objects.requireNonNull(key, "key"), mult);
            return self();
        }

        /**
         * Multiplies the weight decay of {@code key} by {@code mult}.
         *
         * @param key the key
         * @param mult the multiplier
         * @return this builder
         * @throws NullPointerException if {@code key} is null
         */
        public B wdMult(String key, double mult) {
            wdMult.put(Objects.requireNonNull(key, "key"), mult);
            return self();
        }

        /**
         * The optimizer, checked whole by the native library.
         *
         * @return the optimizer
         * @throws KVStoreException {@code INVALID_ARGUMENT} for an unknown optimizer or
         *     hyper-parameter name, a value out of range or not finite, or a bad schedule
         *     (the message says which); {@code UNSUPPORTED} for an optimizer whose update
         *     rule this build of the library lacks
         */
        public Optimizer build() {
            Optimizer o = new Optimizer(this);
            nValidate(o.json);
            return o;
        }
    }

    /** A builder for an optimizer chosen by name; see {@link Optimizer#builder(String)}. */
    public static final class Named extends Builder<Named> {
        Named(String name) {
            super(name);
        }

        @Override
        protected Named self() {
            return this;
        }
    }

    /** Builds {@code sgd}; see {@link Optimizer#sgd()}. */
    public static final class Sgd extends Builder<Sgd> {
        Sgd() {
            super("sgd");
        }

        @Override
        protected Sgd self() {
            return this;
        }

        /**
         * The momentum (default 0: plain SGD).
         *
         * @param momentum in [0, 1)
         * @return this builder
         */
        public Sgd momentum(double momentum) {
            return param("momentum", momentum);
        }

        /**
         * MXNet's {@code lazy_update} (default true; it matters only for row-sparse
         * gradients, which this library does not have).
         *
         * @param on the flag
         * @return this builder
         */
        public Sgd lazyUpdate(boolean on) {
            return flag("lazy_update", on);
        }
    }

    /** Builds {@code nag}; see {@link Optimizer#nag()}. */
    public static final class Nag extends Builder<Nag> {
        Nag() {
            super("nag");
        }

        @Override
        protected Nag self() {
            return this;
        }

        /**
         * The momentum (default 0).
         *
         * @param momentum in [0, 1)
         * @return this builder
         */
        public Nag momentum(double momentum) {
            return param("momentum", momentum);
        }
    }

    /** Builds {@code adam}; see {@link Optimizer#adam()}. */
    public static final class Adam extends Builder<Adam> {
        Adam() {
            super("adam");
        }

        @Override
        protected Adam self() {
            return this;
        }

        /**
         * Decay of the first moment (default 0.9).
         *
         * @param beta1 the decay
         * @return this builder
         */
        public Adam beta1(double beta1) {
            return param("beta1", beta1);
        }

        /**
         * Decay of the second moment (default 0.999).
         *
         * @param beta2 the decay
         * @return this builder
         */
        public Adam beta2(double beta2) {
            return param("beta2", beta2);
        }

        /**
         * Added to the root of the second moment (default 1e-8).
         *
         * @param epsilon the constant
         * @return this builder
         */
        public Adam epsilon(double epsilon) {
            return param("epsilon", epsilon);
        }

        /**
         * MXNet's {@code lazy_update} (default true; it matters only for row-sparse
         * gradients).
         *
         * @param on the flag
         * @return this builder
         */
        public Adam lazyUpdate(boolean on) {
            return flag("lazy_update", on);
        }
    }

    /** Builds {@code adagrad}; see {@link Optimizer#adaGrad()}. */
    public static final class AdaGrad extends Builder<AdaGrad> {
        AdaGrad() {
            super("adagrad");
        }

        @Override
        protected AdaGrad self() {
            return this;
        }

        /**
         * Added to the accumulated squares under the root (MXNet {@code eps}, default 1e-7).
         *
         * @param epsilon the constant
         * @return this builder
         */
        public AdaGrad epsilon(double epsilon) {
            return param("eps", epsilon);
        }
    }

    /** Builds {@code rmsprop}; see {@link Optimizer#rmsProp()}. */
    public static final class RmsProp extends Builder<RmsProp> {
        RmsProp() {
            super("rmsprop");
        }

        @Override
        protected RmsProp self() {
            return this;
        }

        /**
         * Decay of the moving averages (default 0.9).
         *
         * @param gamma1 the decay
         * @return this builder
         */
        public RmsProp gamma1(double gamma1) {
            return param("gamma1", gamma1);
        }

        /**
         * Momentum of the centered variant (default 0.9).
         *
         * @param gamma2 the momentum
         * @return this builder
         */
        public RmsProp gamma2(double gamma2) {
            return param("gamma2", gamma2);
        }

        /**
         * Added under the root (default 1e-8).
         *
         * @param epsilon the constant
         * @return this builder
         */
        public RmsProp epsilon(double epsilon) {
            return param("epsilon", epsilon);
        }

        /**
         * Whether to use Graves' centered variant (default false).
         *
         * @param on the flag
         * @return this builder
         */
        public RmsProp centered(boolean on) {
            return flag("centered", on);
        }

        /**
         * Clamps weights to {@code [-clip, clip]} after each update (default: no clamp).
         *
         * @param clip the bound
         * @return this builder
         */
        public RmsProp clipWeights(double clip) {
            return param("clip_weights", clip);
        }
    }

    /** Builds {@code adadelta}; see {@link Optimizer#adaDelta()}. */
    public static final class AdaDelta extends Builder<AdaDelta> {
        AdaDelta() {
            super("adadelta");
        }

        @Override
        protected AdaDelta self() {
            return this;
        }

        /**
         * Decay of both moving averages (default 0.9).
         *
         * @param rho the decay
         * @return this builder
         */
        public AdaDelta rho(double rho) {
            return param("rho", rho);
        }

        /**
         * Added under the roots (default 1e-5).
         *
         * @param epsilon the constant
         * @return this builder
         */
        public AdaDelta epsilon(double epsilon) {
            return param("epsilon", epsilon);
        }
    }

    /** Builds {@code ftrl}; see {@link Optimizer#ftrl()}. */
    public static final class Ftrl extends Builder<Ftrl> {
        Ftrl() {
            super("ftrl");
        }

        @Override
        protected Ftrl self() {
            return this;
        }

        /**
         * The L1 strength (MXNet {@code lamda1}, default 0.01).
         *
         * @param lamda1 the strength
         * @return this builder
         */
        public Ftrl lamda1(double lamda1) {
            return param("lamda1", lamda1);
        }

        /**
         * FTRL's beta (default 1).
         *
         * @param beta the constant
         * @return this builder
         */
        public Ftrl beta(double beta) {
            return param("beta", beta);
        }
    }

    /** Builds {@code signum}; see {@link Optimizer#signum()}. */
    public static final class Signum extends Builder<Signum> {
        Signum() {
            super("signum");
        }

        @Override
        protected Signum self() {
            return this;
        }

        /**
         * The momentum (default 0.9; 0 gives signSGD).
         *
         * @param momentum in [0, 1)
         * @return this builder
         */
        public Signum momentum(double momentum) {
            return param("momentum", momentum);
        }

        /**
         * The decoupled weight decay (MXNet {@code wd_lh}, default 0).
         *
         * @param wdLh the decay
         * @return this builder
         */
        public Signum wdLh(double wdLh) {
            return param("wd_lh", wdLh);
        }
    }

    /** Builds {@code sgld}; see {@link Optimizer#sgld()}. */
    public static final class Sgld extends Builder<Sgld> {
        Sgld() {
            super("sgld");
        }

        @Override
        protected Sgld self() {
            return this;
        }

        /**
         * The seed of the noise (default 0): the same seed gives the same updates.
         *
         * @param seed the seed, at most 2^53 in magnitude to be kept exactly
         * @return this builder
         */
        public Sgld seed(long seed) {
            return param("seed", seed);
        }
    }

    /** Builds {@code dcasgd}; see {@link Optimizer#dcasgd()}. */
    public static final class Dcasgd extends Builder<Dcasgd> {
        Dcasgd() {
            super("dcasgd");
        }

        @Override
        protected Dcasgd self() {
            return this;
        }

        /**
         * The momentum (default 0).
         *
         * @param momentum in [0, 1)
         * @return this builder
         */
        public Dcasgd momentum(double momentum) {
            return param("momentum", momentum);
        }

        /**
         * The delay-compensation strength (MXNet {@code lamda}, default 0.04).
         *
         * @param lamda the strength
         * @return this builder
         */
        public Dcasgd lamda(double lamda) {
            return param("lamda", lamda);
        }
    }

    /** Builds {@code adamax}; see {@link Optimizer#adamax()}. */
    public static final class Adamax extends Builder<Adamax> {
        Adamax() {
            super("adamax");
        }

        @Override
        protected Adamax self() {
            return this;
        }

        /**
         * Decay of the first moment (default 0.9).
         *
         * @param beta1 the decay
         * @return this builder
         */
        public Adamax beta1(double beta1) {
            return param("beta1", beta1);
        }

        /**
         * Decay of the infinity norm (default 0.999).
         *
         * @param beta2 the decay
         * @return this builder
         */
        public Adamax beta2(double beta2) {
            return param("beta2", beta2);
        }
    }

    /** Builds {@code lbsgd}; see {@link Optimizer#lbsgd()}. */
    public static final class Lbsgd extends Builder<Lbsgd> {
        /** MXNet's warm-up strategies, in the order of their codes in the store. */
        private static final List<String> STRATEGIES = List.of("linear", "power2", "sqrt", "lars");

        Lbsgd() {
            super("lbsgd");
        }

        @Override
        protected Lbsgd self() {
            return this;
        }

        /**
         * Momentum (default 0).
         *
         * @param momentum the momentum
         * @return this builder
         */
        public Lbsgd momentum(double momentum) {
            return param("momentum", momentum);
        }

        /**
         * How the rate grows during the warm-up: {@code linear} (the default),
         * {@code power2}, {@code sqrt}, or {@code lars} (each key's trust ratio instead); any
         * other name scales the rate by 1, as in MXNet. Stored as its code (0 to 4).
         *
         * @param strategy the strategy's name
         * @return this builder
         */
        public Lbsgd warmupStrategy(String strategy) {
            return param("warmup_strategy", warmupStrategyCode(strategy));
        }

        /**
         * The code the store gives a warm-up strategy's name (as
         * {@link #warmupStrategy(String)} sets it): 0 to 3 for {@code linear},
         * {@code power2}, {@code sqrt} and {@code lars}, 4 for any other name.
         *
         * @param strategy the strategy's name
         * @return its code
         */
        public static int warmupStrategyCode(String strategy) {
            int code = STRATEGIES.indexOf(Objects.requireNonNull(strategy, "strategy").toLowerCase(Locale.ROOT));
            return code < 0 ? STRATEGIES.size() : code;
        }

        /**
         * Epochs of warm-up (default 5).
         *
         * @param epochs the epochs
         * @return this builder
         */
        public Lbsgd warmupEpochs(int epochs) {
            return param("warmup_epochs", epochs);
        }

        /**
         * Pushes per large batch: the gradients summed before one update (default 1).
         *
         * @param scale the number of pushes, at least 1
         * @return this builder
         */
        public Lbsgd batchScale(int scale) {
            return param("batch_scale", scale);
        }

        /**
         * Updates per epoch, for the warm-up (default 32).
         *
         * @param updates the updates
         * @return this builder
         */
        public Lbsgd updatesPerEpoch(int updates) {
            return param("updates_per_epoch", updates);
        }

        /**
         * The epoch training starts at (default 0): the count of pushes starts at
         * {@code beginEpoch * updatesPerEpoch}.
         *
         * @param epoch the epoch
         * @return this builder
         */
        public Lbsgd beginEpoch(int epoch) {
            return param("begin_epoch", epoch);
        }
    }

    /** Builds {@code ftml}; see {@link Optimizer#ftml()}. */
    public static final class Ftml extends Builder<Ftml> {
        Ftml() {
            super("ftml");
        }

        @Override
        protected Ftml self() {
            return this;
        }

        /**
         * Decay of the gradient's running average (default 0.6).
         *
         * @param beta1 the decay
         * @return this builder
         */
        public Ftml beta1(double beta1) {
            return param("beta1", beta1);
        }

        /**
         * Decay of the squared gradient's running average (default 0.999).
         *
         * @param beta2 the decay
         * @return this builder
         */
        public Ftml beta2(double beta2) {
            return param("beta2", beta2);
        }

        /**
         * Added to the root of the second moment (default 1e-8).
         *
         * @param epsilon the constant
         * @return this builder
         */
        public Ftml epsilon(double epsilon) {
            return param("epsilon", epsilon);
        }
    }

    /** Builds {@code nadam}; see {@link Optimizer#nadam()}. */
    public static final class Nadam extends Builder<Nadam> {
        Nadam() {
            super("nadam");
        }

        @Override
        protected Nadam self() {
            return this;
        }

        /**
         * Decay of the first moment (default 0.9).
         *
         * @param beta1 the decay
         * @return this builder
         */
        public Nadam beta1(double beta1) {
            return param("beta1", beta1);
        }

        /**
         * Decay of the second moment (default 0.999).
         *
         * @param beta2 the decay
         * @return this builder
         */
        public Nadam beta2(double beta2) {
            return param("beta2", beta2);
        }

        /**
         * Added to the root of the second moment (default 1e-8).
         *
         * @param epsilon the constant
         * @return this builder
         */
        public Nadam epsilon(double epsilon) {
            return param("epsilon", epsilon);
        }

        /**
         * The momentum schedule's decay (default 0.004).
         *
         * @param decay the decay
         * @return this builder
         */
        public Nadam scheduleDecay(double decay) {
            return param("schedule_decay", decay);
        }
    }

    /** Builds {@code lamb}; see {@link Optimizer#lamb()}. */
    public static final class Lamb extends Builder<Lamb> {
        Lamb() {
            super("lamb");
        }

        @Override
        protected Lamb self() {
            return this;
        }

        /**
         * Decay of the first moment (default 0.9).
         *
         * @param beta1 the decay
         * @return this builder
         */
        public Lamb beta1(double beta1) {
            return param("beta1", beta1);
        }

        /**
         * Decay of the second moment (default 0.999).
         *
         * @param beta2 the decay
         * @return this builder
         */
        public Lamb beta2(double beta2) {
            return param("beta2", beta2);
        }

        /**
         * Added to the root of the second moment (default 1e-6).
         *
         * @param epsilon the constant
         * @return this builder
         */
        public Lamb epsilon(double epsilon) {
            return param("epsilon", epsilon);
        }

        /**
         * The lowest the weight norm of the trust ratio may be (default: no bound).
         *
         * @param bound the bound
         * @return this builder
         */
        public Lamb lowerBound(double bound) {
            return param("lower_bound", bound);
        }

        /**
         * The highest the weight norm of the trust ratio may be (default: no bound).
         *
         * @param bound the bound
         * @return this builder
         */
        public Lamb upperBound(double bound) {
            return param("upper_bound", bound);
        }

        /**
         * Whether the moments are bias-corrected (default true).
         *
         * @param on the flag
         * @return this builder
         */
        public Lamb biasCorrection(boolean on) {
            return flag("bias_correction", on);
        }
    }

    /** Builds {@code lars}; see {@link Optimizer#lars()}. */
    public static final class Lars extends Builder<Lars> {
        Lars() {
            super("lars");
        }

        @Override
        protected Lars self() {
            return this;
        }

        /**
         * The momentum (default 0).
         *
         * @param momentum in [0, 1)
         * @return this builder
         */
        public Lars momentum(double momentum) {
            return param("momentum", momentum);
        }

        /**
         * The trust coefficient (default 0.001).
         *
         * @param eta the coefficient
         * @return this builder
         */
        public Lars eta(double eta) {
            return param("eta", eta);
        }

        /**
         * Added to the denominator of the trust ratio (default 0).
         *
         * @param epsilon the constant
         * @return this builder
         */
        public Lars epsilon(double epsilon) {
            return param("eps", epsilon);
        }

        /**
         * Whether momentum is corrected when the learning rate changes (default true).
         *
         * @param on the flag
         * @return this builder
         */
        public Lars momentumCorrection(boolean on) {
            return flag("momentum_correction", on);
        }
    }

    // ----- natives (kvstore-jni/src/optimizer.rs; contract in kvstore-jni/NATIVES.md) -----

    static native void nValidate(String json);

    /** Core's canonical JSON of the description {@code json} (read, not built); for tests. */
    static native String nCanonicalJson(String json);
}
