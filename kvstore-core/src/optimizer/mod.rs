//! Optimizers on the store: what `set_optimizer` installs. Each push of gradients updates
//! the weights in place, with MXNet 1.9.1's Python rules and defaults (reference §4.2),
//! `rescale_grad`, `clip_gradient`, `wd`, per-key `lr_mult`/`wd_mult`, per-key update
//! counts and learning-rate schedulers. The per-key state (momentum, ...) lives next to
//! the key's value in the store.
//!
//! ```
//! use kvstore_core::{KVStore, NDArray, Optimizer};
//! let kv = KVStore::create("local")?;
//! kv.init(3, &NDArray::zeros(&[2, 2])?)?;
//! kv.set_optimizer(Optimizer::builder("sgd").build()?)?;   // lr 0.01
//! kv.push(3, &NDArray::ones(&[2, 2])?, 0)?;
//! let w = NDArray::zeros(&[2, 2])?;
//! kv.pull(3, &w, 0)?;
//! assert_eq!(w.to_vec::<f32>()?, vec![-0.01; 4]);
//! # Ok::<(), kvstore_core::Error>(())
//! ```

mod rules;
mod scheduler;
mod spec;
pub(crate) mod states;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Range;

use half::{bf16, f16};

use crate::device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::key::Key;
use crate::ndarray::{NDArray, RowSparse};

pub use scheduler::{LrScheduler, WarmupMode};
pub use spec::{OptimizerSpec, ParamValue, ScheduleKind, ScheduleSpec};

use rules::{Rule, Step};

pub(crate) use states::Snapshot;

/// An optimizer's name, the hyper-parameters it takes beyond the common ones, and their
/// MXNet defaults (`NaN`: unset, as Python's `None`).
struct Spec {
    name: &'static str,
    aliases: &'static [&'static str],
    default_lr: f64,
    params: &'static [(&'static str, f64)],
    sched_lr: SchedLr,
}

/// When MXNet's `Optimizer.__init__` hands the learning rate to the schedule
/// (`lr_scheduler.base_lr = learning_rate`): it does so when `learning_rate` reaches
/// it, which depends on whether the optimizer's constructor passes its own default.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SchedLr {
    /// Always (the optimizer passes its default rate on: adam, rmsprop, ...).
    Always,
    /// Only when the caller set `learning_rate` (sgd, nag, ...).
    IfExplicit,
    /// Never (ftrl).
    Never,
}

/// The largest update count (2^53, the last integer of a run of f64 integers): counts
/// enter the rules as floats, and a count that wrapped around would turn the next update
/// into NaN or infinity. `begin_num_update`, state files and the per-key counts are
/// held to it.
pub(crate) const MAX_COUNT: u64 = 1 << 53;

/// Hyper-parameters every optimizer takes, with MXNet's defaults (`learning_rate` comes
/// from the optimizer's spec).
const COMMON: &[(&str, f64)] = &[
    ("learning_rate", f64::NAN),
    ("wd", 0.0),
    ("rescale_grad", 1.0),
    ("clip_gradient", f64::NAN),
    ("multi_precision", 0.0),
    ("begin_num_update", 0.0),
];

const SPECS: &[Spec] = &[
    Spec {
        name: "sgd",
        aliases: &["ccsgd"],
        default_lr: 0.01,
        params: &[("momentum", 0.0), ("lazy_update", 1.0)],
        sched_lr: SchedLr::IfExplicit,
    },
    Spec { name: "nag", aliases: &[], default_lr: 0.01, params: &[("momentum", 0.0)], sched_lr: SchedLr::IfExplicit },
    Spec {
        name: "adam",
        aliases: &[],
        default_lr: 0.001,
        params: &[("beta1", 0.9), ("beta2", 0.999), ("epsilon", 1e-8), ("lazy_update", 1.0)],
        sched_lr: SchedLr::Always,
    },
    Spec { name: "adagrad", aliases: &[], default_lr: 0.01, params: &[("eps", 1e-7)], sched_lr: SchedLr::IfExplicit },
    Spec {
        name: "rmsprop",
        aliases: &[],
        default_lr: 0.001,
        params: &[("gamma1", 0.9), ("gamma2", 0.9), ("epsilon", 1e-8), ("centered", 0.0), ("clip_weights", f64::NAN)],
        sched_lr: SchedLr::Always,
    },
    Spec {
        name: "adadelta",
        aliases: &[],
        default_lr: 0.01,
        params: &[("rho", 0.9), ("epsilon", 1e-5)],
        sched_lr: SchedLr::IfExplicit,
    },
    Spec {
        name: "ftrl",
        aliases: &[],
        default_lr: 0.1,
        params: &[("lamda1", 0.01), ("beta", 1.0)],
        sched_lr: SchedLr::Never,
    },
    Spec {
        name: "signum",
        aliases: &[],
        default_lr: 0.01,
        params: &[("momentum", 0.9), ("wd_lh", 0.0)],
        sched_lr: SchedLr::Always,
    },
    Spec { name: "sgld", aliases: &[], default_lr: 0.01, params: &[("seed", 0.0)], sched_lr: SchedLr::IfExplicit },
    Spec {
        name: "dcasgd",
        aliases: &[],
        default_lr: 0.01,
        params: &[("momentum", 0.0), ("lamda", 0.04)],
        sched_lr: SchedLr::IfExplicit,
    },
    Spec {
        name: "adamax",
        aliases: &[],
        default_lr: 0.002,
        params: &[("beta1", 0.9), ("beta2", 0.999)],
        sched_lr: SchedLr::Always,
    },
    Spec {
        name: "nadam",
        aliases: &[],
        default_lr: 0.001,
        params: &[("beta1", 0.9), ("beta2", 0.999), ("epsilon", 1e-8), ("schedule_decay", 0.004)],
        sched_lr: SchedLr::Always,
    },
    Spec {
        name: "lamb",
        aliases: &[],
        default_lr: 0.001,
        params: &[
            ("beta1", 0.9),
            ("beta2", 0.999),
            ("epsilon", 1e-6),
            ("lower_bound", f64::NAN),
            ("upper_bound", f64::NAN),
            ("bias_correction", 1.0),
        ],
        sched_lr: SchedLr::Always,
    },
    // FTML's constructor passes no rate of its own: MXNet's default 0.01.
    Spec {
        name: "ftml",
        aliases: &[],
        default_lr: 0.01,
        params: &[("beta1", 0.6), ("beta2", 0.999), ("epsilon", 1e-8)],
        sched_lr: SchedLr::IfExplicit,
    },
    // LBSGD's warmup_strategy is a code of `rules::LBSGD_STRATEGIES` (0: linear).
    Spec {
        name: "lbsgd",
        aliases: &[],
        default_lr: 0.01,
        params: &[
            ("momentum", 0.0),
            ("warmup_strategy", 0.0),
            ("warmup_epochs", 5.0),
            ("batch_scale", 1.0),
            ("updates_per_epoch", 32.0),
            ("begin_epoch", 0.0),
            ("num_epochs", 60.0),
        ],
        sched_lr: SchedLr::IfExplicit,
    },
    Spec {
        name: "lars",
        aliases: &[],
        default_lr: 0.01,
        params: &[("momentum", 0.0), ("eta", 0.001), ("eps", 0.0), ("momentum_correction", 1.0), ("lazy_update", 1.0)],
        sched_lr: SchedLr::IfExplicit,
    },
];

