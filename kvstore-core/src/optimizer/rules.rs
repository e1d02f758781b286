//! Update rules, one per optimizer, following MXNet 1.9.1's Python optimizers and their
//! fused kernels (`python/mxnet/optimizer/optimizer.py`, `src/operator/optimizer_op-inl.h`,
//! `src/operator/contrib/{multi_lamb,multi_lars,multi_sum_sq,preloaded_multi_sgd}*`).
//! Each rule works on whole arrays of f32 (f32, f16 and bf16 weights) or f64.
//!
//! The order of floating-point operations is MXNet's, operation by operation, so that
//! f32 results match MXNet's to the last bit or two. Two kinds of MXNet code differ in
//! how they see a hyper-parameter, and the rules say which one they follow:
//! * a fused kernel (`adam_update`, `multi_sgd_update`, ...) gets it as a `float` field
//!   of the op's parameters, cast to the weight's type ([`kp`]); it clips only when the
//!   Python passed `clip_gradient`, which it does only when it is truthy (0 is off);
//! * Python NDArray arithmetic (AdaGrad, AdaDelta, SGLD, DCASGD, Adamax, Nadam) casts a
//!   Python float to the array's type ([`sc`]) and clips whenever `clip_gradient is not
//!   None`, so 0 clips every gradient to 0.
//!
//! Not reproduced: MXNet reads those Python floats with dmlc's string-to-double parser,
//! which is an ulp off for about one value in ten; in f32 that vanishes in the cast,
//! in f64 it leaves differences of about 1e-16 (Nadam, AdaGrad, ... on f64 weights).

use num_traits::Float;

use crate::device::{FusedRule, FusedStep};
use crate::error::{Error, Result};

/// What one update of one key needs besides the arrays.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Step<'a> {
    /// Learning rate for this key and step (scheduler, then lr_mult).
    pub lr: f64,
    /// The schedule's rate before `lr_mult` (LARS tracks its changes).
    pub base_lr: f64,
    /// The key (LARS skips its trust ratio for keys ending in gamma, beta or bias).
    pub key: &'a str,
    /// Weight decay for this key (wd, then wd_mult).
    pub wd: f64,
    /// `rescale_grad`.
    pub rescale: f64,
    /// `clip_gradient`, when set.
    pub clip: Option<f64>,
    /// This key's update count, counted from 1 (MXNet's `t`).
    pub t: u64,
    /// A seed for rules that draw random numbers (SGLD): fixed per key and step.
    pub seed: u64,
    /// The place in the key of the first element updated: 0 for the whole key, the
    /// part's start for a part of it (the random numbers of an element depend on its
    /// place in the key, not in the part).
    pub offset: usize,
}

impl Step<'_> {
    /// The clip bound of a fused kernel: the Python passes `clip_gradient` only when it
    /// is truthy and the kernel clips only when it is not negative, so 0 means no
    /// clipping.
    fn kernel_clip<R: Float>(&self) -> Option<R> {
        self.clip.filter(|&c| c > 0.0).map(kp)
    }

    /// The clip bound of Python NDArray code (`if self.clip_gradient is not None`):
    /// 0 clips to 0. `mx.nd.clip` takes its bounds as `float`.
    fn nd_clip<R: Float>(&self) -> Option<R> {
        self.clip.map(kp)
    }

    /// A value as the rule's float type.
    #[inline(always)]
    pub fn r<R: Float>(v: f64) -> R {
        R::from(v).unwrap_or_else(R::nan)
    }
}

/// A hyper-parameter as a fused kernel sees it: a `float` parameter, cast to the
/// weight's type (for f64 weights the value is rounded to f32 first, as in MXNet).
#[inline(always)]
fn kp<R: Float>(v: f64) -> R {
    R::from(v as f32).unwrap_or_else(R::nan)
}

/// A Python float used as the scalar of NDArray arithmetic (`_mul_scalar`, ...): cast
/// from double to the array's type.
#[inline(always)]
fn sc<R: Float>(v: f64) -> R {
    Step::r(v)
}

/// `x` clipped to `[-c, c]` when `c` is set (mshadow's `clip::Map`, and `mx.nd.clip`).
#[inline(always)]
fn clip<R: Float>(x: R, c: Option<R>) -> R {
    match c {
        Some(c) if x > c => c,
        Some(c) if x < -c => -c,
        _ => x,
    }
}

/// mshadow's `sign::Map`: -1, 0 or 1.
#[inline(always)]
fn sign<R: Float>(x: R) -> R {
    if x < R::zero() {
        -R::one()
    } else if x > R::zero() {
        R::one()
    } else {
        R::zero()
    }
}

/// `pow` as Python's `float ** int` and `math.pow` compute it (C's `pow` on doubles).
#[inline(always)]
fn powt(base: f64, t: u64) -> f64 {
    base.powf(t as f64)
}

/// The sum of squares of `v`, accumulated in order in f32 (`multi_sum_sq` on the CPU).
fn sum_sq<R: Float>(v: &[R]) -> f32 {
    v.iter().fold(0.0f32, |acc, &x| {
        let x = x.to_f32().unwrap_or(f32::NAN);
        acc + x * x
    })
}

/// An update rule: the per-key state arrays it keeps and how it updates a weight.
pub(crate) trait Rule: Send + Sync {
    /// Names of the per-key state arrays, in order (they name tensors in state files).
    fn states(&self) -> &'static [&'static str];

    /// Whether state `i` starts as a copy of the weight (otherwise zeros).
    fn state_starts_as_weight(&self, _i: usize) -> bool {
        false
    }

    /// Values shared by all keys (Nadam's momentum schedule), saved with the states.
    fn global_init(&self) -> Vec<f64> {
        Vec::new()
    }

    /// Advances the values shared by all keys for one update of one key, before the
    /// update runs: once per update of a key, whatever parts of the key it runs on (a
    /// `dist_sync` rank that owns part of a key, or none of it, advances them alike).
    fn advance(&self, s: &Step, global: &mut [f64]) {
        let _ = (s, global);
    }

    /// Whether MXNet reads the learning rate before it counts the update (LBSGD): a
    /// schedule then sees `num_update` as it was before this update.
    fn lr_before_count(&self) -> bool {
        false
    }

    /// Updates `w` with gradient `g` in f32.
    fn update_f32(&self, s: &Step, global: &[f64], w: &mut [f32], g: &[f32], st: &mut [&mut [f32]]);

    /// Updates `w` with gradient `g` in f64.
    fn update_f64(&self, s: &Step, global: &[f64], w: &mut [f64], g: &[f64], st: &mut [&mut [f64]]);

    /// The same update as a fused device kernel's step (computing in f64 when `f64`,
    /// else in f32), for rules that have one: the scalars are the ones `update_*` uses.
    fn fused(&self, s: &Step, f64: bool) -> Option<FusedStep> {
        let _ = (s, f64);
        None
    }

    /// Updates one row of `w` with that row of a row-sparse gradient, in f32, as MXNet's
    /// lazy (row-sparse) kernel does: the dense update, unless that kernel differs.
    fn update_row_f32(&self, s: &Step, global: &[f64], w: &mut [f32], g: &[f32], st: &mut [&mut [f32]]) {
        self.update_f32(s, global, w, g, st)
    }

    /// [`Rule::update_row_f32`] in f64.
    fn update_row_f64(&self, s: &Step, global: &[f64], w: &mut [f64], g: &[f64], st: &mut [&mut [f64]]) {
        self.update_f64(s, global, w, g, st)
    }
}

