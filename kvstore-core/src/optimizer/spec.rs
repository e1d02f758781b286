//! The serialisable description of an optimizer and its learning-rate schedule: what
//! `Optimizer.toJson()` sends from Java and what optimizer-state files record of a
//! schedule. (MXNet passes the optimizer as a pickled Python object; this is its data.)
//!
//! ```json
//! {"name": "sgd",
//!  "params": {"learning_rate": 0.1, "momentum": 0.9, "centered": true},
//!  "scheduler": null,
//!  "lr_mult": {"w": 0.5},
//!  "wd_mult": {}}
//! ```
//!
//! `params` are MXNet's hyper-parameter names (booleans may be JSON booleans). A
//! scheduler is `{"type": "factor", "step": 10, "factor": 0.5}`, `"multifactor"` with
//! `"steps": [..]`, `"poly"` with `"max_update"` (and optional `"pwr"`, default 2, and
//! `"final_lr"`, default 0) or `"cosine"` with `"max_update"` (and `"final_lr"`); each
//! may add `"base_lr"`, `"warmup_steps"`, `"warmup_begin_lr"`, `"warmup_mode"`
//! (`"linear"` or `"constant"`), and a factor scheduler `"stop_factor_lr"`. A `null`
//! field is an absent one. Non-finite numbers arrive as the strings `"NaN"`,
//! `"Infinity"` and `"-Infinity"` (JSON has no such numbers) and are rejected with a
//! message that names them. Anything else unknown or ill-typed is
//! [`Error::InvalidArgument`] naming the field.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::{LrScheduler, Optimizer, WarmupMode};
use crate::error::{Error, Result};

/// A hyper-parameter's value: a number, or a flag (`true`/`false` are 1/0 to the
/// optimizer).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ParamValue {
    /// A number.
    Number(f64),
    /// A flag.
    Bool(bool),
}

impl ParamValue {
    /// The value as the optimizer takes it (a flag as 1 or 0).
    pub fn as_f64(self) -> f64 {
        match self {
            ParamValue::Number(x) => x,
            ParamValue::Bool(b) => f64::from(u8::from(b)),
        }
    }
}

impl Serialize for ParamValue {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            ParamValue::Number(x) => num(x, s),
            ParamValue::Bool(b) => s.serialize_bool(*b),
        }
    }
}

/// What a schedule is, by its `"type"`, with the fields of that type.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ScheduleKind {
    /// [`LrScheduler::factor`], floored at `stop_factor_lr` (default 1e-8).
    Factor {
        /// Updates between two multiplications.
        step: u64,
        /// The multiplier.
        #[serde(serialize_with = "num")]
        factor: f64,
        /// The floor.
        #[serde(skip_serializing_if = "Option::is_none", serialize_with = "opt_num")]
        stop_factor_lr: Option<f64>,
    },
    /// [`LrScheduler::multi_factor`].
    #[serde(rename = "multifactor")]
    MultiFactor {
        /// The update counts after which the rate is multiplied (increasing).
        steps: Vec<u64>,
        /// The multiplier.
        #[serde(serialize_with = "num")]
        factor: f64,
    },
    /// [`LrScheduler::poly`], `pwr` default 2, `final_lr` default 0.
    Poly {
        /// The update count at which the rate reaches `final_lr`.
        max_update: u64,
        /// The power.
        #[serde(skip_serializing_if = "Option::is_none", serialize_with = "opt_num")]
        pwr: Option<f64>,
        /// The final rate.
        #[serde(skip_serializing_if = "Option::is_none", serialize_with = "opt_num")]
        final_lr: Option<f64>,
    },
    /// [`LrScheduler::cosine`], `final_lr` default 0.
    Cosine {
        /// The update count at which the rate reaches `final_lr`.
        max_update: u64,
        /// The final rate.
        #[serde(skip_serializing_if = "Option::is_none", serialize_with = "opt_num")]
        final_lr: Option<f64>,
    },
}

/// A learning-rate schedule as data: its kind and the options every kind has. `None`
/// is an option left at its default.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleSpec {
    /// The kind and its own fields.
    #[serde(flatten)]
    pub kind: ScheduleKind,
    /// The schedule's own base rate ([`LrScheduler::base_lr`]).
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "opt_num")]
    pub base_lr: Option<f64>,
    /// Warm-up length (default 0 when another warm-up option is set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup_steps: Option<u64>,
    /// Warm-up start rate (default 0).
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "opt_num")]
    pub warmup_begin_lr: Option<f64>,
    /// Warm-up mode (default linear).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup_mode: Option<WarmupMode>,
}