/// Hyper-parameters MXNet takes as names: (optimizer, parameter, the names, in the
/// order of their codes). A name that is not listed has the next code: MXNet accepts
/// any name there and treats the others alike.
const TEXT_PARAMS: &[(&str, &str, &[&str])] = &[("lbsgd", "warmup_strategy", &rules::LBSGD_STRATEGIES)];

/// The names hyper-parameter `param` of optimizer `optimizer` takes, if it takes names.
fn text_param(optimizer: &str, param: &str) -> Option<&'static [&'static str]> {
    let optimizer = spec(optimizer)?.name;
    TEXT_PARAMS.iter().find(|(o, p, _)| *o == optimizer && *p == param).map(|t| t.2)
}

/// The code of `value` for a hyper-parameter MXNet takes as a name.
fn text_param_code(optimizer: &str, param: &str, value: &str) -> Result<f64> {
    let Some(names) = text_param(optimizer, param) else {
        return Err(Error::invalid_argument(format!(
            "optimizer {}: hyper-parameter \"{}\" takes a number, not the name \"{}\"",
            crate::key::shorten(optimizer),
            crate::key::shorten(param),
            crate::key::shorten(value)
        )));
    };
    let lower = value.to_ascii_lowercase();
    Ok(names.iter().position(|n| *n == lower).unwrap_or(names.len()) as f64)
}

fn spec(name: &str) -> Option<&'static Spec> {
    let lower = name.to_ascii_lowercase();
    SPECS.iter().find(|s| s.name == lower || s.aliases.contains(&lower.as_str()))
}

/// The names of every optimizer, for messages and bindings.
///
/// ```
/// let names = kvstore_core::optimizer_names();
/// assert_eq!(names.len(), 16);
/// assert!(names.contains(&"adam") && names.contains(&"lars"));
/// ```
pub fn optimizer_names() -> Vec<&'static str> {
    SPECS.iter().map(|s| s.name).collect()
}