/// A [`FusedStep`] from scalars of the compute type `R`.
fn fused_step<R: Float>(rule: FusedRule, coefs: &[R], clip: Option<R>, clip_weights: Option<R>) -> FusedStep {
    let f = |x: R| x.to_f64().unwrap_or(f64::NAN);
    let mut c = [0.0; 6];
    for (d, &x) in c.iter_mut().zip(coefs) {
        *d = f(x);
    }
    FusedStep { rule, coefs: c, clip: clip.map(f), clip_weights: clip_weights.map(f) }
}

/// Implements [`Rule::fused`] by a rule's generic `fused_in::<R>`.
macro_rules! fused_rule {
    () => {
        fn fused(&self, s: &Step, f64: bool) -> Option<FusedStep> {
            Some(if f64 { self.fused_in::<f64>(s) } else { self.fused_in::<f32>(s) })
        }
    };
}

/// Implements both `update_*` methods of a rule by its generic `apply`.
macro_rules! float_rule {
    () => {
        fn update_f32(&self, s: &Step, global: &[f64], w: &mut [f32], g: &[f32], st: &mut [&mut [f32]]) {
            self.apply(s, global, w, g, st)
        }
        fn update_f64(&self, s: &Step, global: &[f64], w: &mut [f64], g: &[f64], st: &mut [&mut [f64]]) {
            self.apply(s, global, w, g, st)
        }
    };
}

/// The parameters of MXNet's multi-tensor SGD kernels (`multi_sgd_update`,
/// `multi_sgd_mom_update`, their `preloaded_` and `mp_` forms), already cast.
struct MultiSgd<R> {
    lr: R,
    wd: R,
    rescale: R,
    clip: Option<R>,
    momentum: R,
}

impl<R: Float> MultiSgd<R> {
    /// `MultiSGDKernel::Map`; without momentum the kernel runs the same expression with
    /// `mom = 0` and `momentum = 0` (kept as written, so results stay bit-identical, signed
    /// zeros included). The gradient's term is `lr * clip(rescale * g)` when clipping and
    /// `(lr * rescale) * g` when not, as the kernel's C++ associates it (the two round
    /// differently unless `rescale` is a power of two). The loops are split by case so
    /// that each one vectorises.
    fn run(&self, w: &mut [R], g: &[R], mom: Option<&mut [R]>) {
        let lr = self.lr;
        match self.clip {
            Some(c) => Self::run_with(w, g, mom, |g| lr * clip(self.rescale * g, Some(c)), self),
            None => {
                let lr_rescale = lr * self.rescale;
                Self::run_with(w, g, mom, |g| lr_rescale * g, self)
            }
        }
    }

    /// The update, with `step(g)` the gradient's term (`lr` included).
    #[inline(always)]
    fn run_with(w: &mut [R], g: &[R], mom: Option<&mut [R]>, step: impl Fn(R) -> R, k: &Self) {
        let (lr, wd, mu) = (k.lr, k.wd, k.momentum);
        match mom {
            Some(mom) => {
                for ((w, &g), m) in w.iter_mut().zip(g).zip(mom.iter_mut()) {
                    *m = mu * *m - lr * wd * *w - step(g);
                    *w = *w + *m;
                }
            }
            None => {
                for (w, &g) in w.iter_mut().zip(g) {
                    *w = *w + (mu * R::zero() - lr * wd * *w - step(g));
                }
            }
        }
    }
}

/// SGD, with momentum when `momentum > 0`. MXNet's SGD aggregates keys, so even one
/// key per call runs `multi_sgd_update` / `multi_sgd_mom_update` (`multi_mp_*` under
/// multi-precision, the same arithmetic on the f32 master copy).
pub(crate) struct Sgd {
    pub momentum: f64,
}

impl Sgd {
    fn params<R: Float>(&self, s: &Step) -> MultiSgd<R> {
        MultiSgd {
            lr: kp(s.lr),
            wd: kp(s.wd),
            rescale: kp(s.rescale),
            clip: s.kernel_clip(),
            momentum: if self.momentum > 0.0 { kp(self.momentum) } else { R::zero() },
        }
    }

    fn apply<R: Float>(&self, s: &Step, _global: &[f64], w: &mut [R], g: &[R], st: &mut [&mut [R]]) {
        self.params::<R>(s).run(w, g, st.first_mut().map(|m| &mut **m));
    }

    /// A row of a row-sparse gradient. With momentum, MXNet's lazy kernel
    /// (`SGDMomDnsRspDnsKernel`) is the dense one's expression; without, its
    /// `SGDDnsRspKernel` decays the weight first: `(1 - lr * wd) * w - step(g)`.
    fn row<R: Float>(&self, s: &Step, global: &[f64], w: &mut [R], g: &[R], st: &mut [&mut [R]]) {
        if self.momentum > 0.0 {
            return self.apply(s, global, w, g, st);
        }
        let k = self.params::<R>(s);
        let decay = R::one() - k.lr * k.wd;
        match k.clip {
            Some(c) => w.iter_mut().zip(g).for_each(|(w, &g)| *w = decay * *w - k.lr * clip(k.rescale * g, Some(c))),
            None => {
                let lr_rescale = k.lr * k.rescale;
                w.iter_mut().zip(g).for_each(|(w, &g)| *w = decay * *w - lr_rescale * g);
            }
        }
    }

    fn fused_in<R: Float>(&self, s: &Step) -> FusedStep {
        let k = self.params::<R>(s);
        let rule = if self.momentum > 0.0 { FusedRule::SgdMomentum } else { FusedRule::Sgd };
        fused_step(rule, &[k.lr, k.wd, k.rescale, k.momentum], k.clip, None)
    }
}

impl Rule for Sgd {
    fn states(&self) -> &'static [&'static str] {
        if self.momentum > 0.0 { &["momentum"] } else { &[] }
    }
    float_rule!();
    fused_rule!();

    fn update_row_f32(&self, s: &Step, global: &[f64], w: &mut [f32], g: &[f32], st: &mut [&mut [f32]]) {
        self.row(s, global, w, g, st)
    }

    fn update_row_f64(&self, s: &Step, global: &[f64], w: &mut [f64], g: &[f64], st: &mut [&mut [f64]]) {
        self.row(s, global, w, g, st)
    }
}