/// An optimizer as data: name, hyper-parameters by MXNet name, schedule and per-key
/// multipliers. [`OptimizerSpec::build`] checks it as [`Optimizer::builder`] does.
///
/// ```
/// use kvstore_core::OptimizerSpec;
/// let spec = OptimizerSpec::from_json(r#"{"name": "sgd", "params": {"momentum": 0.9},
///     "scheduler": {"type": "factor", "step": 10, "factor": 0.5}}"#)?;
/// assert_eq!(OptimizerSpec::from_json(&spec.to_json())?, spec);
/// assert_eq!(spec.build()?.param("momentum"), Some(0.9));
/// assert!(OptimizerSpec::from_json(r#"{"name": "sgd", "lr": 1}"#).is_err());
/// # Ok::<(), kvstore_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OptimizerSpec {
    /// MXNet's registry name (case-insensitive).
    pub name: String,
    /// Hyper-parameters by MXNet name.
    pub params: BTreeMap<String, ParamValue>,
    /// The learning-rate schedule, if any.
    pub scheduler: Option<ScheduleSpec>,
    /// Per-key learning-rate multipliers.
    #[serde(serialize_with = "nums")]
    pub lr_mult: BTreeMap<String, f64>,
    /// Per-key weight-decay multipliers.
    #[serde(serialize_with = "nums")]
    pub wd_mult: BTreeMap<String, f64>,
}

// ----- writing: non-finite numbers as the strings that reading rejects by name -----

fn num<S: Serializer>(x: &f64, s: S) -> std::result::Result<S::Ok, S::Error> {
    if x.is_nan() {
        s.serialize_str("NaN")
    } else if x.is_infinite() {
        s.serialize_str(if *x > 0.0 { "Infinity" } else { "-Infinity" })
    } else {
        s.serialize_f64(*x)
    }
}

fn opt_num<S: Serializer>(x: &Option<f64>, s: S) -> std::result::Result<S::Ok, S::Error> {
    match x {
        Some(x) => num(x, s),
        None => s.serialize_none(),
    }
}

fn nums<S: Serializer>(m: &BTreeMap<String, f64>, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.collect_map(m.iter().map(|(k, x)| (k, ParamValue::Number(*x))))
}

// ----- reading -----

const FIELDS: &[&str] = &["name", "params", "scheduler", "lr_mult", "wd_mult"];
const SCHEDULER_COMMON: &[&str] = &["type", "base_lr", "warmup_steps", "warmup_begin_lr", "warmup_mode"];

fn bad(message: impl Into<String>) -> Error {
    Error::invalid_argument(message.into())
}

/// A JSON value in a message: short, and never the whole input.
fn shown(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 40 { format!("{}...", s.chars().take(40).collect::<String>()) } else { s }
}

/// A field that is present and not `null`.
fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

/// `v` as a finite number (or a flag, when `bools`).
fn number(v: &Value, what: &str, bools: bool) -> Result<ParamValue> {
    match v {
        Value::Number(n) => n
            .as_f64()
            .filter(|x| x.is_finite())
            .map(ParamValue::Number)
            .ok_or_else(|| bad(format!("{what} must be a finite number, got {n}"))),
        Value::Bool(b) if bools => Ok(ParamValue::Bool(*b)),
        Value::String(s) if matches!(s.as_str(), "NaN" | "Infinity" | "-Infinity") => {
            Err(bad(format!("{what} must be a finite number, got {s}")))
        }
        other => Err(bad(format!(
            "{what} must be a number{}, got {}",
            if bools { " or a boolean" } else { "" },
            shown(other)
        ))),
    }
}

fn float(v: &Value, what: &str) -> Result<f64> {
    number(v, what, false).map(ParamValue::as_f64)
}

/// `v` as a whole number ≥ 0.
fn count(v: &Value, what: &str) -> Result<u64> {
    v.as_u64().ok_or_else(|| bad(format!("{what} must be a whole number of at least 0, got {}", shown(v))))
}