/// Resolved hyper-parameters: every name of the optimizer's spec, with its value.
#[derive(Debug, Clone, PartialEq)]
struct Params(BTreeMap<&'static str, f64>);

impl Params {
    /// The value of `name`, `None` when unset.
    fn get(&self, name: &str) -> Option<f64> {
        self.0.get(name).copied().filter(|v| !v.is_nan())
    }

    /// The value of `name`, 0 when unset.
    fn num(&self, name: &str) -> f64 {
        self.get(name).unwrap_or(0.0)
    }
}

/// Builds an [`Optimizer`] by name, with MXNet's hyper-parameter names.
#[derive(Debug, Clone)]
pub struct OptimizerBuilder {
    name: String,
    params: Vec<(String, f64)>,
    /// Hyper-parameters given as names ([`OptimizerBuilder::param_name`]).
    names: Vec<(String, String)>,
    scheduler: Option<LrScheduler>,
    lr_mult: HashMap<Key, f64>,
    wd_mult: HashMap<Key, f64>,
}

impl OptimizerBuilder {
    /// Sets a hyper-parameter by its MXNet name (`learning_rate`, `momentum`, `wd`, ...);
    /// booleans are 0 or 1.
    ///
    /// ```
    /// use kvstore_core::Optimizer;
    /// let opt = Optimizer::builder("sgd").param("learning_rate", 0.1).param("wd", 1e-4).build()?;
    /// assert_eq!((opt.param("learning_rate"), opt.param("wd")), (Some(0.1), Some(1e-4)));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn param(mut self, name: &str, value: f64) -> Self {
        self.params.push((name.to_string(), value));
        self
    }

    /// Sets a hyper-parameter that MXNet takes as a name: LBSGD's `warmup_strategy`
    /// (`"linear"`, `"power2"`, `"sqrt"` or `"lars"`; any other name scales the rate by
    /// 1, as in MXNet). [`OptimizerBuilder::build`] says which parameters take names.
    ///
    /// ```
    /// use kvstore_core::Optimizer;
    /// let opt = Optimizer::builder("lbsgd").param_name("warmup_strategy", "lars").param("batch_scale", 4.0).build()?;
    /// assert_eq!(opt.param("warmup_strategy"), Some(3.0)); // its code
    /// assert!(Optimizer::builder("sgd").param_name("momentum", "high").build().is_err());
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn param_name(mut self, name: &str, value: &str) -> Self {
        self.names.push((name.to_string(), value.to_string()));
        self
    }

    /// The learning-rate schedule; its base rate becomes the optimizer's learning rate.
    ///
    /// ```
    /// use kvstore_core::{KVStore, LrScheduler, NDArray, Optimizer};
    /// let halve = LrScheduler::factor(1, 0.5)?; // halve the rate after every update
    /// let opt = Optimizer::builder("sgd").param("learning_rate", 1.0).lr_scheduler(halve).build()?;
    /// let (kv, w) = (KVStore::create("local")?, NDArray::zeros(&[1])?);
    /// kv.init("w", &w)?;
    /// kv.set_optimizer(opt)?;
    /// kv.push("w", &NDArray::ones(&[1])?, 0)?; // rate 1
    /// kv.pushpull("w", &NDArray::ones(&[1])?, &w, 0)?; // rate 0.5
    /// assert_eq!(w.to_vec::<f32>()?, vec![-1.5]);
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn lr_scheduler(mut self, scheduler: LrScheduler) -> Self {
        self.scheduler = Some(scheduler);
        self
    }

    /// Multiplies the learning rate of `key` by `mult`.
    ///
    /// A multiplier that is not finite is an error at [`OptimizerBuilder::build`].
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray, Optimizer};
    /// let opt = Optimizer::builder("sgd").param("learning_rate", 1.0).lr_mult("bias", 0.5).build()?;
    /// let (kv, ws) = (KVStore::create("local")?, [NDArray::zeros(&[1])?, NDArray::zeros(&[1])?]);
    /// kv.init(&["w", "bias"], &ws)?;
    /// kv.set_optimizer(opt)?;
    /// let grads = [NDArray::ones(&[1])?, NDArray::ones(&[1])?];
    /// kv.pushpull(&["w", "bias"], &grads, &ws, 0)?;
    /// assert_eq!((ws[0].to_vec::<f32>()?, ws[1].to_vec::<f32>()?), (vec![-1.0], vec![-0.5]));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn lr_mult(mut self, key: impl Into<Key>, mult: f64) -> Self {
        self.lr_mult.insert(key.into(), mult);
        self
    }

    /// Multiplies the weight decay of `key` by `mult`.
    ///
    /// ```
    /// use kvstore_core::{KVStore, NDArray, Optimizer};
    /// let opt = Optimizer::builder("sgd").param("learning_rate", 1.0).param("wd", 0.5);
    /// let opt = opt.wd_mult("bias", 0.0).build()?;
    /// let (kv, ws) = (KVStore::create("local")?, [NDArray::ones(&[1])?, NDArray::ones(&[1])?]);
    /// kv.init(&["w", "bias"], &ws)?;
    /// kv.set_optimizer(opt)?;
    /// let grads = [NDArray::zeros(&[1])?, NDArray::zeros(&[1])?];
    /// kv.pushpull(&["w", "bias"], &grads, &ws, 0)?; // w -= 1 * (0 + 0.5 * w); bias has no decay
    /// assert_eq!((ws[0].to_vec::<f32>()?, ws[1].to_vec::<f32>()?), (vec![0.5], vec![1.0]));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn wd_mult(mut self, key: impl Into<Key>, mult: f64) -> Self {
        self.wd_mult.insert(key.into(), mult);
        self
    }

    /// The optimizer.
    ///
    /// ```
    /// use kvstore_core::{ErrorKind, Optimizer};
    /// let opt = Optimizer::builder("nag").param("momentum", 0.9).build()?;
    /// assert_eq!(opt.param("momentum"), Some(0.9));
    /// let e = Optimizer::builder("sgd").param("beta1", 0.9).build().err(); // sgd has no beta1
    /// assert_eq!(e.map(|e| e.kind()), Some(ErrorKind::InvalidArgument));
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unknown optimizer or hyper-parameter name (the
    /// message lists the valid ones), or a value out of range.
    pub fn build(self) -> Result<Optimizer> {
        let Some(spec) = spec(&self.name) else {
            return Err(Error::invalid_argument(format!(
                "unknown optimizer \"{}\": known optimizers are {}",
                crate::key::shorten(&self.name),
                optimizer_names().join(", ")
            )));
        };
        let mut params: BTreeMap<&'static str, f64> = COMMON.iter().chain(spec.params).copied().collect();
        params.insert("learning_rate", spec.default_lr);
        let mut given = self.params.clone();
        for (name, value) in &self.names {
            given.push((name.clone(), text_param_code(spec.name, name, value)?));
        }
        for (name, value) in &given {
            let Some((&known, _)) = params.get_key_value(name.as_str()) else {
                let valid: Vec<&str> = COMMON.iter().chain(spec.params).map(|p| p.0).collect();
                return Err(Error::invalid_argument(format!(
                    "optimizer {}: unknown hyper-parameter \"{}\": valid names are {}",
                    spec.name,
                    crate::key::shorten(name),
                    valid.join(", ")
                )));
            };
            params.insert(known, *value);
        }
        let params = Params(params);
        check_params(spec.name, &params)?;
        if let Some((k, m)) = self.lr_mult.iter().chain(&self.wd_mult).find(|(_, m)| !m.is_finite()) {
            return Err(Error::invalid_argument(format!(
                "optimizer {}: the multiplier of key \"{k}\" is {m}, not a finite number",
                spec.name
            )));
        }
        let rule = rules::make_rule(spec.name, &|n| params.get(n))?;
        let mut scheduler = self.scheduler;
        let explicit_lr = self.params.iter().any(|(n, _)| n == "learning_rate");
        let hand_over = match spec.sched_lr {
            SchedLr::Always => true,
            SchedLr::IfExplicit => explicit_lr,
            SchedLr::Never => false,
        };
        if let Some(s) = scheduler.as_mut().filter(|_| hand_over) {
            s.set_optimizer_lr(params.num("learning_rate"));
        }
        Ok(Optimizer { name: spec.name, params, rule, scheduler, lr_mult: self.lr_mult, wd_mult: self.wd_mult })
    }
}

/// Checks what would corrupt the store's state, and nothing else: MXNet 1.9.1 accepts
/// any number for a hyper-parameter (a negative learning rate is gradient ascent,
/// a momentum of 1 or more diverges, as the user asked), and so does this. Refused:
/// infinite values (every update would make the weights NaN or infinite), and counters
/// (`begin_num_update`, `seed`) that are not whole numbers from 0 to 2^53, which would
/// wrap around.
fn check_params(name: &str, p: &Params) -> Result<()> {
    let bad = |what: &str| Err(Error::invalid_argument(format!("optimizer {name}: {what}")));
    if let Some((k, v)) = p.0.iter().find(|(_, v)| v.is_infinite()) {
        return bad(&format!("{k} is {v}: hyper-parameters must be finite"));
    }
    for counter in ["begin_num_update", "seed"] {
        if p.get(counter).is_some_and(|v| v < 0.0 || v.fract() != 0.0 || v > MAX_COUNT as f64) {
            return bad(&format!("{counter} must be a whole number from 0 to 2^53, not {}", p.num(counter)));
        }
    }
    Ok(())
}

/// An optimizer: a rule, its hyper-parameters, an optional schedule and per-key
/// multipliers. Install it with [`crate::KVStore::set_optimizer`].
pub struct Optimizer {
    name: &'static str,
    params: Params,
    rule: Box<dyn Rule>,
    scheduler: Option<LrScheduler>,
    lr_mult: HashMap<Key, f64>,
    wd_mult: HashMap<Key, f64>,
}

impl fmt::Debug for Optimizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Optimizer").field("name", &self.name).field("params", &self.params.0).finish_non_exhaustive()
    }
}

