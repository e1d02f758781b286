//! Learning-rate schedulers, as MXNet 1.9.1's `python/mxnet/lr_scheduler.py`: factor,
//! multi-factor, poly and cosine, each with an optional warm-up. Like MXNet's, they
//! keep state (the current rate and how far the steps have advanced), which is saved
//! with the optimizer states.

use serde::Serialize;
use serde_json::{Value, json};

use super::spec::ScheduleKind;
use crate::error::{Error, Result};

/// How the rate rises during warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WarmupMode {
    /// From `warmup_begin_lr` to the base rate, linearly.
    Linear,
    /// `warmup_begin_lr` throughout the warm-up.
    Constant,
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Factor { step: u64, factor: f64, stop_factor_lr: f64, count: u64 },
    MultiFactor { steps: Vec<u64>, factor: f64, cur_step_ind: usize, count: u64 },
    Poly { max_update: u64, pwr: f64, final_lr: f64, base_lr_orig: f64 },
    Cosine { max_update: u64, final_lr: f64, base_lr_orig: f64 },
}

/// A learning-rate schedule: `lr(num_update)` as MXNet's `LRScheduler.__call__`.
#[derive(Debug, Clone, PartialEq)]
pub struct LrScheduler {
    kind: Kind,
    base_lr: f64,
    warmup_steps: u64,
    warmup_begin_lr: f64,
    warmup_final_lr: f64,
    warmup_mode: WarmupMode,
}

impl LrScheduler {
    fn new(kind: Kind) -> Self {
        LrScheduler {
            kind,
            base_lr: 0.01,
            warmup_steps: 0,
            warmup_begin_lr: 0.0,
            warmup_final_lr: 0.01,
            warmup_mode: WarmupMode::Linear,
        }
    }

    /// Multiplies the rate by `factor` every `step` updates, down to `stop_factor_lr`
    /// (MXNet's `FactorScheduler`, default stop 1e-8).
    ///
    /// ```
    /// use kvstore_core::LrScheduler;
    /// let mut s = LrScheduler::factor(2, 0.5)?.base_lr(1.0);
    /// assert_eq!([s.lr(1), s.lr(2), s.lr(3), s.lr(5)], [1.0, 1.0, 0.5, 0.25]);
    /// assert!(LrScheduler::factor(0, 0.5).is_err());
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `step` is 0 or `factor` is above 1.
    pub fn factor(step: u64, factor: f64) -> Result<Self> {
        if step < 1 {
            return Err(Error::invalid_argument("factor scheduler: step must be at least 1"));
        }
        if factor > 1.0 {
            return Err(Error::invalid_argument("factor scheduler: factor must be at most 1"));
        }
        Ok(Self::new(Kind::Factor { step, factor, stop_factor_lr: 1e-8, count: 0 }))
    }