fn object<'a>(v: &'a Value, what: &str) -> Result<&'a Map<String, Value>> {
    v.as_object().ok_or_else(|| bad(format!("{what} must be a JSON object, got {}", shown(v))))
}

/// Rejects the fields of `obj` that are not in `known`.
fn only(obj: &Map<String, Value>, known: &[&str], what: &str) -> Result<()> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(bad(format!("{what}: unknown field \"{k}\": the fields are {}", known.join(", ")))),
        None => Ok(()),
    }
}

/// The per-key multipliers of `lr_mult` or `wd_mult`.
fn mults(v: Option<&Value>, what: &str) -> Result<BTreeMap<String, f64>> {
    let Some(v) = v else { return Ok(BTreeMap::new()) };
    object(v, what)?.iter().map(|(k, x)| Ok((k.clone(), float(x, &format!("{what} of key \"{k}\""))?))).collect()
}

impl ScheduleKind {
    /// The kind described by `obj`, and the fields of its own that it read. Fields
    /// beyond those are left to the caller (a state file's reader ignores them).
    pub(crate) fn from_object(obj: &Map<String, Value>) -> Result<(Self, &'static [&'static str])> {
        let kind = match field(obj, "type") {
            Some(Value::String(s)) => s.as_str(),
            Some(other) => return Err(bad(format!("scheduler: \"type\" must be a string, got {}", shown(other)))),
            None => return Err(bad("scheduler: \"type\" is missing: one of factor, multifactor, poly, cosine")),
        };
        let what = format!("{kind} scheduler");
        let required = |name: &str| field(obj, name).ok_or_else(|| bad(format!("{what}: \"{name}\" is missing")));
        let num = |name: &str| -> Result<Option<f64>> {
            field(obj, name).map(|v| float(v, &format!("{what}: \"{name}\""))).transpose()
        };
        Ok(match kind {
            "factor" => {
                let step = count(required("step")?, &format!("{what}: \"step\""))?;
                let factor = float(required("factor")?, &format!("{what}: \"factor\""))?;
                (
                    ScheduleKind::Factor { step, factor, stop_factor_lr: num("stop_factor_lr")? },
                    &["step", "factor", "stop_factor_lr"],
                )
            }
            "multifactor" => {
                let steps = required("steps")?;
                let steps = steps
                    .as_array()
                    .ok_or_else(|| bad(format!("{what}: \"steps\" must be a list, got {}", shown(steps))))?
                    .iter()
                    .map(|s| count(s, &format!("{what}: each of \"steps\"")))
                    .collect::<Result<Vec<u64>>>()?;
                let factor = float(required("factor")?, &format!("{what}: \"factor\""))?;
                (ScheduleKind::MultiFactor { steps, factor }, &["steps", "factor"])
            }
            "poly" => {
                let max_update = count(required("max_update")?, &format!("{what}: \"max_update\""))?;
                (
                    ScheduleKind::Poly { max_update, pwr: num("pwr")?, final_lr: num("final_lr")? },
                    &["max_update", "pwr", "final_lr"],
                )
            }
            "cosine" => {
                let max_update = count(required("max_update")?, &format!("{what}: \"max_update\""))?;
                (ScheduleKind::Cosine { max_update, final_lr: num("final_lr")? }, &["max_update", "final_lr"])
            }
            other => {
                return Err(bad(format!(
                    "scheduler: unknown type \"{}\": the types are factor, multifactor, poly, cosine",
                    crate::shorten(other)
                )));
            }
        })
    }

    /// The kind of `obj` (see [`ScheduleKind::from_object`]), rejecting any field but
    /// its own, `"type"` and `extra`.
    fn from_object_with(obj: &Map<String, Value>, extra: &[&str]) -> Result<Self> {
        let (kind, own) = Self::from_object(obj)?;
        let known: Vec<&str> = ["type"].iter().chain(own).chain(extra).copied().collect();
        only(obj, &known, &format!("{} scheduler", kind.type_name()))?;
        Ok(kind)
    }

    fn type_name(&self) -> &'static str {
        match self {
            ScheduleKind::Factor { .. } => "factor",
            ScheduleKind::MultiFactor { .. } => "multifactor",
            ScheduleKind::Poly { .. } => "poly",
            ScheduleKind::Cosine { .. } => "cosine",
        }
    }

    /// The schedule with this kind's fields and every other option at its default.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for what the [`LrScheduler`] constructors reject.
    pub fn build(&self) -> Result<LrScheduler> {
        match self {
            ScheduleKind::Factor { step, factor, stop_factor_lr } => {
                let s = LrScheduler::factor(*step, *factor)?;
                Ok(match stop_factor_lr {
                    Some(stop) => s.stop_factor_lr(*stop),
                    None => s,
                })
            }
            ScheduleKind::MultiFactor { steps, factor } => LrScheduler::multi_factor(steps, *factor),
            ScheduleKind::Poly { max_update, pwr, final_lr } => {
                LrScheduler::poly(*max_update, pwr.unwrap_or(2.0), final_lr.unwrap_or(0.0))
            }
            ScheduleKind::Cosine { max_update, final_lr } => LrScheduler::cosine(*max_update, final_lr.unwrap_or(0.0)),
        }
    }
}