impl Optimizer {
    /// A builder for the optimizer `name` (`sgd`, `nag`, `adam`, `adagrad`, `rmsprop`,
    /// `adadelta`, `ftrl`, `signum`, `sgld`, `dcasgd`, `adamax`, `nadam`, `lamb`,
    /// `lars`; case-insensitive), every hyper-parameter at MXNet's default.
    ///
    /// ```
    /// use kvstore_core::Optimizer;
    /// let opt = Optimizer::builder("SGD").param("momentum", 0.9).build()?;
    /// assert_eq!(opt.name(), "sgd");
    /// assert_eq!(opt.param("learning_rate"), Some(0.01)); // MXNet's default
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn builder(name: &str) -> OptimizerBuilder {
        OptimizerBuilder {
            name: name.to_string(),
            params: Vec::new(),
            names: Vec::new(),
            scheduler: None,
            lr_mult: HashMap::new(),
            wd_mult: HashMap::new(),
        }
    }

    /// The optimizer's name.
    ///
    /// ```
    /// use kvstore_core::Optimizer;
    /// assert_eq!(Optimizer::builder("Adam").build()?.name(), "adam");
    /// assert_eq!(Optimizer::builder("ccsgd").build()?.name(), "sgd"); // MXNet's alias
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The value of a hyper-parameter (`None` if unset or not one of this optimizer's).
    ///
    /// ```
    /// use kvstore_core::Optimizer;
    /// let adam = Optimizer::builder("adam").param("beta1", 0.8).build()?;
    /// assert_eq!((adam.param("beta1"), adam.param("epsilon")), (Some(0.8), Some(1e-8)));
    /// assert_eq!(adam.param("clip_gradient"), None); // unset
    /// assert_eq!(adam.param("momentum"), None); // not one of adam's
    /// # Ok::<(), kvstore_core::Error>(())
    /// ```
    pub fn param(&self, name: &str) -> Option<f64> {
        self.params.get(name)
    }
}

/// The per-key state: next to the key's value in the store.
#[derive(Debug)]
pub(crate) struct KeyState {
    /// This key's update count (MXNet's `_index_update_count`).
    pub count: u64,
    /// The rule's state arrays (f32, or f64 for f64 weights).
    pub states: Vec<NDArray>,
    /// The f32 master copy of an f16/bf16 weight under `multi_precision`.
    pub master: Option<NDArray>,
}

/// An installed optimizer and its mutable, store-wide state.
pub(crate) struct Runtime {
    opt: Optimizer,
    /// The optimizer as the workers of a `dist_sync` job compare it (every push's
    /// fingerprint holds it, made once here): its name, hyper-parameters, schedule and
    /// multipliers.
    identity: String,
    /// `num_update`, the schedule's state and the rule's global values, together.
    global: parking_lot::Mutex<Global>,
    /// Restored from a commit and neither set again nor used by the resumed program:
    /// its first `set_optimizer` of the same optimizer keeps this one, state and all
    /// ([`crate::KVStore::set_optimizer`]); after its first update, a `set_optimizer`
    /// replaces it as ever.
    resumed: std::sync::atomic::AtomicBool,
}

struct Global {
    num_update: u64,
    scheduler: Option<LrScheduler>,
    values: Vec<f64>,
}

/// The compute type of a weight dtype: f64 for f64, f32 for the others.
pub(crate) fn state_dtype(weight: DType) -> DType {
    if weight == DType::F64 { DType::F64 } else { DType::F32 }
}

impl Runtime {
    pub(crate) fn new(opt: Optimizer) -> Self {
        let global = Global {
            num_update: opt.params.num("begin_num_update") as u64,
            scheduler: opt.scheduler.clone(),
            values: opt.rule.global_init(),
        };
        let mut lr: Vec<_> = opt.lr_mult.iter().collect();
        let mut wd: Vec<_> = opt.wd_mult.iter().collect();
        lr.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        wd.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        let identity =
            format!(", with the optimizer {} {:?} {:?} {lr:?} {wd:?}", opt.name, opt.params.0, opt.scheduler);
        let resumed = std::sync::atomic::AtomicBool::new(false);
        Runtime { opt, identity, global: parking_lot::Mutex::new(global), resumed }
    }

    /// Marks it restored from a commit (see the field).
    pub(crate) fn mark_resumed(&self) {
        self.resumed.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether it was restored from a commit and not yet set again; the first call that
    /// finds it so says it no longer is when `set_again` is the same optimizer.
    pub(crate) fn resumed_as(&self, set_again: &Runtime) -> Option<bool> {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.resumed.load(Relaxed) {
            return None;
        }
        let same = self.identity == set_again.identity;
        if same {
            self.resumed.store(false, Relaxed);
        }
        Some(same)
    }

    /// The optimizer as workers compare it (see the field).
    pub(crate) fn identity(&self) -> &str {
        &self.identity
    }

    /// How `other` differs from this optimizer, setting by setting (`this` and `that`
    /// name the two in what is said): its name, hyper-parameters, schedule, multipliers.
    pub(crate) fn differences(&self, other: &Runtime, this: &str, that: &str) -> Vec<String> {
        let (a, b) = (&self.opt, &other.opt);
        let mut said = Vec::new();
        let mut differ = |what: &str, x: String, y: String| {
            if x != y {
                said.push(format!("{what}: {x} {this}, {y} {that}"));
            }
        };
        differ("the optimizer", a.name.to_string(), b.name.to_string());
        let shown = |p: &Params, name: &str| p.get(name).map_or("unset".to_string(), |v| v.to_string());
        let names: std::collections::BTreeSet<&str> = a.params.0.keys().chain(b.params.0.keys()).copied().collect();
        for name in names {
            differ(name, shown(&a.params, name), shown(&b.params, name));
        }
        differ("the schedule", format!("{:?}", a.scheduler), format!("{:?}", b.scheduler));
        let sorted = |m: &HashMap<Key, f64>| format!("{:?}", m.iter().collect::<std::collections::BTreeMap<_, _>>());
        differ("lr_mult", sorted(&a.lr_mult), sorted(&b.lr_mult));
        differ("wd_mult", sorted(&a.wd_mult), sorted(&b.wd_mult));
        said
    }

    pub(crate) fn optimizer(&self) -> &Optimizer {
        &self.opt
    }

    /// The store-wide state, for a state file.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let g = self.global.lock();
        Snapshot { num_update: g.num_update, scheduler: g.scheduler.clone(), values: g.values.clone() }
    }

    /// Checks a snapshot read from a file before anything is restored.
    pub(crate) fn check_snapshot(&self, s: &Snapshot, context: &str) -> Result<()> {
        let g = self.global.lock();
        if s.values.len() != g.values.len() {
            return Err(Error::invalid_argument(format!(
                "{context}: the file holds {} shared values of optimizer {}, which has {}",
                s.values.len(),
                self.opt.name,
                g.values.len()
            )));
        }
        Ok(())
    }