/// Nesterov momentum (`nag_mom_update`; `sgd_update` without momentum).
pub(crate) struct Nag {
    pub momentum: f64,
}

impl Nag {
    fn params<R: Float>(s: &Step) -> (R, R, R, Option<R>) {
        (kp::<R>(s.lr), kp::<R>(s.wd), kp::<R>(s.rescale), s.kernel_clip::<R>())
    }

    fn fused_in<R: Float>(&self, s: &Step) -> FusedStep {
        let (lr, wd, r, c) = Self::params::<R>(s);
        let rule = if self.momentum > 0.0 { FusedRule::NagMomentum } else { FusedRule::Nag };
        fused_step(rule, &[lr, wd, r, kp::<R>(self.momentum)], c, None)
    }

    fn apply<R: Float>(&self, s: &Step, _global: &[f64], w: &mut [R], g: &[R], st: &mut [&mut [R]]) {
        let (lr, wd, r, c) = Self::params::<R>(s);
        match st.first_mut() {
            Some(mom) if self.momentum > 0.0 => {
                let mu = kp::<R>(self.momentum);
                for ((w, &g), m) in w.iter_mut().zip(g).zip(mom.iter_mut()) {
                    let rg = match c {
                        Some(_) => clip(r * g, c),
                        None => r * g,
                    };
                    *m = mu * *m;
                    *w = *w - *m + (mu + R::one()) * (*m - lr * (rg + wd * *w));
                    // The kernel writes the weight in place first, so the momentum's
                    // weight-decay term reads the *new* weight (MXNet 1.9.1 quirk).
                    *m = *m - lr * (rg + wd * *w);
                }
            }
            _ => {
                // `SGDKernel`: the rescale is folded into lr when there is no clipping.
                for (w, &g) in w.iter_mut().zip(g) {
                    *w = match c {
                        Some(_) => (R::one() - lr * wd) * *w - lr * clip(r * g, c),
                        None => (R::one() - lr * wd) * *w - (lr * r) * g,
                    };
                }
            }
        }
    }
}

impl Rule for Nag {
    fn states(&self) -> &'static [&'static str] {
        if self.momentum > 0.0 { &["momentum"] } else { &[] }
    }
    float_rule!();
    fused_rule!();
}

/// Adam (`adam_update`; the bias correction is folded into lr in Python, in f64).
pub(crate) struct Adam {
    pub beta1: f64,
    pub beta2: f64,
    pub epsilon: f64,
}

impl Adam {
    /// `[lr, wd, rescale, beta1, beta2, epsilon]` (lr bias-corrected) and the clip.
    fn params<R: Float>(&self, s: &Step) -> ([R; 6], Option<R>) {
        let coef1 = 1.0 - powt(self.beta1, s.t);
        let coef2 = 1.0 - powt(self.beta2, s.t);
        let lr = kp::<R>(s.lr * (coef2.sqrt() / coef1));
        let (wd, r) = (kp::<R>(s.wd), kp::<R>(s.rescale));
        ([lr, wd, r, kp::<R>(self.beta1), kp::<R>(self.beta2), kp::<R>(self.epsilon)], s.kernel_clip::<R>())
    }

    fn fused_in<R: Float>(&self, s: &Step) -> FusedStep {
        let (k, c) = self.params::<R>(s);
        fused_step(FusedRule::Adam, &k, c, None)
    }

    fn apply<R: Float>(&self, s: &Step, _global: &[f64], w: &mut [R], g: &[R], st: &mut [&mut [R]]) {
        let [mean, var] = st else { return };
        let ([lr, wd, r, b1, b2, eps], c) = self.params::<R>(s);
        for (((w, &g), m), v) in w.iter_mut().zip(g).zip(mean.iter_mut()).zip(var.iter_mut()) {
            let gr = clip(g * r + *w * wd, c);
            *m = b1 * *m + (R::one() - b1) * gr;
            *v = b2 * *v + (R::one() - b2) * gr * gr;
            *w = *w - lr * *m / (v.sqrt() + eps);
        }
    }
}

impl Rule for Adam {
    fn states(&self) -> &'static [&'static str] {
        &["mean", "var"]
    }
    float_rule!();
    fused_rule!();
}

/// AdaGrad (dense: Python NDArray arithmetic).
pub(crate) struct AdaGrad {
    pub eps: f64,
}

impl AdaGrad {
    /// `(rescale, clip, eps, wd, -lr)`.
    fn params<R: Float>(&self, s: &Step) -> (R, Option<R>, R, R, R) {
        (sc::<R>(s.rescale), s.nd_clip::<R>(), sc::<R>(self.eps), sc::<R>(s.wd), sc::<R>(-s.lr))
    }

    fn fused_in<R: Float>(&self, s: &Step) -> FusedStep {
        let (r, c, eps, wd, neg_lr) = self.params::<R>(s);
        fused_step(FusedRule::AdaGrad, &[neg_lr, wd, r, eps], c, None)
    }

    fn apply<R: Float>(&self, s: &Step, _global: &[f64], w: &mut [R], g: &[R], st: &mut [&mut [R]]) {
        let [history] = st else { return };
        let (r, c, eps, wd, neg_lr) = self.params::<R>(s);
        for ((w, &g), h) in w.iter_mut().zip(g).zip(history.iter_mut()) {
            let g = clip(g * r, c);
            *h = *h + g * g;
            let div = g / (*h + eps).sqrt();
            *w = *w + (div + *w * wd) * neg_lr;
        }
    }
}

impl Rule for AdaGrad {
    fn states(&self) -> &'static [&'static str] {
        &["history"]
    }
    float_rule!();
    fused_rule!();
}

/// RMSProp: Tieleman & Hinton (`rmsprop_update`) or, centered, Graves
/// (`rmspropalex_update`); weights clipped to `clip_weights` when it is truthy.
pub(crate) struct RmsProp {
    pub gamma1: f64,
    pub gamma2: f64,
    pub epsilon: f64,
    pub centered: bool,
    pub clip_weights: Option<f64>,
}

impl RmsProp {
    /// `[lr, wd, rescale, gamma1, gamma2, epsilon]`, the gradient clip and the weight
    /// clip.
    fn params<R: Float>(&self, s: &Step) -> ([R; 6], Option<R>, Option<R>) {
        let k = [s.lr, s.wd, s.rescale, self.gamma1, self.gamma2, self.epsilon].map(kp::<R>);
        (k, s.kernel_clip::<R>(), self.clip_weights.filter(|&v| v > 0.0).map(kp::<R>))
    }