impl ScheduleSpec {
    /// The schedule described by the JSON object `v` (see the module docs).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the field that is missing, unknown, ill-typed
    /// or not finite.
    pub fn from_value(v: &Value) -> Result<Self> {
        let obj = object(v, "scheduler")?;
        let kind = ScheduleKind::from_object_with(obj, &SCHEDULER_COMMON[1..])?;
        let what = format!("{} scheduler", kind.type_name());
        let num = |name: &str| -> Result<Option<f64>> {
            field(obj, name).map(|v| float(v, &format!("{what}: \"{name}\""))).transpose()
        };
        let base_lr = num("base_lr")?;
        let warmup_steps =
            field(obj, "warmup_steps").map(|v| count(v, &format!("{what}: \"warmup_steps\""))).transpose()?;
        let warmup_begin_lr = num("warmup_begin_lr")?;
        let warmup_mode = match field(obj, "warmup_mode") {
            None => None,
            Some(Value::String(m)) if m == "linear" => Some(WarmupMode::Linear),
            Some(Value::String(m)) if m == "constant" => Some(WarmupMode::Constant),
            Some(other) => {
                return Err(bad(format!(
                    "{what}: \"warmup_mode\" must be \"linear\" or \"constant\", got {}",
                    shown(other)
                )));
            }
        };
        Ok(ScheduleSpec { kind, base_lr, warmup_steps, warmup_begin_lr, warmup_mode })
    }

    /// The schedule, checked by the [`LrScheduler`] constructors and
    /// [`LrScheduler::warmup`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for what those reject.
    pub fn build(&self) -> Result<LrScheduler> {
        let mut s = self.kind.build()?;
        // The base rate first: the warm-up is checked against it.
        if let Some(lr) = self.base_lr {
            s = s.base_lr(lr);
        }
        if self.warmup_steps.is_some() || self.warmup_begin_lr.is_some() || self.warmup_mode.is_some() {
            s = s.warmup(
                self.warmup_steps.unwrap_or(0),
                self.warmup_begin_lr.unwrap_or(0.0),
                self.warmup_mode.unwrap_or(WarmupMode::Linear),
            )?;
        }
        Ok(s)
    }
}

impl OptimizerSpec {
    /// The description in `json` (see the module docs).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for JSON that does not parse, or a field that is
    /// missing, unknown, ill-typed or not finite (the message names it).
    pub fn from_json(json: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(json).map_err(|e| bad(format!("optimizer JSON does not parse: {e}")))?;
        Self::from_value(&v)
    }