    /// Restores the store-wide state read from a file: the counter, the rule's shared
    /// values, and the schedule's progress when the installed optimizer has a schedule
    /// of the same kind (the installed schedule is never replaced or added).
    pub(crate) fn restore(&self, s: Snapshot) {
        let mut g = self.global.lock();
        g.num_update = s.num_update;
        g.values = s.values;
        if let (Some(mine), Some(saved)) = (&mut g.scheduler, s.scheduler)
            && mine.same_kind(&saved)
        {
            *mine = saved;
        }
    }

    /// Checks that a state read from a file fits `weight`: the state dtype follows the
    /// weight's, and f16/bf16 weights under `multi_precision` have a master copy.
    pub(crate) fn check_loaded(&self, key: &Key, weight: &NDArray, state: &KeyState) -> Result<()> {
        let states: Vec<DType> = state.states.iter().map(NDArray::dtype).collect();
        self.check_loaded_kinds(key, weight.dtype(), &states, state.master.is_some())
    }

    /// [`Runtime::check_loaded`] of a state known by its arrays' dtypes and whether it
    /// has a master copy.
    pub(crate) fn check_loaded_kinds(&self, key: &Key, weight: DType, states: &[DType], master: bool) -> Result<()> {
        let sd = state_dtype(weight);
        if let Some(&got) = states.iter().find(|&&d| d != sd) {
            return Err(Error::DTypeMismatch {
                context: format!("load_optimizer_states: the state of key \"{key}\" for its {weight} weight"),
                key: Some(key.clone()),
                expected: sd,
                got,
            });
        }
        let wants_master = self.opt.params.num("multi_precision") != 0.0 && matches!(weight, DType::F16 | DType::BF16);
        if wants_master != master {
            return Err(Error::invalid_argument(format!(
                "load_optimizer_states: key \"{key}\": the file was saved with multi_precision {}, the optimizer has it {}",
                if master { "on" } else { "off" },
                if wants_master { "on" } else { "off" }
            )));
        }
        Ok(())
    }

    /// Checks that a weight can be optimized, before anything of a push changes.
    pub(crate) fn check_weight(&self, key: &Key, w: &NDArray) -> Result<()> {
        if w.dtype().is_float() {
            Ok(())
        } else {
            Err(Error::DTypeMismatch {
                context: format!("push of key \"{key}\" with optimizer {} (weights must be float)", self.opt.name),
                key: Some(key.clone()),
                expected: DType::F32,
                got: w.dtype(),
            })
        }
    }

    pub(crate) fn new_state(&self, w: &NDArray) -> Result<KeyState> {
        let sd = state_dtype(w.dtype());
        let states = (0..self.opt.rule.states().len())
            .map(|i| {
                if self.opt.rule.state_starts_as_weight(i) {
                    w.as_type(sd)
                } else {
                    NDArray::zeros_with(w.shape(), sd, w.context())
                }
            })
            .collect::<Result<_>>()?;
        let master = match (self.opt.params.num("multi_precision") != 0.0, w.dtype()) {
            (true, DType::F16 | DType::BF16) => Some(w.as_type(DType::F32)?),
            _ => None,
        };
        Ok(KeyState { count: self.opt.params.num("begin_num_update") as u64, states, master })
    }

    /// The state of the elements `part` of `w` (flat), as a rank that owns that part of
    /// the key holds it (`kvstore/layout.rs`): [`Runtime::new_state`] of those elements,
    /// on the host; the whole key's when `part` is all of it.
    pub(crate) fn new_state_part(&self, w: &NDArray, part: Range<usize>) -> Result<KeyState> {
        if part == (0..w.size()) {
            return self.new_state(w);
        }
        self.new_state(&w.flat_part(part)?)
    }

    /// One update of `weight` with gradient `grad` (same shape; any float dtype).
    pub(crate) fn update(
        &self,
        key: &Key,
        weight: &NDArray,
        grad: &NDArray,
        state: &mut Option<KeyState>,
    ) -> Result<()> {
        self.update_part(key, weight, grad, state, 0..weight.size())
    }

    /// One update of the elements `part` (flat) of `weight` with those of `grad`, with
    /// `state` the state of that part only ([`Runtime::new_state_part`]): what the rank
    /// that owns that part of the key runs under `dist_sync` with owners; the bits of
    /// those elements are those of the whole update. An empty part updates nothing but
    /// counts the update (the key's count, the shared values, the schedule), as every
    /// rank does for every key.
    pub(crate) fn update_part(
        &self,
        key: &Key,
        weight: &NDArray,
        grad: &NDArray,
        state: &mut Option<KeyState>,
        part: Range<usize>,
    ) -> Result<()> {
        self.step(key, weight, part.clone(), state, |step, values, st| self.apply(step, values, weight, grad, st, part))
    }

    /// Whether `state` (a key's, if it has one) may count one more update: checked for
    /// every key of a push before any key is updated, so that a push refused for it
    /// changes nothing.
    pub(crate) fn check_count(&self, key: &Key, state: Option<&KeyState>) -> Result<()> {
        let count = state.map_or(self.opt.params.num("begin_num_update") as u64, |st| st.count);
        match count >= MAX_COUNT {
            true => Err(Error::invalid_argument(format!(
                "push of key \"{key}\": its update count reached 2^53, the most an optimizer counts"
            ))),
            false => Ok(()),
        }
    }

    /// The optimizer's name.
    pub(crate) fn name(&self) -> &'static str {
        self.opt.name
    }

    /// Whether an update of a key in parts has the bits of the whole key's: every rule
    /// but those whose trust ratios need the whole key's norms (LAMB, LARS).
    pub(crate) fn updates_in_parts(&self) -> bool {
        !matches!(self.opt.name, "lamb" | "lars")
    }

    /// Whether MXNet updates this optimizer lazily on a row-sparse gradient: only the
    /// gradient's rows of the weight and of its states change (SGD and Adam with
    /// `lazy_update`, their default; AdaGrad and Ftrl always).
    pub(crate) fn lazy(&self) -> bool {
        match self.opt.name {
            "sgd" | "adam" => self.opt.params.num("lazy_update") != 0.0,
            "adagrad" | "ftrl" => true,
            _ => false,
        }
    }

    /// Whether a row-sparse gradient updates `weight` lazily: for a lazy optimizer
    /// ([`Runtime::lazy`]), an f32 or f64 weight, or an f16/bf16 one without
    /// `multi_precision` (MXNet's multi-precision kernels have no row-sparse form: they
    /// update densely).
    pub(crate) fn lazy_for(&self, weight: &NDArray) -> bool {
        self.lazy()
            && match weight.dtype() {
                DType::F32 | DType::F64 => true,
                DType::F16 | DType::BF16 => self.opt.params.num("multi_precision") == 0.0,
                _ => false,
            }
    }

