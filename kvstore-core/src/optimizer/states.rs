//! Optimizer-state files (`save_optimizer_states` / `load_optimizer_states`):
//! safetensors, one tensor per state array (`k{n}.{state}`, `k{n}.master`), and JSON
//! metadata holding the optimizer's name and hyper-parameters, `num_update`, the
//! schedule's state, the rule's global values, and per key its name, update count,
//! shape and dtype. MXNet pickled a dict of NDArrays; this format is documented,
//! checked on load, and readable by any safetensors tool.

use std::collections::HashMap;

use safetensors::tensor::TensorView;
use safetensors::{Dtype as StDtype, SafeTensors};
use serde_json::{Value, json};

use super::{KeyState, LrScheduler, Runtime};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::key::Key;
use crate::ndarray::NDArray;

const FORMAT: &str = "kvstore-optimizer-states";
const VERSION: u64 = 1;

/// The store-wide part of an optimizer's state.
pub(crate) struct Snapshot {
    pub num_update: u64,
    pub scheduler: Option<LrScheduler>,
    pub values: Vec<f64>,
}

/// A key's state read from a file, with the weight shape it was saved for.
pub(crate) struct LoadedKey {
    pub key: Key,
    pub shape: Vec<usize>,
    pub state: KeyState,
}

fn corrupt(context: &str, what: impl std::fmt::Display) -> Error {
    Error::Io {
        context: context.to_string(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not a valid optimizer-state file: {what}"),
        ),
    }
}

fn st_dtype(d: DType) -> Result<StDtype> {
    match d {
        DType::F32 => Ok(StDtype::F32),
        DType::F64 => Ok(StDtype::F64),
        other => Err(Error::Internal(format!("optimizer state of dtype {other}"))),
    }
}

/// The file's bytes for the states of `keys` (key, weight shape, state).
pub(crate) fn encode(rt: &Runtime, snapshot: &Snapshot, keys: &[(Key, Vec<usize>, &KeyState)]) -> Result<Vec<u8>> {
    let opt = rt.optimizer();
    let names = opt.rule.states();
    // Hold every array's bytes while the views borrow them.
    let guards: Vec<Vec<_>> = keys
        .iter()
        .map(|(_, _, s)| s.states.iter().chain(&s.master).map(NDArray::read).collect::<Result<Vec<_>>>())
        .collect::<Result<_>>()?;
    let mut tensors: Vec<(String, TensorView<'_>)> = Vec::new();
    let mut meta_keys = Vec::new();
    for (n, ((key, shape, state), bufs)) in keys.iter().zip(&guards).enumerate() {
        let arrays: Vec<&NDArray> = state.states.iter().chain(&state.master).collect();
        for (j, (a, buf)) in arrays.iter().zip(bufs).enumerate() {
            let name = match names.get(j) {
                Some(s) => format!("k{n}.{s}"),
                None => format!("k{n}.master"),
            };
            let view = TensorView::new(st_dtype(a.dtype())?, a.shape().to_vec(), buf.bytes())
                .map_err(|e| Error::Internal(format!("optimizer state tensor {name}: {e}")))?;
            tensors.push((name, view));
        }
        meta_keys.push(json!({
            "key": key.as_str(),
            "count": state.count,
            "shape": shape,
            "state_dtype": state.states.first().or(state.master.as_ref()).map(|a| a.dtype().name()),
            "master": state.master.is_some(),
        }));
    }
    let params: serde_json::Map<String, Value> =
        opt.params.0.iter().map(|(k, v)| (k.to_string(), if v.is_nan() { Value::Null } else { json!(v) })).collect();
    let metadata = HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("version".to_string(), VERSION.to_string()),
        ("optimizer".to_string(), opt.name.to_string()),
        ("params".to_string(), Value::Object(params).to_string()),
        ("states".to_string(), json!(names).to_string()),
        ("num_update".to_string(), snapshot.num_update.to_string()),
        ("scheduler".to_string(), snapshot.scheduler.as_ref().map_or(Value::Null, LrScheduler::to_json).to_string()),
        ("global".to_string(), json!(snapshot.values).to_string()),
        ("keys".to_string(), Value::Array(meta_keys).to_string()),
    ]);
    safetensors::serialize(tensors, Some(metadata)).map_err(|e| Error::Internal(format!("optimizer states: {e}")))
}