    /// The description in the JSON value `v`; see [`OptimizerSpec::from_json`].
    ///
    /// # Errors
    /// As [`OptimizerSpec::from_json`].
    pub fn from_value(v: &Value) -> Result<Self> {
        let obj = object(v, "optimizer JSON")?;
        only(obj, FIELDS, "optimizer JSON")?;
        let name = match field(obj, "name") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(bad(format!("optimizer JSON: \"name\" must be a string, got {}", shown(other))));
            }
            None => return Err(bad("optimizer JSON: \"name\" is missing")),
        };
        let mut params = BTreeMap::new();
        if let Some(p) = field(obj, "params") {
            for (k, x) in object(p, "optimizer JSON: \"params\"")? {
                let what = format!("optimizer {name}: hyper-parameter \"{k}\"");
                let value = match x {
                    // A parameter MXNet takes as a name (LBSGD's warmup_strategy).
                    Value::String(text) if super::text_param(&name, k).is_some() => {
                        ParamValue::Number(super::text_param_code(&name, k, text)?)
                    }
                    _ => number(x, &what, true)?,
                };
                params.insert(k.clone(), value);
            }
        }
        let scheduler = field(obj, "scheduler").map(ScheduleSpec::from_value).transpose()?;
        let lr_mult = mults(field(obj, "lr_mult"), "lr_mult")?;
        let wd_mult = mults(field(obj, "wd_mult"), "wd_mult")?;
        Ok(OptimizerSpec { name, params, scheduler, lr_mult, wd_mult })
    }

    /// The canonical JSON of this description: keys sorted, absent options left out,
    /// non-finite numbers as `"NaN"`, `"Infinity"`, `"-Infinity"`.
    pub fn to_json(&self) -> String {
        // Serialising plain maps, strings and numbers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The optimizer, checked by [`crate::OptimizerBuilder::build`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for what the builder rejects (unknown optimizer or
    /// hyper-parameter names, values out of range) and for a bad schedule;
    /// [`Error::Unsupported`] for an optimizer whose rule this build lacks.
    pub fn build(&self) -> Result<Optimizer> {
        let mut b = Optimizer::builder(&self.name);
        for (k, x) in &self.params {
            b = b.param(k, x.as_f64());
        }
        if let Some(s) = &self.scheduler {
            b = b.lr_scheduler(s.build()?);
        }
        for (k, x) in &self.lr_mult {
            b = b.lr_mult(k, *x);
        }
        for (k, x) in &self.wd_mult {
            b = b.wd_mult(k, *x);
        }
        b.build()
    }
}