    /// One lazy update of `weight` with the row-sparse gradient `grad` (where
    /// [`Runtime::lazy_for`] says so): the rule runs on each of its rows alone, on the
    /// elements `part` (flat) of `weight` only (all of them, or a rank's part under
    /// `dist_sync` with owners), `state` that part's ([`Runtime::update_part`]).
    pub(crate) fn update_rows_part(
        &self,
        key: &Key,
        weight: &NDArray,
        grad: &RowSparse,
        state: &mut Option<KeyState>,
        part: Range<usize>,
    ) -> Result<()> {
        self.step(key, weight, part.clone(), state, |step, values, st| {
            self.apply_rows(step, values, weight, grad, st, part)
        })
    }

    /// The rows of `grad` applied to `weight` and the states, one by one: the
    /// elements of each row in `part` (the states hold that part).
    #[allow(clippy::type_complexity)]
    fn apply_rows(
        &self,
        step: &Step,
        values: &[f64],
        weight: &NDArray,
        grad: &RowSparse,
        st: &mut KeyState,
        part: Range<usize>,
    ) -> Result<()> {
        fn rows<T: crate::Element>(
            rule: &dyn Rule,
            update: fn(&dyn Rule, &Step, &[f64], &mut [T], &[T], &mut [&mut [T]]),
            (step, values, part): (&Step, &[f64], Range<usize>),
            weight: &NDArray,
            grad: &RowSparse,
            states: &[NDArray],
        ) -> Result<()> {
            let rl = grad.row_len();
            let mut guards: Vec<_> = states.iter().map(NDArray::write).collect::<Result<_>>()?;
            let mut ss: Vec<&mut [T]> = guards.iter_mut().map(|b| b.typed_mut::<T>()).collect();
            grad.data().with_data(|g: &[T]| {
                weight.with_data_mut(|w: &mut [T]| {
                    for (i, &r) in grad.indices().iter().enumerate() {
                        let Some(span) = row_in_part(r as usize, rl, &part) else { continue };
                        let mut st_rows: smallvec::SmallVec<[&mut [T]; 4]> =
                            ss.iter_mut().map(|s| &mut s[span.start - part.start..span.end - part.start]).collect();
                        let in_row = span.start - r as usize * rl..span.end - r as usize * rl;
                        let g = &g[i * rl..(i + 1) * rl][in_row];
                        update(rule, step, values, &mut w[span], g, &mut st_rows);
                    }
                })
            })?
        }
        let rule = &*self.opt.rule;
        match weight.dtype() {
            DType::F32 => rows::<f32>(
                rule,
                |r, s, v, w, g, st| r.update_row_f32(s, v, w, g, st),
                (step, values, part),
                weight,
                grad,
                &st.states,
            ),
            DType::F64 => rows::<f64>(
                rule,
                |r, s, v, w, g, st| r.update_row_f64(s, v, w, g, st),
                (step, values, part),
                weight,
                grad,
                &st.states,
            ),
            // f16/bf16 (no master copy: MXNet updates those lazily too, and falls back
            // to the dense update under multi_precision).
            DType::F16 if st.master.is_none() => half_rows::<f16>(rule, (step, values, part), weight, grad, &st.states),
            DType::BF16 if st.master.is_none() => {
                half_rows::<bf16>(rule, (step, values, part), weight, grad, &st.states)
            }
            d => Err(Error::Internal(format!("a lazy update of a {d} weight"))),
        }
    }

    /// The bookkeeping of one update of `key` (its state made at its first, of the
    /// elements `part` of `weight`, its count, the learning rate, the shared values),
    /// around `apply`.
    fn step(
        &self,
        key: &Key,
        weight: &NDArray,
        part: Range<usize>,
        state: &mut Option<KeyState>,
        apply: impl FnOnce(&Step, &[f64], &mut KeyState) -> Result<()>,
    ) -> Result<()> {
        // A resumed program that pushes with the restored optimizer has taken it on: a
        // later set_optimizer is a change of its own (the load first: no write to a
        // shared line at every update).
        if self.resumed.load(std::sync::atomic::Ordering::Relaxed) {
            self.resumed.store(false, std::sync::atomic::Ordering::Relaxed);
        }
        if state.is_none() {
            *state = Some(self.new_state_part(weight, part.clone())?);
        }
        let Some(st) = state.as_mut() else { return Err(Error::Internal("optimizer state missing".into())) };
        let rule_states = self.opt.rule.states().len();
        if st.states.len() != rule_states
            || st.states.iter().chain(&st.master).any(|a| a.size() != part.len())
            || part.end > weight.size()
        {
            // The rules would skip such a state silently; it is a bug to surface.
            return Err(Error::Internal(format!(
                "key \"{key}\": optimizer {} needs {rule_states} state arrays of {} elements, the key has {}",
                self.opt.name,
                part.len(),
                st.states.len()
            )));
        }
        self.check_count(key, Some(st))?;
        st.count += 1;
        let p = &self.opt.params;
        let mut global = self.global.lock();
        let before = global.num_update;
        global.num_update = global.num_update.max(st.count);
        let num_update = if self.opt.rule.lr_before_count() { before } else { global.num_update };
        let base_lr = match &mut global.scheduler {
            Some(s) => s.lr(num_update),
            None => p.num("learning_rate"),
        };
        let step = Step {
            lr: base_lr * self.opt.lr_mult.get(key).copied().unwrap_or(1.0),
            base_lr,
            key: key.as_str(),
            wd: p.num("wd") * self.opt.wd_mult.get(key).copied().unwrap_or(1.0),
            rescale: p.num("rescale_grad"),
            clip: p.get("clip_gradient"),
            t: st.count,
            seed: (p.num("seed") as u64) ^ (st.count << 20) ^ hash_key(key),
            offset: 0,
        };
        if global.values.is_empty() {
            // Rules with no values shared by all keys update different keys in
            // parallel. The others (Nadam, LARS) advance them for this key and update
            // under the lock, so that a snapshot of the optimizer never sees values
            // advanced for a key whose update has not run.
            drop(global);
            apply(&step, &[], st)
        } else {
            self.opt.rule.advance(&step, &mut global.values);
            apply(&step, &global.values, st)
        }
    }