    fn fused_in<R: Float>(&self, s: &Step) -> FusedStep {
        let ([lr, wd, r, g1, g2, eps], c, cw) = self.params::<R>(s);
        if self.centered {
            fused_step(FusedRule::RmsPropCentered, &[lr, wd, r, g1, g2, eps], c, cw)
        } else {
            fused_step(FusedRule::RmsProp, &[lr, wd, r, g1, eps], c, cw)
        }
    }

    fn apply<R: Float>(&self, s: &Step, _global: &[f64], w: &mut [R], g: &[R], st: &mut [&mut [R]]) {
        let ([lr, wd, r, g1, g2, eps], c, cw) = self.params::<R>(s);
        match st {
            [n] if !self.centered => {
                for ((w, &g), n) in w.iter_mut().zip(g).zip(n.iter_mut()) {
                    let gr = clip(r * g + wd * *w, c);
                    *n = (R::one() - g1) * (gr * gr) + g1 * *n;
                    *w = clip(*w - lr * (gr / (*n + eps).sqrt()), cw);
                }
            }
            [n, gbar, delta] if self.centered => {
                let it = w.iter_mut().zip(g).zip(n.iter_mut()).zip(gbar.iter_mut()).zip(delta.iter_mut());
                for ((((w, &g), n), gb), d) in it {
                    let gr = clip(r * g + wd * *w, c);
                    *n = (R::one() - g1) * gr * gr + g1 * *n;
                    *gb = (R::one() - g1) * gr + g1 * *gb;
                    *d = g2 * *d - (lr * gr / (*n - *gb * *gb + eps).sqrt());
                    *w = clip(*w + *d, cw);
                }
            }
            _ => {}
        }
    }
}

impl Rule for RmsProp {
    fn states(&self) -> &'static [&'static str] {
        if self.centered { &["n", "g", "delta"] } else { &["n"] }
    }
    float_rule!();
    fused_rule!();
}

/// AdaDelta (Python NDArray arithmetic; the learning rate is not used).
pub(crate) struct AdaDelta {
    pub rho: f64,
    pub epsilon: f64,
}

impl AdaDelta {
    fn apply<R: Float>(&self, s: &Step, _global: &[f64], w: &mut [R], g: &[R], st: &mut [&mut [R]]) {
        let [acc_g, acc_delta] = st else { return };
        let (r, c, wd) = (sc::<R>(s.rescale), s.nd_clip::<R>(), sc::<R>(s.wd));
        let (rho, one_minus_rho, eps) = (sc::<R>(self.rho), sc::<R>(1.0 - self.rho), sc::<R>(self.epsilon));
        for (((w, &g), ag), ad) in w.iter_mut().zip(g).zip(acc_g.iter_mut()).zip(acc_delta.iter_mut()) {
            let g = clip(g * r, c);
            *ag = *ag * rho;
            *ag = *ag + g * one_minus_rho * g;
            let delta = (*ad + eps).sqrt() / (*ag + eps).sqrt() * g;
            *ad = *ad * rho;
            *ad = *ad + delta * one_minus_rho * delta;
            *w = *w - (delta + *w * wd);
        }
    }
}

impl Rule for AdaDelta {
    fn states(&self) -> &'static [&'static str] {
        &["acc_g", "acc_delta"]
    }
    float_rule!();
}

/// FTRL-Proximal (`ftrl_update`).
pub(crate) struct Ftrl {
    pub lamda1: f64,
    pub beta: f64,
}

impl Ftrl {
    fn apply<R: Float>(&self, s: &Step, _global: &[f64], w: &mut [R], g: &[R], st: &mut [&mut [R]]) {
        let [z, n] = st else { return };
        let (lr, wd, r, c) = (kp::<R>(s.lr), kp::<R>(s.wd), kp::<R>(s.rescale), s.kernel_clip::<R>());
        let (l1, beta) = (kp::<R>(self.lamda1), kp::<R>(self.beta));
        for (((w, &g), z), n) in w.iter_mut().zip(g).zip(z.iter_mut()).zip(n.iter_mut()) {
            let gr = clip(g * r, c);
            *z = *z + (gr - ((*n + gr * gr).sqrt() - n.sqrt()) * *w / lr);
            *n = *n + gr * gr;
            let on = if z.abs() > l1 { R::one() } else { R::zero() };
            *w = (sign(*z) * l1 - *z) / ((beta + n.sqrt()) / lr + wd) * on;
        }
    }
}

impl Rule for Ftrl {
    fn states(&self) -> &'static [&'static str] {
        &["z", "n"]
    }
    float_rule!();
}

/// Signum (`signum_update`), or signSGD without momentum (`signsgd_update`, which
/// uses the raw gradient's sign: no rescale, no clipping).
pub(crate) struct Signum {
    pub momentum: f64,
    pub wd_lh: f64,
}

impl Signum {
    fn apply<R: Float>(&self, s: &Step, _global: &[f64], w: &mut [R], g: &[R], st: &mut [&mut [R]]) {
        let (lr, wd, r, c) = (kp::<R>(s.lr), kp::<R>(s.wd), kp::<R>(s.rescale), s.kernel_clip::<R>());
        match st.first_mut() {
            Some(mom) if self.momentum > 0.0 => {
                let mu = kp::<R>(self.momentum);
                let wd_lh = kp::<R>(self.wd_lh);
                let om = R::one() - mu;
                for ((w, &g), m) in w.iter_mut().zip(g).zip(mom.iter_mut()) {
                    *m = match c {
                        Some(_) => mu * *m - om * wd * *w - om * clip(r * g, c),
                        None => mu * *m - om * wd * *w - om * r * g,
                    };
                    *w = (R::one() - lr * wd_lh) * *w + lr * sign(*m);
                }
            }
            _ => {
                for (w, &g) in w.iter_mut().zip(g) {
                    *w = (R::one() - lr * wd) * *w - lr * sign(g);
                }
            }
        }
    }
}

impl Rule for Signum {
    fn states(&self) -> &'static [&'static str] {
        if self.momentum > 0.0 { &["momentum"] } else { &[] }
    }
    float_rule!();
}

/// SplitMix64 (Steele, Lea & Flood 2014): a small, seedable generator for SGLD's noise.
struct SplitMix64(u64);

/// SplitMix64's increment.
const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

impl SplitMix64 {
    /// The generator of `seed`, `pairs` normal pairs on ([`SplitMix64::normal_pair`]
    /// draws two numbers): its state moves by a fixed step per number.
    fn at_pair(seed: u64, pairs: usize) -> Self {
        SplitMix64(seed.wrapping_add((pairs as u64).wrapping_mul(2).wrapping_mul(GOLDEN_GAMMA)))
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1]: never 0, so that `ln` is finite.
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal pairs (Box-Muller).
    fn normal_pair(&mut self) -> (f64, f64) {
        let (u1, u2) = (self.uniform(), self.uniform());
        let radius = (-2.0 * u1.ln()).sqrt();
        let angle = 2.0 * std::f64::consts::PI * u2;
        (radius * angle.cos(), radius * angle.sin())
    }
}

