//! Natives of `io.github.kvstore.Optimizer`, and the JSON that carries an optimizer
//! from Java to Rust.
//!
//! Java describes an optimizer as data (`Optimizer.toJson()`) and hands it over as one
//! string, so that one native call, not one per setter, builds it; Rust checks it whole
//! with the same code that `KVStore::set_optimizer` uses. The format:
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

use jni::EnvUnowned;
use jni::objects::{JClass, JString};
use kvstore_core::{Error, LrScheduler, Optimizer, Result, WarmupMode};
use serde_json::{Map, Value};

use crate::error::{JResult, ThrowKvStore};

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

/// `v` as a finite number (`true`/`false` as 1/0 when `bools`).
fn number(v: &Value, what: &str, bools: bool) -> Result<f64> {
    match v {
        Value::Number(n) => {
            n.as_f64().filter(|x| x.is_finite()).ok_or_else(|| bad(format!("{what} must be a finite number, got {n}")))
        }
        Value::Bool(b) if bools => Ok(if *b { 1.0 } else { 0.0 }),
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
fn mults(v: Option<&Value>, what: &str) -> Result<Vec<(String, f64)>> {
    let Some(v) = v else { return Ok(Vec::new()) };
    object(v, what)?
        .iter()
        .map(|(k, x)| Ok((k.clone(), number(x, &format!("{what} of key \"{k}\""), false)?)))
        .collect()
}

/// The scheduler described by the object `v` (see the module docs).
fn scheduler_from_json(v: &Value) -> Result<LrScheduler> {
    let obj = object(v, "scheduler")?;
    let kind = match field(obj, "type") {
        Some(Value::String(s)) => s.as_str(),
        Some(other) => return Err(bad(format!("scheduler: \"type\" must be a string, got {}", shown(other)))),
        None => return Err(bad("scheduler: \"type\" is missing: one of factor, multifactor, poly, cosine")),
    };
    let what = format!("{kind} scheduler");
    let required = |name: &str| field(obj, name).ok_or_else(|| bad(format!("{what}: \"{name}\" is missing")));
    let num = |name: &str| -> Result<Option<f64>> {
        field(obj, name).map(|v| number(v, &format!("{what}: \"{name}\""), false)).transpose()
    };
    let (own, scheduler): (&[&str], LrScheduler) = match kind {
        "factor" => {
            let step = count(required("step")?, &format!("{what}: \"step\""))?;
            let factor = number(required("factor")?, &format!("{what}: \"factor\""), false)?;
            let mut s = LrScheduler::factor(step, factor)?;
            if let Some(stop) = num("stop_factor_lr")? {
                s = s.stop_factor_lr(stop);
            }
            (&["step", "factor", "stop_factor_lr"], s)
        }
        "multifactor" => {
            let steps = required("steps")?;
            let steps = steps
                .as_array()
                .ok_or_else(|| bad(format!("{what}: \"steps\" must be a list, got {}", shown(steps))))?
                .iter()
                .map(|s| count(s, &format!("{what}: each of \"steps\"")))
                .collect::<Result<Vec<u64>>>()?;
            let factor = number(required("factor")?, &format!("{what}: \"factor\""), false)?;
            (&["steps", "factor"], LrScheduler::multi_factor(&steps, factor)?)
        }
        "poly" => {
            let max_update = count(required("max_update")?, &format!("{what}: \"max_update\""))?;
            let s = LrScheduler::poly(max_update, num("pwr")?.unwrap_or(2.0), num("final_lr")?.unwrap_or(0.0))?;
            (&["max_update", "pwr", "final_lr"], s)
        }
        "cosine" => {
            let max_update = count(required("max_update")?, &format!("{what}: \"max_update\""))?;
            (&["max_update", "final_lr"], LrScheduler::cosine(max_update, num("final_lr")?.unwrap_or(0.0))?)
        }
        other => {
            return Err(bad(format!(
                "scheduler: unknown type \"{}\": the types are factor, multifactor, poly, cosine",
                kvstore_core::shorten(other)
            )));
        }
    };
    let known: Vec<&str> = SCHEDULER_COMMON.iter().chain(own).copied().collect();
    only(obj, &known, &what)?;
    // The base rate first: the warm-up is checked against it.
    let mut scheduler = match num("base_lr")? {
        Some(lr) => scheduler.base_lr(lr),
        None => scheduler,
    };
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
    if warmup_steps.is_some() || warmup_begin_lr.is_some() || warmup_mode.is_some() {
        scheduler = scheduler.warmup(
            warmup_steps.unwrap_or(0),
            warmup_begin_lr.unwrap_or(0.0),
            warmup_mode.unwrap_or(WarmupMode::Linear),
        )?;
    }
    Ok(scheduler)
}

/// The optimizer described by `json` (see the module docs), built and checked by
/// [`kvstore_core::OptimizerBuilder::build`].
///
/// # Errors
/// [`Error::InvalidArgument`] for JSON that does not parse, an unknown or ill-typed
/// field, a non-finite number, and everything `build` rejects (unknown optimizer or
/// hyper-parameter names, values out of range, a bad schedule);
/// [`Error::Unsupported`] for an optimizer whose rule this build lacks.
pub fn optimizer_from_json(json: &str) -> Result<Optimizer> {
    let v: Value = serde_json::from_str(json).map_err(|e| bad(format!("optimizer JSON does not parse: {e}")))?;
    let obj = object(&v, "optimizer JSON")?;
    only(obj, FIELDS, "optimizer JSON")?;
    let name = match field(obj, "name") {
        Some(Value::String(s)) => s,
        Some(other) => return Err(bad(format!("optimizer JSON: \"name\" must be a string, got {}", shown(other)))),
        None => return Err(bad("optimizer JSON: \"name\" is missing")),
    };
    let mut builder = Optimizer::builder(name);
    if let Some(params) = field(obj, "params") {
        for (k, x) in object(params, "optimizer JSON: \"params\"")? {
            builder = builder.param(k, number(x, &format!("optimizer {name}: hyper-parameter \"{k}\""), true)?);
        }
    }
    if let Some(s) = field(obj, "scheduler") {
        builder = builder.lr_scheduler(scheduler_from_json(s)?);
    }
    for (k, x) in mults(field(obj, "lr_mult"), "lr_mult")? {
        builder = builder.lr_mult(k, x);
    }
    for (k, x) in mults(field(obj, "wd_mult"), "wd_mult")? {
        builder = builder.wd_mult(k, x);
    }
    builder.build()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_Optimizer_nValidate<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    json: JString<'l>,
) {
    env.with_env(|env| -> JResult<()> {
        optimizer_from_json(&crate::convert::string(env, &json, "the optimizer JSON")?)?;
        Ok(())
    })
    .resolve::<ThrowKvStore>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvstore_core::{ErrorKind, KVStore, NDArray};

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