    /// The rule run on the elements `part` of `weight` and `grad` (all of them, or a
    /// rank's part under `dist_sync` with owners), `st` holding that part's state.
    fn apply(
        &self,
        step: &Step,
        values: &[f64],
        weight: &NDArray,
        grad: &NDArray,
        st: &mut KeyState,
        part: Range<usize>,
    ) -> Result<()> {
        let whole = part == (0..weight.size());
        if whole && values.is_empty() && self.fused(step, weight, grad, st)? {
            return Ok(());
        }
        if part.is_empty() {
            return Ok(());
        }
        let step = &Step { offset: part.start, ..*step };
        let rule = &*self.opt.rule;
        let p = part.clone();
        // The gradient: of the whole key, or of the part only (a key's owner's sums).
        let gp = match grad.size() {
            n if n == weight.size() => p.clone(),
            n if n == p.len() => 0..n,
            n => {
                return Err(Error::Internal(format!(
                    "a gradient of {n} elements for elements {p:?} of a weight of {}",
                    weight.size()
                )));
            }
        };
        match (weight.dtype(), &st.master) {
            (DType::F64, _) => {
                let g = grad.to_vec::<f64>()?;
                let mut guards: Vec<_> = st.states.iter().map(NDArray::write).collect::<Result<_>>()?;
                let mut ss: Vec<&mut [f64]> = guards.iter_mut().map(|b| b.typed_mut::<f64>()).collect();
                weight.with_data_mut(|w: &mut [f64]| rule.update_f64(step, values, &mut w[p], &g[gp], &mut ss))?;
            }
            (DType::F32, _) => {
                let mut guards: Vec<_> = st.states.iter().map(NDArray::write).collect::<Result<_>>()?;
                let mut ss: Vec<&mut [f32]> = guards.iter_mut().map(|b| b.typed_mut::<f32>()).collect();
                let update = |w: &mut [f32]| {
                    grad.with_data(|g: &[f32]| {
                        rule.update_f32(step, values, &mut w[p.clone()], &g[gp.clone()], &mut ss)
                    })
                };
                weight.with_data_mut(update)??;
            }
            (dtype, master) => {
                // f16/bf16: update in f32 (the master copy under multi_precision), then
                // round into the weight once.
                let g = grad.to_vec::<f32>()?;
                let g = &g[gp];
                let mut guards: Vec<_> = st.states.iter().map(NDArray::write).collect::<Result<_>>()?;
                let mut ss: Vec<&mut [f32]> = guards.iter_mut().map(|b| b.typed_mut::<f32>()).collect();
                let w32 = match master {
                    Some(m) => {
                        m.with_data_mut(|w: &mut [f32]| rule.update_f32(step, values, w, g, &mut ss))?;
                        m.to_vec::<f32>()?
                    }
                    None => {
                        let mut w = weight.to_vec::<f32>()?[p.clone()].to_vec();
                        rule.update_f32(step, values, &mut w, g, &mut ss);
                        w
                    }
                };
                match dtype {
                    DType::F16 => weight.with_data_mut(|w: &mut [f16]| {
                        w[p].iter_mut().zip(&w32).for_each(|(d, &s)| *d = f16::from_f32(s))
                    })?,
                    _ => weight.with_data_mut(|w: &mut [bf16]| {
                        w[p].iter_mut().zip(&w32).for_each(|(d, &s)| *d = bf16::from_f32(s))
                    })?,
                }
            }
        }
        Ok(())
    }
}

impl Runtime {
    /// The update as the device backend's fused kernel, when the weight, the gradient
    /// and the states are on its devices and it has one for the rule: `Ok(false)`
    /// otherwise (the caller runs the host rule on staged copies).
    fn fused(&self, step: &Step, weight: &NDArray, grad: &NDArray, st: &KeyState) -> Result<bool> {
        let arrays = || std::iter::once(grad).chain(&st.states).chain(&st.master);
        if !weight.on_device() || !arrays().all(NDArray::on_device) || arrays().any(|a| a.same_storage(weight)) {
            return Ok(false);
        }
        let (Some(backend), Some(fused)) = (device::backend(), self.opt.rule.fused(step, weight.dtype() == DType::F64))
        else {
            return Ok(false);
        };
        // Locks in a fixed order: the gradient, the weight, the states, the master copy
        // (the store holds the key, so no other thread locks the last three).
        let g = grad.storage()?;
        let mut w = weight.storage_mut()?;
        let mut states: Vec<_> = st.states.iter().map(NDArray::storage_mut).collect::<Result<_>>()?;
        let mut master = st.master.as_ref().map(NDArray::storage_mut).transpose()?;
        let (Some(g), Some(w)) = (g.device(), w.device_mut()) else { return Ok(false) };
        let Some(states) = states.iter_mut().map(|s| s.device_mut()).collect::<Option<Vec<_>>>() else {
            return Ok(false);
        };
        let master = match master.as_deref_mut() {
            Some(m) => Some(m.device_mut().ok_or_else(|| Error::Internal("master copy not on the device".into()))?),
            None => None,
        };
        let arrays = device::FusedArrays { dtype: weight.dtype(), weight: w, grad: g, states, master };
        let done = backend.optimizer_step(&fused, arrays);
        if let Err(e @ Error::Backend { .. }) = &done {
            // The device failed while running the step: the weight's contents are unknown.
            weight.mark_faulty(format!("the fused {:?} step failed: {e}", fused.rule));
        }
        done
    }
}

/// The rows of the row-sparse `grad` applied to an f16/bf16 `weight` and its f32
/// `states` (a lazy update): each row widened to f32, updated with its state rows, and
/// rounded back once, as the dense update does the whole weight.
fn half_rows<H: crate::Element<Acc = f32>>(
    rule: &dyn Rule,
    (step, values, part): (&Step, &[f64], Range<usize>),
    weight: &NDArray,
    grad: &RowSparse,
    states: &[NDArray],
) -> Result<()> {
    let rl = grad.row_len();
    let g = grad.data().to_vec::<f32>()?;
    let mut guards: Vec<_> = states.iter().map(NDArray::write).collect::<Result<_>>()?;
    let mut ss: Vec<&mut [f32]> = guards.iter_mut().map(|b| b.typed_mut::<f32>()).collect();
    let mut w32 = vec![0f32; rl];
    weight.with_data_mut(|w: &mut [H]| {
        for (i, &r) in grad.indices().iter().enumerate() {
            let Some(span) = row_in_part(r as usize, rl, &part) else { continue };
            let in_row = span.start - r as usize * rl..span.end - r as usize * rl;
            let w32 = &mut w32[..span.len()];
            let row = &mut w[span.clone()];
            w32.iter_mut().zip(row.iter()).for_each(|(d, &s)| *d = s.to_acc());
            let mut st_rows: smallvec::SmallVec<[&mut [f32]; 4]> =
                ss.iter_mut().map(|s| &mut s[span.start - part.start..span.end - part.start]).collect();
            rule.update_row_f32(step, values, w32, &g[i * rl..(i + 1) * rl][in_row], &mut st_rows);
            row.iter_mut().zip(w32.iter()).for_each(|(d, &s)| *d = H::from_acc(s));
        }
    })
}