/// Stochastic Gradient Langevin Dynamics: half a gradient step plus N(0, √lr) noise
/// (Python NDArray arithmetic). MXNet's noise comes from its global generator; here it
/// comes from [`Step::seed`], so a run is reproducible.
pub(crate) struct Sgld;

impl Sgld {
    fn apply<R: Float>(&self, s: &Step, _global: &[f64], w: &mut [R], g: &[R], _st: &mut [&mut [R]]) {
        let (r, c, wd, half_lr) = (sc::<R>(s.rescale), s.nd_clip::<R>(), sc::<R>(s.wd), sc::<R>(-s.lr / 2.0));
        for (w, &g) in w.iter_mut().zip(g) {
            let g = clip(g * r, c);
            *w = *w + (g + *w * wd) * half_lr;
        }
        let std = s.lr.sqrt();
        // Element i of the key gets number i % 2 of normal pair i / 2, wherever a part
        // of the key starts.
        let mut rng = SplitMix64::at_pair(s.seed, s.offset / 2);
        let noise = std::iter::from_fn(|| Some(<[f64; 2]>::from(rng.normal_pair()))).flatten();
        for (w, z) in w.iter_mut().zip(noise.skip(s.offset % 2)) {
            *w = *w + sc::<R>(z * std);
        }
    }
}

impl Rule for Sgld {
    fn states(&self) -> &'static [&'static str] {
        &[]
    }
    float_rule!();
}

/// Delay-compensated asynchronous SGD (Python NDArray arithmetic). Its state holds
/// the previous weight, which starts as the weight.
///
/// MXNet 1.9.1 fails with `momentum > 0` (`if mom:` on an NDArray raises, and the
/// kvstore swallows it); this implements the documented rule `m = μm + u`.
pub(crate) struct DcaSgd {
    pub momentum: f64,
    pub lamda: f64,
}

impl DcaSgd {
    fn apply<R: Float>(&self, s: &Step, _global: &[f64], w: &mut [R], g: &[R], st: &mut [&mut [R]]) {
        let (r, c, wd, lamda, neg_lr) =
            (sc::<R>(s.rescale), s.nd_clip::<R>(), sc::<R>(s.wd), sc::<R>(self.lamda), sc::<R>(-s.lr));
        let mu = sc::<R>(self.momentum);
        let (mut mom, prev) = match st {
            [m, p] if self.momentum != 0.0 => (Some(m), p),
            [p] => (None, p),
            _ => return,
        };
        for (i, (w, &g)) in w.iter_mut().zip(g).enumerate() {
            let Some(p) = prev.get_mut(i) else { return };
            let g = clip(g * r, c);
            let u = ((g + *w * wd) + g * lamda * g * (*w - *p)) * neg_lr;
            let m = match mom.as_deref_mut().and_then(|m| m.get_mut(i)) {
                Some(m) => {
                    *m = *m * mu;
                    *m = *m + u;
                    *m
                }
                None => u,
            };
            *p = *w;
            *w = *w + m;
        }
    }
}

impl Rule for DcaSgd {
    fn states(&self) -> &'static [&'static str] {
        if self.momentum != 0.0 { &["momentum", "prev_weight"] } else { &["prev_weight"] }
    }
    fn state_starts_as_weight(&self, i: usize) -> bool {
        i + 1 == self.states().len()
    }
    float_rule!();
}

/// AdaMax (Python NDArray arithmetic).
pub(crate) struct Adamax {
    pub beta1: f64,
    pub beta2: f64,
}

impl Adamax {
    fn apply<R: Float>(&self, s: &Step, _global: &[f64], w: &mut [R], g: &[R], st: &mut [&mut [R]]) {
        let [mean, u] = st else { return };
        let lr = sc::<R>(s.lr / (1.0 - powt(self.beta1, s.t)));
        let (r, c, wd) = (sc::<R>(s.rescale), s.nd_clip::<R>(), sc::<R>(s.wd));
        let (b1, one_minus_b1, b2) = (sc::<R>(self.beta1), sc::<R>(1.0 - self.beta1), sc::<R>(self.beta2));
        for (((w, &g), m), u) in w.iter_mut().zip(g).zip(mean.iter_mut()).zip(u.iter_mut()) {
            let g = clip(g * r + *w * wd, c);
            *m = *m * b1;
            *m = *m + g * one_minus_b1;
            let decayed = *u * b2;
            let a = g.abs();
            *u = if decayed > a { decayed } else { a };
            *w = *w - *m * lr / *u;
        }
    }
}

impl Rule for Adamax {
    fn states(&self) -> &'static [&'static str] {
        &["mean", "u"]
    }
    float_rule!();
}

/// FTML, Follow the Moving Leader (`ftml_update`, a fused kernel: every operand in the
/// weight's type, `t` too).
pub(crate) struct Ftml {
    pub beta1: f64,
    pub beta2: f64,
    pub epsilon: f64,
}

impl Ftml {
    fn apply<R: Float>(&self, s: &Step, _global: &[f64], w: &mut [R], g: &[R], st: &mut [&mut [R]]) {
        let [prev_d, v, z] = st else { return };
        let (lr, wd, r, c) = (kp::<R>(s.lr), kp::<R>(s.wd), kp::<R>(s.rescale), s.kernel_clip::<R>());
        let (b1, b2, eps) = (kp::<R>(self.beta1), kp::<R>(self.beta2), kp::<R>(self.epsilon));
        let t = R::from(s.t).unwrap_or_else(R::nan);
        let one = R::one();
        // The kernel's `(1 - beta1^t) / lr * (sqrt(v / (1 - beta2^t)) + epsilon)`, its
        // first factor and the divisor the same for every element.
        let (scale, v_div) = ((one - b1.powf(t)) / lr, one - b2.powf(t));
        for ((((w, &g), d), v), z) in w.iter_mut().zip(g).zip(prev_d.iter_mut()).zip(v.iter_mut()).zip(z.iter_mut()) {
            let gi = clip(r * g + wd * *w, c);
            *v = b2 * *v + (one - b2) * (gi * gi);
            let d_t = scale * ((*v / v_div).sqrt() + eps);
            *z = b1 * *z + (one - b1) * gi - (d_t - b1 * *d) * *w;
            *d = d_t;
            *w = -*z / d_t;
        }
    }
}

impl Rule for Ftml {
    fn states(&self) -> &'static [&'static str] {
        &["d", "v", "z"]
    }
    float_rule!();
}