/// Reads a file's bytes: the store-wide snapshot and every key's state. Checks the
/// format, that the file is for the installed optimizer, and that every tensor is
/// there with the shape and dtype the metadata says; the store-side checks (keys and
/// shapes of this store) are the caller's.
pub(crate) fn decode(rt: &Runtime, bytes: &[u8], context: &str) -> Result<(Snapshot, Vec<LoadedKey>)> {
    let file = SafeTensors::deserialize(bytes).map_err(|e| corrupt(context, e))?;
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| corrupt(context, e))?;
    let meta = meta.metadata().as_ref().ok_or_else(|| corrupt(context, "no metadata"))?;
    let get = |name: &str| meta.get(name).ok_or_else(|| corrupt(context, format!("no \"{name}\" in the metadata")));
    let json = |name: &str| -> Result<Value> { serde_json::from_str(get(name)?).map_err(|e| corrupt(context, e)) };
    if get("format")? != FORMAT || get("version")? != &VERSION.to_string() {
        return Err(corrupt(context, "unknown format or version"));
    }
    let opt = rt.optimizer();
    let saved_for = get("optimizer")?;
    if saved_for != opt.name {
        return Err(Error::invalid_argument(format!(
            "{context}: the file holds states of optimizer {saved_for}, but the store's optimizer is {}",
            opt.name
        )));
    }
    let names = opt.rule.states();
    if json("states")? != json!(names) {
        return Err(Error::invalid_argument(format!(
            "{context}: the file's state arrays differ from this {} optimizer's ({names:?})",
            opt.name
        )));
    }
    let num_update = get("num_update")?.parse::<u64>().map_err(|e| corrupt(context, e))?;
    let scheduler = match json("scheduler")? {
        Value::Null => None,
        v => Some(LrScheduler::from_json(&v).ok_or_else(|| corrupt(context, "bad scheduler"))?),
    };
    let values: Vec<f64> = serde_json::from_value(json("global")?).map_err(|e| corrupt(context, e))?;
    let keys = json("keys")?;
    let keys = keys.as_array().ok_or_else(|| corrupt(context, "\"keys\" is not a list"))?;
    let mut loaded = Vec::with_capacity(keys.len());
    for (n, k) in keys.iter().enumerate() {
        let bad = |what: &str| corrupt(context, format!("key entry {n}: {what}"));
        let key = Key::from(k["key"].as_str().ok_or_else(|| bad("no key"))?);
        let count = k["count"].as_u64().ok_or_else(|| bad("no count"))?;
        let shape: Vec<usize> = serde_json::from_value(k["shape"].clone()).map_err(|_| bad("no shape"))?;
        let master = k["master"].as_bool().ok_or_else(|| bad("no master flag"))?;
        let tensor_names = names.iter().map(|s| format!("k{n}.{s}")).chain(master.then(|| format!("k{n}.master")));
        let mut arrays = Vec::new();
        for name in tensor_names {
            let t = file.tensor(&name).map_err(|_| bad(&format!("tensor {name} is missing")))?;
            if t.shape() != shape.as_slice() {
                return Err(bad(&format!("tensor {name} has shape {:?}, the key {shape:?}", t.shape())));
            }
            let a = match t.dtype() {
                StDtype::F32 => {
                    let v: Vec<f32> =
                        t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                    NDArray::from_vec(&shape, v)?
                }
                StDtype::F64 => {
                    let v: Vec<f64> = t
                        .data()
                        .chunks_exact(8)
                        .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                        .collect();
                    NDArray::from_vec(&shape, v)?
                }
                other => return Err(bad(&format!("tensor {name} has dtype {other:?}"))),
            };
            arrays.push(a);
        }
        let master = if master { arrays.pop() } else { None };
        loaded.push(LoadedKey { key, shape, state: KeyState { count, states: arrays, master } });
    }
    Ok((Snapshot { num_update, scheduler, values }, loaded))
}