/// The elements (flat) of row `r` of `row_len` elements that lie in `part`, if any.
fn row_in_part(r: usize, row_len: usize, part: &Range<usize>) -> Option<Range<usize>> {
    let (start, end) = ((r * row_len).max(part.start), ((r + 1) * row_len).min(part.end));
    (start < end).then_some(start..end)
}

/// A stable hash of a key (FNV-1a), for per-key random streams.
fn hash_key(key: &Key) -> u64 {
    key.as_str().bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn unknown_names_are_errors_that_list_the_valid_ones() {
        let e = Optimizer::builder("adamw").build().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("sgd, nag, adam"), "{e}");
        let e = Optimizer::builder("sgd").param("beta1", 0.9).build().unwrap_err();
        assert!(e.to_string().contains("momentum"), "{e}");
        let e = Optimizer::builder("sgd").param("begin_num_update", 1e20).build().unwrap_err();
        assert!(e.to_string().contains("begin_num_update must be a whole number from 0 to 2^53"), "{e}");
        let e = Optimizer::builder("adam").param("beta1", f64::INFINITY).build().unwrap_err();
        assert!(e.to_string().contains("beta1 is inf"), "{e}");
    }

    #[test]
    fn defaults_are_mxnets() {
        let o = Optimizer::builder("SGD").build().unwrap();
        assert_eq!((o.name(), o.param("learning_rate"), o.param("momentum")), ("sgd", Some(0.01), Some(0.0)));
        assert_eq!(o.param("clip_gradient"), None);
        assert_eq!(Optimizer::builder("ccsgd").build().unwrap().name(), "sgd");
    }

    /// [`Runtime::update`] of `weight` run on each of `parts` alone, as the ranks that own
    /// the parts of a key run it: one step of the key, the shared values advanced once.
    fn update_in_parts(
        rt: &Runtime,
        key: &Key,
        weight: &NDArray,
        grad: &NDArray,
        state: &mut Option<KeyState>,
        parts: &[std::ops::Range<usize>],
    ) {
        let g = grad.to_vec::<f32>().unwrap();
        let updated = rt.step(key, weight, 0..weight.size(), state, |step, values, st| {
            let mut guards: Vec<_> = st.states.iter().map(NDArray::write).collect::<Result<_>>()?;
            let mut states: Vec<&mut [f32]> = guards.iter_mut().map(|b| b.typed_mut::<f32>()).collect();
            weight.with_data_mut(|w: &mut [f32]| {
                for part in parts {
                    let s = Step { offset: part.start, ..*step };
                    let mut st: Vec<&mut [f32]> = states.iter_mut().map(|s| &mut s[part.clone()]).collect();
                    rt.opt.rule.update_f32(&s, values, &mut w[part.clone()], &g[part.clone()], &mut st);
                }
            })
        });
        updated.unwrap();
    }

    /// A key updated in parts (under `dist_sync` each rank may update only its part of a
    /// key, with its part of the state) gets the bits of the key updated whole, for every
    /// optimizer but those that need the whole key's norms (LAMB, LARS): the parts split
    /// as MXNet splits a big key over 3 servers, one at an odd place (SGLD's noise
    /// comes in pairs). A rank that owns no part of the key advances the values that
    /// all keys share (Nadam's momentum schedule) and the counts alike.
    #[test]
    fn an_update_in_parts_has_the_bits_of_the_whole() {
        let n = 1001usize;
        // MXNet's parts: round(n (i + 1) / 3) - round(n i / 3).
        let parts = [0..334, 334..667, 667..n];
        let key = Key::from("w");
        let bits = |a: &NDArray| a.to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for name in optimizer_names().into_iter().filter(|n| !matches!(*n, "lamb" | "lars")) {
            let make = || {
                let opt = Optimizer::builder(name).param("learning_rate", 0.1).param("wd", 0.01).build().unwrap();
                Runtime::new(opt)
            };
            let (whole, in_parts, none) = (make(), make(), make());
            let w: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
            let (a, b, c) = (
                NDArray::from_vec(&[n], w.clone()).unwrap(),
                NDArray::from_vec(&[n], w.clone()).unwrap(),
                NDArray::from_vec(&[n], w.clone()).unwrap(),
            );
            let (mut sa, mut sb, mut sc) = (None, None, None);
            for t in 0..10 {
                let g: Vec<f32> = (0..n).map(|i| (((i + 7 * t) * 13 % 29) as f32 - 14.0) / 7.0).collect();
                let grad = NDArray::from_vec(&[n], g).unwrap();
                whole.update(&key, &a, &grad, &mut sa).unwrap();
                update_in_parts(&in_parts, &key, &b, &grad, &mut sb, &parts);
                update_in_parts(&none, &key, &c, &grad, &mut sc, &[]);
                let differs = |x: Vec<u32>, y: Vec<u32>| x.iter().zip(&y).position(|(x, y)| x != y);
                assert_eq!(differs(bits(&a), bits(&b)), None, "{name}: the weight after update {t} differs at");
                for (i, (x, y)) in sa.as_ref().unwrap().states.iter().zip(&sb.as_ref().unwrap().states).enumerate() {
                    assert_eq!(differs(bits(x), bits(y)), None, "{name}: state {i} after update {t} differs at");
                }
                for other in [&in_parts, &none] {
                    let (mine, theirs) = (whole.global.lock(), other.global.lock());
                    assert_eq!(mine.num_update, theirs.num_update, "{name}");
                    let shared = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(shared(&mine.values), shared(&theirs.values), "{name}: the shared values");
                }
                assert_eq!(sa.as_ref().unwrap().count, sc.as_ref().unwrap().count, "{name}: the key's count");
            }
        }
    }

    #[test]
    fn what_mxnet_accepts_is_accepted() {
        // Gradient ascent, and momentum or betas outside [0, 1): MXNet 1.9.1 takes them.
        for (name, param, value) in
            [("sgd", "learning_rate", -1.0), ("sgd", "momentum", 1.5), ("adam", "beta1", 1.0), ("sgd", "wd", -0.1)]
        {
            let o = Optimizer::builder(name).param(param, value).build();
            assert_eq!(o.map(|o| o.param(param)).ok(), Some(Some(value)), "{name} {param} {value}");
        }
    }
}