/// LBSGD's warm-up of the learning rate (`warmup_strategy`), by its code in the
/// optimizer's parameters: MXNet's names in this order, and any other name (MXNet
/// scales by 1 then).
pub const LBSGD_STRATEGIES: [&str; 4] = ["linear", "power2", "sqrt", "lars"];

/// LBSGD, large-batch SGD (Python, then `sgd_update` / `sgd_mom_update`): each key's
/// gradients are summed over `batch_scale` pushes, counted from `begin_epoch *
/// updates_per_epoch`; the push that completes a batch updates with their mean and
/// the rate times a warm-up multiplier (or, for `lars`, the layer's trust ratio), and
/// the pushes between leave the weight as it is (an `sgd_update` with rate 0).
pub(crate) struct Lbsgd {
    pub momentum: f64,
    /// A code of [`LBSGD_STRATEGIES`], or their number for any other name.
    pub strategy: usize,
    pub warmup_epochs: u64,
    pub batch_scale: u64,
    pub updates_per_epoch: u64,
    pub begin_epoch: u64,
    pub begin_num_update: u64,
}

impl Lbsgd {
    /// `_get_lbmult(nup)`, in Python floats.
    fn lbmult(&self, nup: u64) -> f64 {
        let nwup = self.warmup_epochs * self.updates_per_epoch;
        let maxmult = self.batch_scale as f64;
        if nup >= nwup {
            return maxmult;
        }
        if nwup <= 1 {
            return 1.0;
        }
        let (nup_f, nwup_f) = (nup as f64, nwup as f64);
        match LBSGD_STRATEGIES.get(self.strategy) {
            Some(&"linear") => 1.0 + (maxmult - 1.0) * nup_f / nwup_f,
            Some(&"power2") => 1.0 + (maxmult - 1.0) * ((nup * nup) as f64) / ((nwup * nwup) as f64),
            Some(&"sqrt") => 1.0 + (maxmult - 1.0) * (nup_f / nwup_f).sqrt(),
            _ => 1.0,
        }
    }

    /// `_get_lars(weight, g, wd)`: the sums of squares as numpy sums them (in the
    /// array's type), the rest in Python floats, clamped to [0.01, 100].
    fn lars<R: Float>(w: &[R], g: &[R], wd: f64) -> f64 {
        let squares = |v: &[R]| numpy_sum(v, |x| x * x).to_f64().unwrap_or(f64::NAN);
        let (weight2, grad2) = (squares(w), squares(g));
        // NaN stays NaN, as with MXNet's comparisons.
        (weight2 / (grad2 + wd * weight2 + 1e-18)).sqrt().clamp(0.01, 100.0)
    }

    fn apply<R: Float>(&self, s: &Step, _global: &[f64], w: &mut [R], g: &[R], st: &mut [&mut [R]]) {
        let (mom, cum): (Option<&mut [R]>, &mut [R]) = match st {
            [mom, cum] => (Some(&mut **mom), &mut **cum),
            [cum] => (None, &mut **cum),
            _ => return,
        };
        let updates = s.t.saturating_sub(self.begin_num_update);
        let num_cums = self.begin_epoch * self.updates_per_epoch + updates;
        // `_cumulate_gradient`: the first gradient as it is; later ones added to the
        // sum (a sum just reset is 0, and `0 + g` is what MXNet computes then too).
        if updates <= 1 {
            cum.copy_from_slice(g);
        } else {
            for (c, &g) in cum.iter_mut().zip(g) {
                *c = *c + g;
            }
        }
        let wd = kp::<R>(s.wd);
        if !num_cums.is_multiple_of(self.batch_scale) {
            // `sgd_update(weight, grad, lr=0.0, wd=wd)`: the weight stays (NaN if the
            // gradient is not finite, as in MXNet).
            let (zero, one) = (R::zero(), R::one());
            for (w, &g) in w.iter_mut().zip(g) {
                *w = (one - zero * wd) * *w - (zero * one) * g;
            }
            return;
        }
        let bs = sc::<R>(self.batch_scale as f64);
        for c in cum.iter_mut() {
            *c = *c / bs;
        }
        let mult = if LBSGD_STRATEGIES.get(self.strategy) == Some(&"lars") {
            Self::lars(w, cum, s.wd)
        } else {
            self.lbmult(num_cums)
        };
        let (lr, r, c) = (kp::<R>(s.lr * mult), kp::<R>(s.rescale), s.kernel_clip::<R>());
        match mom {
            Some(mom) => {
                // `SGDMomKernel` (the momentum is passed only when it is positive).
                let mu = if self.momentum > 0.0 { kp::<R>(self.momentum) } else { R::zero() };
                for ((w, &g), m) in w.iter_mut().zip(cum.iter()).zip(mom.iter_mut()) {
                    *m = match c {
                        Some(_) => mu * *m - lr * wd * *w - lr * clip(r * g, c),
                        None => mu * *m - lr * wd * *w - lr * r * g,
                    };
                    *w = *w + *m;
                }
            }
            None => {
                // `SGDKernel`: the rescale is folded into lr when there is no clipping.
                for (w, &g) in w.iter_mut().zip(cum.iter()) {
                    *w = match c {
                        Some(_) => (R::one() - lr * wd) * *w - lr * clip(r * g, c),
                        None => (R::one() - lr * wd) * *w - (lr * r) * g,
                    };
                }
            }
        }
        // `_reset_cum_gradient`.
        cum.fill(R::zero());
    }
}

impl Rule for Lbsgd {
    fn states(&self) -> &'static [&'static str] {
        if self.momentum != 0.0 { &["momentum", "cum_grad"] } else { &["cum_grad"] }
    }
    fn lr_before_count(&self) -> bool {
        true
    }
    float_rule!();
}

/// numpy's sum of a contiguous array of `f(x)` for each `x` of `a` (`pairwise_sum`,
/// with `f` applied as the elements are read, so no array of them is made): fewer than
/// 8 elements in order; up to 128 in eight interleaved partial sums, added pairwise,
/// then the rest in order; more split in two at a multiple of 8 and summed recursively.
fn numpy_sum<R: Float>(a: &[R], f: impl Fn(R) -> R + Copy) -> R {
    let n = a.len();
    if n < 8 {
        return a.iter().fold(R::zero(), |acc, &x| acc + f(x));
    }
    if n <= 128 {
        let mut r = [R::zero(); 8];
        for (r, &x) in r.iter_mut().zip(&a[..8]) {
            *r = f(x);
        }
        let full = n - n % 8;
        for chunk in a[8..full].chunks_exact(8) {
            for (r, &x) in r.iter_mut().zip(chunk) {
                *r = *r + f(x);
            }
        }
        let res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        return a[full..].iter().fold(res, |acc, &x| acc + f(x));
    }
    let half = n / 2;
    let half = half - half % 8;
    numpy_sum(&a[..half], f) + numpy_sum(&a[half..], f)
}