impl<'de> Deserialize<'de> for OptimizerSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        Self::from_value(&Value::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for ScheduleSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        Self::from_value(&Value::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ErrorKind, KVStore, NDArray};

    fn round_trips(spec: &OptimizerSpec) {
        let json = spec.to_json();
        assert_eq!(&OptimizerSpec::from_json(&json).unwrap(), spec, "{json}");
        assert_eq!(OptimizerSpec::from_json(&json).unwrap().to_json(), json);
        let via_serde: OptimizerSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(&via_serde, spec);
    }

    fn spec(name: &str, scheduler: Option<ScheduleSpec>) -> OptimizerSpec {
        OptimizerSpec {
            name: name.into(),
            params: [("learning_rate".to_string(), ParamValue::Number(0.25))].into(),
            scheduler,
            lr_mult: [("w".to_string(), 0.5)].into(),
            wd_mult: [("b".to_string(), 0.0)].into(),
        }
    }

    fn schedule(kind: ScheduleKind) -> ScheduleSpec {
        ScheduleSpec { kind, base_lr: None, warmup_steps: None, warmup_begin_lr: None, warmup_mode: None }
    }

    #[test]
    fn every_optimizer_round_trips_through_json_and_builds() {
        for name in crate::optimizer_names() {
            let s = spec(name, None);
            round_trips(&s);
            match s.build() {
                Ok(o) => assert_eq!(o.param("learning_rate"), Some(0.25), "{name}"),
                Err(e) => assert_eq!(e.kind(), crate::ErrorKind::Unsupported, "{name}: {e}"),
            }
        }
        let mut flags = spec("sgd", None);
        flags.params.insert("multi_precision".into(), ParamValue::Bool(true));
        round_trips(&flags);
        assert_eq!(flags.build().unwrap().param("multi_precision"), Some(1.0));
    }

    #[test]
    fn every_schedule_kind_round_trips_through_json_and_builds() {
        let kinds = [
            ScheduleKind::Factor { step: 10, factor: 0.5, stop_factor_lr: Some(1e-6) },
            ScheduleKind::Factor { step: 1, factor: 0.5, stop_factor_lr: None },
            ScheduleKind::MultiFactor { steps: vec![2, 5], factor: 0.1 },
            ScheduleKind::Poly { max_update: 100, pwr: Some(1.5), final_lr: Some(0.001) },
            ScheduleKind::Poly { max_update: 100, pwr: None, final_lr: None },
            ScheduleKind::Cosine { max_update: 100, final_lr: Some(0.001) },
            ScheduleKind::Cosine { max_update: 100, final_lr: None },
        ];
        for kind in kinds {
            let bare = schedule(kind.clone());
            let full = ScheduleSpec {
                kind,
                base_lr: Some(0.5),
                warmup_steps: Some(5),
                warmup_begin_lr: Some(0.01),
                warmup_mode: Some(WarmupMode::Constant),
            };
            for s in [bare, full] {
                let o = spec("sgd", Some(s.clone()));
                round_trips(&o);
                o.build().unwrap();
                let json = serde_json::to_string(&s).unwrap();
                let back: ScheduleSpec = serde_json::from_str(&json).unwrap();
                assert_eq!(back, s, "{json}");
            }
        }
    }

    #[test]
    fn the_canonical_json_sorts_keys_and_leaves_out_absent_options() {
        let o = OptimizerSpec::from_json(
            r#"{"wd_mult": null, "params": {"momentum": 0.9, "learning_rate": 1},
                "scheduler": {"warmup_mode": null, "type": "factor", "step": 2, "factor": 0.5}, "name": "sgd"}"#,
        )
        .unwrap();
        assert_eq!(
            o.to_json(),
            r#"{"name":"sgd","params":{"learning_rate":1.0,"momentum":0.9},"scheduler":{"type":"factor","step":2,"factor":0.5},"lr_mult":{},"wd_mult":{}}"#
        );
    }

    #[test]
    fn non_finite_numbers_written_are_rejected_when_read_back() {
        let mut o = spec("sgd", None);
        o.params.insert("wd".into(), ParamValue::Number(f64::NEG_INFINITY));
        let e = OptimizerSpec::from_json(&o.to_json()).unwrap_err();
        assert!(e.to_string().contains("\"wd\" must be a finite number, got -Infinity"), "{e}");
    }

    fn optimizer_from_json(json: &str) -> Result<Optimizer> {
        OptimizerSpec::from_json(json)?.build()
    }

    fn invalid(json: &str, says: &str) {
        let e = optimizer_from_json(json).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{json}: {e}");
        assert!(e.to_string().contains(says), "{json}: \"{e}\" does not say \"{says}\"");
    }

    #[test]
    fn a_full_description_builds_with_its_values() {
        let o = optimizer_from_json(
            r#"{"name": "SGD", "params": {"learning_rate": 0.1, "momentum": 0.9, "multi_precision": true},
                "scheduler": {"type": "factor", "step": 10, "factor": 0.5, "stop_factor_lr": 1e-6,
                              "warmup_steps": 2, "warmup_begin_lr": 0.001, "warmup_mode": "constant"},
                "lr_mult": {"w": 0.5}, "wd_mult": {"b": 0}}"#,
        )
        .unwrap();
        assert_eq!(o.name(), "sgd");
        assert_eq!(o.param("learning_rate"), Some(0.1));
        assert_eq!(o.param("momentum"), Some(0.9));
        assert_eq!(o.param("multi_precision"), Some(1.0));
        let bare = optimizer_from_json(r#"{"name": "sgd", "params": null, "scheduler": null}"#).unwrap();
        assert_eq!(bare.param("learning_rate"), Some(0.01));
    }

    #[test]
    fn every_scheduler_type_parses() {
        for s in [
            r#"{"type": "multifactor", "steps": [2, 5], "factor": 0.1}"#,
            r#"{"type": "poly", "max_update": 100, "pwr": 2, "final_lr": 0, "base_lr": 0.1}"#,
            r#"{"type": "poly", "max_update": 100}"#,
            r#"{"type": "cosine", "max_update": 100, "final_lr": 0.001, "warmup_steps": 5}"#,
        ] {
            optimizer_from_json(&format!(r#"{{"name": "sgd", "scheduler": {s}}}"#)).unwrap();
        }
    }

    #[test]
    fn the_scheduler_and_multipliers_reach_the_updates() {
        // lr 1 halved after every update (factor 1, 0.5); lr_mult 0.5 on "w".
        let o = optimizer_from_json(
            r#"{"name": "sgd", "params": {"learning_rate": 1},
                "scheduler": {"type": "factor", "step": 1, "factor": 0.5}, "lr_mult": {"w": 0.5}}"#,
        )
        .unwrap();
        let kv = KVStore::create("local").unwrap();
        kv.init("w", &NDArray::zeros(&[1]).unwrap()).unwrap();
        kv.set_optimizer(o).unwrap();
        let g = NDArray::ones(&[1]).unwrap();
        kv.push("w", &g, 0).unwrap();
        kv.push("w", &g, 0).unwrap();
        let w = NDArray::zeros(&[1]).unwrap();
        kv.pull("w", &w, 0).unwrap();
        // −0.5·1 − 0.5·0.5
        assert_eq!(w.to_vec::<f32>().unwrap(), vec![-0.75]);
    }

    #[test]
    fn malformed_json_and_fields_are_invalid_arguments_naming_the_problem() {
        invalid("{", "does not parse");
        invalid("[1]", "must be a JSON object");
        invalid(r#"{"params": {}}"#, "\"name\" is missing");
        invalid(r#"{"name": 3}"#, "\"name\" must be a string");
        invalid(r#"{"name": "sgd", "lr": 0.1}"#, "unknown field \"lr\"");
        invalid(r#"{"name": "sgd", "params": [1]}"#, "\"params\" must be a JSON object");
        invalid(r#"{"name": "sgd", "params": {"momentum": "high"}}"#, "\"momentum\" must be a number or a boolean");
        invalid(r#"{"name": "sgd", "params": {"learning_rate": "NaN"}}"#, "must be a finite number, got NaN");
        invalid(r#"{"name": "sgd", "params": {"wd": "-Infinity"}}"#, "got -Infinity");
        invalid(r#"{"name": "sgd", "params": {"wd": 1e999}}"#, "does not parse");
        invalid(r#"{"name": "sgd", "lr_mult": {"w": true}}"#, "lr_mult of key \"w\" must be a number");
        invalid(r#"{"name": "sgd", "wd_mult": 2}"#, "wd_mult must be a JSON object");
    }

    #[test]
    fn bad_schedulers_are_invalid_arguments_naming_the_field() {
        let with = |s: &str| format!(r#"{{"name": "sgd", "scheduler": {s}}}"#);
        invalid(&with(r#"{"step": 1}"#), "\"type\" is missing");
        invalid(&with(r#"{"type": "exp"}"#), "unknown type \"exp\"");
        invalid(&with(r#"{"type": "factor", "factor": 0.5}"#), "\"step\" is missing");
        invalid(&with(r#"{"type": "factor", "step": -1, "factor": 0.5}"#), "\"step\" must be a whole number");
        invalid(&with(r#"{"type": "factor", "step": 0, "factor": 0.5}"#), "step must be at least 1");
        invalid(&with(r#"{"type": "factor", "step": 2, "factor": 2}"#), "factor must be at most 1");
        invalid(&with(r#"{"type": "multifactor", "steps": [5, 2], "factor": 0.5}"#), "increasing");
        invalid(&with(r#"{"type": "multifactor", "steps": 5, "factor": 0.5}"#), "must be a list");
        invalid(
            &with(r#"{"type": "multifactor", "steps": [2], "factor": 0.5, "stop_factor_lr": 0}"#),
            "unknown field \"stop_factor_lr\"",
        );
        invalid(&with(r#"{"type": "poly", "max_update": 10, "warmup_steps": 10}"#), "max_update must exceed");
        invalid(&with(r#"{"type": "cosine", "max_update": 10, "warmup_mode": "cubic"}"#), "\"warmup_mode\" must be");
        invalid(&with(r#"{"type": "cosine", "max_update": 10, "warmup_begin_lr": 1}"#), "warm-up must begin below");
    }

    #[test]
    fn core_checks_names_and_ranges() {
        invalid(r#"{"name": "adamw"}"#, "unknown optimizer \"adamw\"");
        invalid(r#"{"name": "sgd", "params": {"beta1": 0.9}}"#, "unknown hyper-parameter \"beta1\"");
        invalid(r#"{"name": "sgd", "params": {"begin_num_update": 1e20}}"#, "from 0 to 2^53");
        // What MXNet 1.9.1 accepts is accepted: gradient ascent, momentum above 1.
        for json in
            [r#"{"name": "sgd", "params": {"learning_rate": -1}}"#, r#"{"name": "sgd", "params": {"momentum": 1.5}}"#]
        {
            assert!(optimizer_from_json(json).is_ok(), "{json}");
        }
    }
}