    /// Multiplies the rate by `factor` after each update count in `steps` (increasing).
    ///
    /// ```
    /// use kvstore_core::LrScheduler;
    /// let mut s = LrScheduler::multi_factor(&[2, 4], 0.5)?.base_lr(1.0);
    /// assert_eq!([s.lr(1), s.lr(3), s.lr(5), s.lr(100)], [1.0, 0.5, 0.25, 0.25]);
    /// assert!(LrScheduler::multi_factor(&[4, 2], 0.5).is_err());
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `steps` is empty, not increasing, starts below 1,
    /// or `factor` is above 1.
    pub fn multi_factor(steps: &[u64], factor: f64) -> Result<Self> {
        if steps.is_empty() || steps[0] < 1 || steps.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::invalid_argument(
                "multi-factor scheduler: steps must be increasing and start at 1 or more",
            ));
        }
        if factor > 1.0 {
            return Err(Error::invalid_argument("multi-factor scheduler: factor must be at most 1"));
        }
        Ok(Self::new(Kind::MultiFactor { steps: steps.to_vec(), factor, cur_step_ind: 0, count: 0 }))
    }

    /// Polynomial decay from the base rate to `final_lr` at `max_update`, with power
    /// `pwr` (MXNet default 2).
    ///
    /// ```
    /// use kvstore_core::LrScheduler;
    /// let mut s = LrScheduler::poly(4, 1.0, 0.0)?.base_lr(1.0); // linear, down to 0 at update 4
    /// assert_eq!([s.lr(1), s.lr(2), s.lr(4), s.lr(9)], [0.75, 0.5, 0.0, 0.0]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `max_update` is 0.
    pub fn poly(max_update: u64, pwr: f64, final_lr: f64) -> Result<Self> {
        if max_update < 1 {
            return Err(Error::invalid_argument("poly scheduler: max_update must be at least 1"));
        }
        Ok(Self::new(Kind::Poly { max_update, pwr, final_lr, base_lr_orig: 0.01 }))
    }

    /// Half-cosine decay from the base rate to `final_lr` at `max_update`.
    ///
    /// ```
    /// use kvstore_core::LrScheduler;
    /// let mut s = LrScheduler::cosine(4, 0.0)?.base_lr(1.0);
    /// assert_eq!([s.lr(0), s.lr(2), s.lr(4), s.lr(9)], [1.0, 0.5, 0.0, 0.0]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `max_update` is 0.
    pub fn cosine(max_update: u64, final_lr: f64) -> Result<Self> {
        if max_update < 1 {
            return Err(Error::invalid_argument("cosine scheduler: max_update must be at least 1"));
        }
        Ok(Self::new(Kind::Cosine { max_update, final_lr, base_lr_orig: 0.01 }))
    }

    /// The scheduler's own base rate (MXNet's `base_lr` constructor argument, default
    /// 0.01). Poly and cosine decay from this value; factor and multi-factor start from
    /// the optimizer's learning rate, which replaces it (as in MXNet).
    ///
    /// ```
    /// use kvstore_core::LrScheduler;
    /// let mut s = LrScheduler::poly(10, 2.0, 0.0)?.base_lr(0.1);
    /// assert_eq!(s.lr(0), 0.1);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn base_lr(mut self, lr: f64) -> Self {
        self.base_lr = lr;
        self.warmup_final_lr = lr;
        match &mut self.kind {
            Kind::Poly { base_lr_orig, .. } | Kind::Cosine { base_lr_orig, .. } => *base_lr_orig = lr,
            _ => {}
        }
        self
    }

    /// The lowest rate of a factor schedule (default 1e-8); other schedules have no
    /// such floor and ignore it.
    ///
    /// ```
    /// use kvstore_core::LrScheduler;
    /// let mut s = LrScheduler::factor(1, 0.1)?.base_lr(1.0).stop_factor_lr(0.05);
    /// assert_eq!(s.lr(100), 0.05); // 1, 0.1, then the floor
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn stop_factor_lr(mut self, stop: f64) -> Self {
        if let Kind::Factor { stop_factor_lr, .. } = &mut self.kind {
            *stop_factor_lr = stop;
        }
        self
    }

    /// A warm-up over the first `steps` updates, from `begin_lr` up to the scheduler's
    /// own base rate (MXNet's `warmup_final_lr` is the constructor's `base_lr`, not the
    /// optimizer's learning rate). `begin_lr` is checked against the base rate set so
    /// far: call [`LrScheduler::base_lr`] first.
    ///
    /// ```
    /// use kvstore_core::{LrScheduler, WarmupMode};
    /// let mut s = LrScheduler::poly(10, 1.0, 0.0)?.base_lr(1.0).warmup(4, 0.0, WarmupMode::Linear)?;
    /// assert_eq!([s.lr(0), s.lr(2), s.lr(4)], [0.0, 0.5, 1.0]); // up over 4 updates, then decay
    /// assert!(LrScheduler::factor(1, 0.5)?.warmup(2, 5.0, WarmupMode::Constant).is_err()); // 5 > 0.01
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `begin_lr` is above the base rate, or the warm-up
    /// is not shorter than `max_update` (poly, cosine).
    pub fn warmup(mut self, steps: u64, begin_lr: f64, mode: WarmupMode) -> Result<Self> {
        if begin_lr > self.warmup_final_lr {
            return Err(Error::invalid_argument("scheduler: the warm-up must begin below the base rate"));
        }
        if let Kind::Poly { max_update, .. } | Kind::Cosine { max_update, .. } = self.kind
            && steps >= max_update
        {
            return Err(Error::invalid_argument("scheduler: max_update must exceed the warm-up steps"));
        }
        self.warmup_steps = steps;
        self.warmup_begin_lr = begin_lr;
        self.warmup_mode = mode;
        Ok(self)
    }

    /// Whether `other` is a schedule of the same kind (factor, multi-factor, ...).
    pub(crate) fn same_kind(&self, other: &LrScheduler) -> bool {
        std::mem::discriminant(&self.kind) == std::mem::discriminant(&other.kind)
    }

    /// Sets the base rate from the optimizer's learning rate (MXNet's `Optimizer`
    /// assigns `lr_scheduler.base_lr = learning_rate`).
    pub(crate) fn set_optimizer_lr(&mut self, lr: f64) {
        self.base_lr = lr;
    }

    fn warmup_lr(&self, num_update: u64) -> f64 {
        match self.warmup_mode {
            WarmupMode::Linear => {
                let increase =
                    (self.warmup_final_lr - self.warmup_begin_lr) * num_update as f64 / self.warmup_steps as f64;
                self.warmup_begin_lr + increase
            }
            WarmupMode::Constant => self.warmup_begin_lr,
        }
    }

    /// The rate for update number `num_update`; advances the schedule's state.
    ///
    /// ```
    /// use kvstore_core::LrScheduler;
    /// let mut s = LrScheduler::factor(1, 0.5)?.base_lr(2.0);
    /// assert_eq!(s.lr(1), 2.0);
    /// assert_eq!(s.lr(3), 0.5); // halved after updates 1 and 2
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn lr(&mut self, num_update: u64) -> f64 {
        if num_update < self.warmup_steps {
            return self.warmup_lr(num_update);
        }
        let warmup = self.warmup_steps;
        match &mut self.kind {
            Kind::Factor { step, factor, stop_factor_lr, count } => {
                while num_update > count.saturating_add(*step) {
                    *count += *step;
                    let before = self.base_lr;
                    self.base_lr *= *factor;
                    if self.base_lr < *stop_factor_lr {
                        self.base_lr = *stop_factor_lr;
                    }
                    if self.base_lr.to_bits() == before.to_bits() {
                        // A fixed point (the floor, or a factor of 1): the remaining steps
                        // change nothing but the count, so skip them at once (a count
                        // far ahead would otherwise loop for a very long time).
                        let remaining = (num_update - 1 - *count) / *step;
                        *count += remaining * *step;
                    }
                }
            }
            Kind::MultiFactor { steps, factor, cur_step_ind, count } => {
                while let Some(&s) = steps.get(*cur_step_ind) {
                    if num_update > s {
                        *count = s;
                        *cur_step_ind += 1;
                        self.base_lr *= *factor;
                    } else {
                        break;
                    }
                }
            }
            Kind::Poly { max_update, pwr, final_lr, base_lr_orig } => {
                if num_update <= *max_update {
                    let max_steps = (*max_update - warmup) as f64;
                    let frac = 1.0 - (num_update - warmup) as f64 / max_steps;
                    self.base_lr = *final_lr + (*base_lr_orig - *final_lr) * frac.powf(*pwr);
                }
            }
            Kind::Cosine { max_update, final_lr, base_lr_orig } => {
                if num_update <= *max_update {
                    let max_steps = (*max_update - warmup) as f64;
                    let phase = std::f64::consts::PI * (num_update - warmup) as f64 / max_steps;
                    self.base_lr = *final_lr + (*base_lr_orig - *final_lr) * (1.0 + phase.cos()) / 2.0;
                }
            }
        }
        self.base_lr
    }

    /// The schedule and its state, for optimizer-state files: under `"kind"` the
    /// [`ScheduleKind`] (every option written out) with the kind's own state, beside it
    /// the state every kind has.
    pub(crate) fn to_json(&self) -> Value {
        let (spec, state) = match &self.kind {
            Kind::Factor { step, factor, stop_factor_lr, count } => (
                ScheduleKind::Factor { step: *step, factor: *factor, stop_factor_lr: Some(*stop_factor_lr) },
                json!({"count": count}),
            ),
            Kind::MultiFactor { steps, factor, cur_step_ind, count } => (
                ScheduleKind::MultiFactor { steps: steps.clone(), factor: *factor },
                json!({"cur_step_ind": cur_step_ind, "count": count}),
            ),
            Kind::Poly { max_update, pwr, final_lr, base_lr_orig } => (
                ScheduleKind::Poly { max_update: *max_update, pwr: Some(*pwr), final_lr: Some(*final_lr) },
                json!({"base_lr_orig": base_lr_orig}),
            ),
            Kind::Cosine { max_update, final_lr, base_lr_orig } => (
                ScheduleKind::Cosine { max_update: *max_update, final_lr: Some(*final_lr) },
                json!({"base_lr_orig": base_lr_orig}),
            ),
        };
        // Serialising numbers, strings and lists into a value cannot fail.
        let mut kind = serde_json::to_value(&spec).unwrap_or_default();
        if let (Value::Object(kind), Value::Object(state)) = (&mut kind, state) {
            kind.extend(state);
        }
        json!({
            "kind": kind,
            "base_lr": self.base_lr,
            "warmup_steps": self.warmup_steps,
            "warmup_begin_lr": self.warmup_begin_lr,
            "warmup_final_lr": self.warmup_final_lr,
            "warmup_mode": self.warmup_mode,
        })
    }

    /// Reads what [`LrScheduler::to_json`] wrote (state-file versions 1 and 2 alike).
    pub(crate) fn from_json(v: &Value) -> Option<Self> {
        let k = v["kind"].as_object()?;
        // Other fields are ignored, as they always were.
        let (spec, _) = ScheduleKind::from_object(k).ok()?;
        let f = |v: &Value, name: &str| v[name].as_f64();
        let u = |v: &Value, name: &str| v[name].as_u64();
        let k = &v["kind"];
        // A state file writes every option out: one missing is a corrupt file.
        let kind = match spec {
            ScheduleKind::Factor { step, factor, stop_factor_lr } => {
                Kind::Factor { step, factor, stop_factor_lr: stop_factor_lr?, count: u(k, "count")? }
            }
            ScheduleKind::MultiFactor { steps, factor } => Kind::MultiFactor {
                steps,
                factor,
                cur_step_ind: usize::try_from(u(k, "cur_step_ind")?).ok()?,
                count: u(k, "count")?,
            },
            ScheduleKind::Poly { max_update, pwr, final_lr } => {
                Kind::Poly { max_update, pwr: pwr?, final_lr: final_lr?, base_lr_orig: f(k, "base_lr_orig")? }
            }
            ScheduleKind::Cosine { max_update, final_lr } => {
                Kind::Cosine { max_update, final_lr: final_lr?, base_lr_orig: f(k, "base_lr_orig")? }
            }
        };
        // What the constructors refuse, and counters that could wrap, are refused here
        // too: such a schedule would loop forever or overflow.
        let max = super::MAX_COUNT;
        let warmup_steps = u(v, "warmup_steps")?;
        let ok = warmup_steps <= max
            && match &kind {
                Kind::Factor { step, count, .. } => (1..=max).contains(step) && *count <= max,
                Kind::MultiFactor { steps, cur_step_ind, count, .. } => {
                    steps.first().is_some_and(|&s| s >= 1)
                        && steps.windows(2).all(|w| w[0] < w[1])
                        && steps.last().is_some_and(|&s| s <= max)
                        && *cur_step_ind <= steps.len()
                        && *count <= max
                }
                Kind::Poly { max_update, .. } | Kind::Cosine { max_update, .. } => {
                    (1..=max).contains(max_update) && warmup_steps < *max_update
                }
            };
        if !ok {
            return None;
        }
        Some(LrScheduler {
            kind,
            base_lr: f(v, "base_lr")?,
            warmup_steps,
            warmup_begin_lr: f(v, "warmup_begin_lr")?,
            warmup_final_lr: f(v, "warmup_final_lr")?,
            warmup_mode: match v["warmup_mode"].as_str()? {
                "linear" => WarmupMode::Linear,
                "constant" => WarmupMode::Constant,
                _ => return None,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factor_steps_down_every_step_updates_and_stops() {
        let mut s = LrScheduler::factor(2, 0.5).unwrap().stop_factor_lr(0.2);
        s.set_optimizer_lr(1.0);
        let lrs: Vec<f64> = (1..=8).map(|n| s.lr(n)).collect();
        assert_eq!(lrs, [1.0, 1.0, 0.5, 0.5, 0.25, 0.25, 0.2, 0.2]);
    }

    #[test]
    fn a_factor_schedule_far_ahead_skips_the_steps_that_change_nothing() {
        let mut s = LrScheduler::factor(1, 0.5).unwrap();
        s.set_optimizer_lr(1.0);
        let mut stepped = s.clone();
        assert_eq!(s.lr(1 << 52), 1e-8);
        // The same as stepping through, where it can be checked.
        let direct: Vec<f64> = (1..2000).map(|n| stepped.lr(n)).collect();
        let mut jumped = LrScheduler::factor(1, 0.5).unwrap();
        jumped.set_optimizer_lr(1.0);
        assert_eq!(jumped.lr(1999), direct[1998]);
        assert_eq!(jumped, stepped);
    }

    #[test]
    fn schedules_that_would_loop_or_wrap_are_refused_from_json() {
        let mut v = LrScheduler::factor(2, 0.5).unwrap().to_json();
        v["kind"]["step"] = 0.into();
        assert_eq!(LrScheduler::from_json(&v), None);
        let mut v = LrScheduler::factor(2, 0.5).unwrap().to_json();
        v["kind"]["count"] = u64::MAX.into();
        assert_eq!(LrScheduler::from_json(&v), None);
        let mut v = LrScheduler::poly(10, 2.0, 0.0).unwrap().to_json();
        v["warmup_steps"] = 20.into();
        assert_eq!(LrScheduler::from_json(&v), None);
    }

    #[test]
    fn a_state_files_kind_is_the_schedule_kinds_json_with_the_state_beside_it() {
        let cases = [
            (LrScheduler::factor(2, 0.5).unwrap(), &["count"][..]),
            (LrScheduler::multi_factor(&[2, 5], 0.1).unwrap(), &["cur_step_ind", "count"][..]),
            (LrScheduler::poly(10, 2.0, 0.0).unwrap(), &["base_lr_orig"][..]),
            (LrScheduler::cosine(10, 0.0).unwrap(), &["base_lr_orig"][..]),
        ];
        for (s, state) in cases {
            let v = s.to_json();
            let mut kind = v["kind"].as_object().unwrap().clone();
            for name in state {
                assert!(kind.remove(*name).is_some(), "{name} in {v}");
            }
            let (spec, _) = ScheduleKind::from_object(&kind).unwrap();
            assert_eq!(serde_json::to_value(&spec).unwrap(), Value::Object(kind));
            assert_eq!(LrScheduler::from_json(&v), Some(s));
        }
    }

    #[test]
    fn schedules_round_trip_through_json() {
        let mut s = LrScheduler::multi_factor(&[2, 5], 0.1).unwrap().warmup(1, 0.0, WarmupMode::Linear).unwrap();
        s.lr(3);
        assert_eq!(LrScheduler::from_json(&s.to_json()), Some(s));
        let c = LrScheduler::cosine(10, 0.0).unwrap().base_lr(0.5);
        assert_eq!(LrScheduler::from_json(&c.to_json()), Some(c));
    }
}