/// Nadam (Python NDArray arithmetic, Keras-style). The momentum schedule's product
/// `m_schedule` is one value for the whole optimizer, multiplied on every update of
/// every key: `global[0]`.
pub(crate) struct Nadam {
    pub beta1: f64,
    pub beta2: f64,
    pub epsilon: f64,
    pub schedule_decay: f64,
}

impl Nadam {
    /// The momentum of update `t` (and, at `t + 1`, of the next).
    fn momentum(&self, t: u64) -> f64 {
        self.beta1 * (1.0 - 0.5 * 0.96f64.powf(t as f64 * self.schedule_decay))
    }

    fn apply<R: Float>(&self, s: &Step, global: &[f64], w: &mut [R], g: &[R], st: &mut [&mut [R]]) {
        let [mean, var] = st else { return };
        // (Advanced for this update: `Rule::advance`.)
        let Some(&m_schedule) = global.first() else { return };
        let (momentum_t, momentum_t_1) = (self.momentum(s.t), self.momentum(s.t + 1));
        let m_schedule_next = m_schedule * momentum_t_1;
        let (r, c, wd, lr) = (sc::<R>(s.rescale), s.nd_clip::<R>(), sc::<R>(s.wd), sc::<R>(s.lr));
        let (b1, one_minus_b1) = (sc::<R>(self.beta1), sc::<R>(1.0 - self.beta1));
        let (b2, one_minus_b2) = (sc::<R>(self.beta2), sc::<R>(1.0 - self.beta2));
        let g_div = sc::<R>(1.0 - m_schedule);
        let m_div = sc::<R>(1.0 - m_schedule_next);
        let v_div = sc::<R>(1.0 - powt(self.beta2, s.t));
        let (c_g, c_m, eps) = (sc::<R>(1.0 - momentum_t), sc::<R>(momentum_t_1), sc::<R>(self.epsilon));
        for (((w, &g), m), v) in w.iter_mut().zip(g).zip(mean.iter_mut()).zip(var.iter_mut()) {
            let g = clip(g * r + *w * wd, c);
            *m = *m * b1;
            *m = *m + g * one_minus_b1;
            *v = *v * b2;
            *v = *v + g * one_minus_b2 * g;
            let m_bar = g / g_div * c_g + *m / m_div * c_m;
            *w = *w - m_bar * lr / ((*v / v_div).sqrt() + eps);
        }
    }
}

impl Rule for Nadam {
    fn states(&self) -> &'static [&'static str] {
        &["mean", "var"]
    }
    fn advance(&self, s: &Step, global: &mut [f64]) {
        if let Some(m_schedule) = global.first_mut() {
            *m_schedule *= self.momentum(s.t);
        }
    }
    fn global_init(&self) -> Vec<f64> {
        vec![1.0]
    }
    float_rule!();
}

/// LAMB. MXNet's LAMB aggregates keys, so even one key per call runs the CPU
/// `multi_lamb_update`: Adam's direction plus wd, scaled by the trust ratio
/// `‖w‖/‖g‖` of the whole array (norms from in-order f32 sums of squares; `‖w‖`
/// clamped to the bounds when they are truthy; ratio 1 when either norm is 0).
pub(crate) struct Lamb {
    pub beta1: f64,
    pub beta2: f64,
    pub epsilon: f64,
    pub lower_bound: Option<f64>,
    pub upper_bound: Option<f64>,
    pub bias_correction: bool,
}

impl Lamb {
    fn apply<R: Float>(&self, s: &Step, _global: &[f64], w: &mut [R], g: &[R], st: &mut [&mut [R]]) {
        let [mean, var] = st else { return };
        let (lr, wd, r, c) = (kp::<R>(s.lr), kp::<R>(s.wd), kp::<R>(s.rescale), s.kernel_clip::<R>());
        let (b1, b2, eps) = (kp::<R>(self.beta1), kp::<R>(self.beta2), kp::<R>(self.epsilon));
        let t = R::from(s.t as f32).unwrap_or_else(R::nan);
        let (bc1, bc2) = (R::one() - b1.powf(t), R::one() - b2.powf(t));
        let r1_sum = sum_sq(w);
        let mut step = vec![0.0f32; w.len()];
        for ((((x, &w), &g), m), v) in step.iter_mut().zip(w.iter()).zip(g).zip(mean.iter_mut()).zip(var.iter_mut()) {
            let sg = clip(g * r, c);
            *m = b1 * *m + (R::one() - b1) * sg;
            *v = b2 * *v + (R::one() - b2) * sg * sg;
            let (m_hat, v_hat) = if self.bias_correction { (*m / bc1, *v / bc2) } else { (*m, *v) };
            // The kernel's unqualified `sqrt` is C's double `sqrt`, so this expression
            // runs in f64 and is rounded once into the kernel's f32 scratch buffer
            // (checked against MXNet on thousands of elements).
            let f = |x: R| x.to_f64().unwrap_or(f64::NAN);
            let d = f(m_hat) / (f(v_hat).sqrt() + f(eps)) + f(wd * w);
            *x = d as f32;
        }
        let mut r1 = r1_sum.sqrt();
        let r2 = sum_sq(&step).sqrt();
        // The Python passes a bound only when it is truthy, the kernel uses it only
        // when it is not negative.
        if let Some(lo) = self.lower_bound.filter(|&b| b > 0.0) {
            r1 = r1.max(lo as f32);
        }
        if let Some(hi) = self.upper_bound.filter(|&b| b > 0.0) {
            r1 = r1.min(hi as f32);
        }
        let ratio = if r1 == 0.0 || r2 == 0.0 { R::one() } else { R::from(r1 / r2).unwrap_or_else(R::nan) };
        let lr_adjusted = lr * ratio;
        for (w, &x) in w.iter_mut().zip(&step) {
            *w = *w - lr_adjusted * R::from(x).unwrap_or_else(R::nan);
        }
    }
}

impl Rule for Lamb {
    fn states(&self) -> &'static [&'static str] {
        &["mean", "var"]
    }
    float_rule!();
}

/// LARS. MXNet's LARS aggregates keys, so even one key per call runs `multi_sum_sq`,
/// `multi_lars` (the layer-wise rate `lr·eta·‖w‖/(‖g‖·rescale + wd·‖w‖ + eps)`, or
/// `lr` when a norm is 0) and `preloaded_multi_sgd(_mom)_update`. With
/// `momentum_correction` the momentum is scaled by `lr / previous lr`, where the rates
/// are the last two the optimizer computed (for any key): `global = [current, last]`.
///
/// MXNet skips the layer-wise rate for parameters whose names end in `gamma`, `beta`
/// or `bias`, and tracks the rates before `lr_mult`; a rule sees neither the key nor
/// the rate before `lr_mult`, so it applies LARS to every key and tracks the rates
/// after `lr_mult`.
pub(crate) struct Lars {
    pub momentum: f64,
    pub eta: f64,
    pub eps: f64,
    pub momentum_correction: bool,
}

impl Lars {
    fn apply<R: Float>(&self, s: &Step, global: &[f64], w: &mut [R], g: &[R], st: &mut [&mut [R]]) {
        // (Advanced for this update: `Rule::advance`.)
        let &[cur_lr, last_lr] = global else { return };
        let momentum =
            if self.momentum_correction && last_lr != 0.0 { self.momentum * (cur_lr / last_lr) } else { self.momentum };
        let (lr, wd) = (s.lr as f32, s.wd as f32);
        let w_sum_sq = sum_sq(w);
        let g_sum_sq = sum_sq(g);
        let w_norm = w_sum_sq.sqrt();
        // MXNet leaves normalisation parameters and biases at the plain rate.
        let plain = ["gamma", "beta", "bias"].iter().any(|suffix| s.key.ends_with(suffix));
        let lars_lr = if !plain && w_norm > 0.0 && g_sum_sq > 0.0 {
            lr * self.eta as f32 * w_norm / (g_sum_sq.sqrt() * s.rescale as f32 + wd * w_norm + self.eps as f32)
        } else {
            lr
        };
        let k = MultiSgd {
            lr: R::from(lars_lr).unwrap_or_else(R::nan),
            wd: kp(s.wd),
            rescale: kp(s.rescale),
            clip: s.kernel_clip(),
            momentum: if self.momentum > 0.0 { kp(momentum) } else { R::zero() },
        };
        k.run(w, g, st.first_mut().map(|m| &mut **m));
    }
}

impl Rule for Lars {
    fn states(&self) -> &'static [&'static str] {
        if self.momentum != 0.0 { &["momentum"] } else { &[] }
    }
    fn advance(&self, s: &Step, global: &mut [f64]) {
        // LARS._get_lrs tracks the schedule's rate before lr_mult; `cur_lr` is None
        // (here negative) until the first update.
        if let [cur_lr, last_lr] = global {
            *last_lr = if *cur_lr < 0.0 { s.base_lr } else { *cur_lr };
            *cur_lr = s.base_lr;
        }
    }
    fn global_init(&self) -> Vec<f64> {
        // Rates are never negative; -1 stands for Python's None (NaN would not survive
        // the JSON of a state file).
        vec![-1.0, -1.0]
    }
    float_rule!();
}

/// The largest count LBSGD takes for its epochs and batch scale (2^32: their products
/// stay exact in u64 and f64).
const MAX_WHOLE: f64 = 4_294_967_296.0;

/// The rule of optimizer `name` (a name of `SPECS` in `mod.rs`), with its
/// hyper-parameters from `param` (`None`: unset, as Python's `None`).
pub(crate) fn make_rule(name: &str, param: &dyn Fn(&str) -> Option<f64>) -> Result<Box<dyn Rule>> {
    let num = |n: &str| param(n).unwrap_or(0.0);
    let flag = |n: &str| param(n).is_some_and(|v| v != 0.0);
    Ok(match name {
        "sgd" => Box::new(Sgd { momentum: num("momentum") }),
        "nag" => Box::new(Nag { momentum: num("momentum") }),
        "adam" => Box::new(Adam { beta1: num("beta1"), beta2: num("beta2"), epsilon: num("epsilon") }),
        "adagrad" => Box::new(AdaGrad { eps: num("eps") }),
        "rmsprop" => Box::new(RmsProp {
            gamma1: num("gamma1"),
            gamma2: num("gamma2"),
            epsilon: num("epsilon"),
            centered: flag("centered"),
            clip_weights: param("clip_weights"),
        }),
        "adadelta" => Box::new(AdaDelta { rho: num("rho"), epsilon: num("epsilon") }),
        "ftrl" => Box::new(Ftrl { lamda1: num("lamda1"), beta: num("beta") }),
        "signum" => Box::new(Signum { momentum: num("momentum"), wd_lh: num("wd_lh") }),
        "sgld" => Box::new(Sgld),
        "dcasgd" => Box::new(DcaSgd { momentum: num("momentum"), lamda: num("lamda") }),
        "adamax" => Box::new(Adamax { beta1: num("beta1"), beta2: num("beta2") }),
        "ftml" => Box::new(Ftml { beta1: num("beta1"), beta2: num("beta2"), epsilon: num("epsilon") }),
        "lbsgd" => {
            let whole = |n: &str, min: f64| -> Result<u64> {
                let v = num(n);
                if v.fract() != 0.0 || v < min || v > MAX_WHOLE {
                    return Err(Error::invalid_argument(format!(
                        "optimizer lbsgd: {n} must be a whole number from {min} to 2^32, not {v}"
                    )));
                }
                Ok(v as u64)
            };
            let strategy = num("warmup_strategy");
            Box::new(Lbsgd {
                momentum: num("momentum"),
                strategy: if strategy.fract() == 0.0 && (0.0..4.0).contains(&strategy) { strategy as usize } else { 4 },
                warmup_epochs: whole("warmup_epochs", 0.0)?,
                batch_scale: whole("batch_scale", 1.0)?,
                updates_per_epoch: whole("updates_per_epoch", 0.0)?,
                begin_epoch: whole("begin_epoch", 0.0)?,
                begin_num_update: num("begin_num_update") as u64,
            })
        }
        "nadam" => Box::new(Nadam {
            beta1: num("beta1"),
            beta2: num("beta2"),
            epsilon: num("epsilon"),
            schedule_decay: num("schedule_decay"),
        }),
        "lamb" => Box::new(Lamb {
            beta1: num("beta1"),
            beta2: num("beta2"),
            epsilon: num("epsilon"),
            lower_bound: param("lower_bound"),
            upper_bound: param("upper_bound"),
            bias_correction: flag("bias_correction"),
        }),
        // MXNet's keyword is `eps`; accept the spec's `epsilon` too.
        "lars" => Box::new(Lars {
            momentum: num("momentum"),
            eta: num("eta"),
            eps: param("eps").or_else(|| param("epsilon")).unwrap_or(0.0),
            momentum_correction: flag("momentum_correction"),
        }),
        _ => {
            return Err(Error::Unsupported {
                what: format!("optimizer {name}"),
                hint: format!("this build's optimizers are: {}", implemented().join(", ")),
            });
        }
    })
}

/// The optimizers whose rules exist.
pub(crate) fn implemented() -> Vec<&'static str> {
    vec![
        "sgd", "nag", "adam", "adagrad", "rmsprop", "adadelta", "ftrl", "signum", "sgld", "dcasgd", "adamax", "nadam",
        "lamb", "lars", "ftml", "lbsgd",
    ]
}
