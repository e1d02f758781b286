//! Optimizer-state files (`save_optimizer_states` / `load_optimizer_states`):
//! safetensors, one tensor per state array (`k{n}.{state}`, `k{n}.master`), and JSON
//! metadata holding the optimizer's name and hyper-parameters, `num_update`, the
//! schedule's state, the rule's global values, and per key its name, update count,
//! shape and dtype, and a CRC-32 of all of it (`checksum`). MXNet pickled a dict of
//! NDArrays; this format is documented, checked whole on load, and readable by any
//! safetensors tool.
//!
//! Files are written to a temporary file beside the destination, flushed, and renamed
//! over it; only regular files are read, and no more than their header declares.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use safetensors::tensor::TensorView;
use safetensors::{Dtype as StDtype, SafeTensors};
use serde_json::{Value, json};

use super::{KeyState, LrScheduler, MAX_COUNT, Runtime};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::key::Key;
use crate::ndarray::NDArray;

const FORMAT: &str = "kvstore-optimizer-states";
/// 2: with `checksum`. Files of version 1 (no checksum) still load.
const VERSION: u64 = 2;
/// The largest header read (safetensors' own limit).
const MAX_HEADER: u64 = 100_000_000;
/// The metadata entry holding the checksum, `crc32:` and 8 hex digits.
const CHECKSUM: &str = "checksum";

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
    if let Some((key, _, st)) = keys.iter().find(|(_, _, st)| st.states.len() != names.len()) {
        return Err(Error::Internal(format!(
            "save_optimizer_states: key \"{key}\" has {} state arrays, optimizer {} has {}",
            st.states.len(),
            opt.name,
            names.len()
        )));
    }
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
    let mut metadata = metadata;
    let sum = checksum(&metadata, tensors.iter().map(|(n, t)| (n.as_str(), t.dtype(), t.shape(), t.data())));
    metadata.insert(CHECKSUM.to_string(), format!("crc32:{sum:08x}"));
    safetensors::serialize(tensors, Some(metadata)).map_err(|e| Error::Internal(format!("optimizer states: {e}")))
}

/// CRC-32 of everything a file says: every metadata entry but the checksum, and every
/// tensor's name, dtype, shape and bytes, each length-prefixed, in name order.
pub(crate) fn checksum<'a>(
    metadata: &HashMap<String, String>,
    tensors: impl Iterator<Item = (&'a str, StDtype, &'a [usize], &'a [u8])>,
) -> u32 {
    checksum_of(
        metadata,
        tensors.map(|(n, d, s, b)| {
            let mut crc = crc32fast::Hasher::new();
            crc.update(b);
            (n, d, s, b.len(), crc)
        }),
    )
}

/// [`checksum`] from each tensor's length and the CRC-32 state of its bytes, for a file
/// whose tensors were hashed as they were written (a commit, `kvstore-commit`), not read again.
pub(crate) fn checksum_of<'a>(
    metadata: &HashMap<String, String>,
    tensors: impl Iterator<Item = (&'a str, StDtype, &'a [usize], usize, crc32fast::Hasher)>,
) -> u32 {
    let mut h = crc32fast::Hasher::new();
    let field = |h: &mut crc32fast::Hasher, b: &[u8]| {
        h.update(&(b.len() as u64).to_le_bytes());
        h.update(b);
    };
    let sorted: BTreeMap<&String, &String> = metadata.iter().filter(|(k, _)| k.as_str() != CHECKSUM).collect();
    for (k, v) in sorted {
        field(&mut h, k.as_bytes());
        field(&mut h, v.as_bytes());
    }
    let tensors: BTreeMap<&str, _> = tensors.map(|(n, d, s, len, crc)| (n, (d, s, len, crc))).collect();
    for (name, (dtype, shape, len, crc)) in tensors {
        field(&mut h, name.as_bytes());
        field(&mut h, format!("{dtype:?}").as_bytes());
        let dims: Vec<u8> = shape.iter().flat_map(|d| (*d as u64).to_le_bytes()).collect();
        field(&mut h, &dims);
        h.update(&(len as u64).to_le_bytes());
        h.combine(&crc);
    }
    h.finalize()
}

/// Checks the file's checksum; a file of version 1 has none and loads (said once).
fn verify_checksum(file: &SafeTensors<'_>, meta: &HashMap<String, String>, context: &str) -> Result<()> {
    let Some(stored) = meta.get(CHECKSUM) else {
        if meta.get("version").map(String::as_str) == Some("1") {
            static SAID: AtomicBool = AtomicBool::new(false);
            if !SAID.swap(true, Ordering::Relaxed) {
                crate::say!(
                    "kvstore: {context}: the file is of version 1, which has no checksum; it was loaded unchecked \
                     (save it again to add one)"
                );
            }
            return Ok(());
        }
        return Err(corrupt(context, "no checksum"));
    };
    let tensors = file.tensors();
    let sum = checksum(meta, tensors.iter().map(|(n, t)| (n.as_str(), t.dtype(), t.shape(), t.data())));
    if stored != &format!("crc32:{sum:08x}") {
        return Err(corrupt(context, "the checksum does not match the contents (the file is damaged)"));
    }
    Ok(())
}

/// Where a save to `path` writes: through symbolic links to their target; refused when
/// that is something other than a regular file or a missing one.
pub(crate) fn save_target(path: &Path, op: &str) -> Result<PathBuf> {
    let mut target = path.to_path_buf();
    // Follow links one at a time (a dangling link's target is created), at most as
    // many as the kernel would.
    for _ in 0..40 {
        match std::fs::symlink_metadata(&target) {
            Ok(m) if m.file_type().is_symlink() => {
                let link = std::fs::read_link(&target)
                    .map_err(|source| Error::Io { context: format!("{op} to {}", shown(path)), source })?;
                target = match target.parent() {
                    Some(dir) => dir.join(link),
                    None => link,
                };
            }
            Ok(m) if m.is_file() => return Ok(target),
            Ok(m) => {
                return Err(Error::invalid_argument(format!(
                    "{op} to {}: {} is {}, not a regular file: give the path of a file",
                    shown(path),
                    shown(&target),
                    file_kind(&m)
                )));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(target),
            Err(source) => return Err(Error::Io { context: format!("{op} to {}", shown(path)), source }),
        }
    }
    Err(Error::invalid_argument(format!("{op} to {}: too many levels of symbolic links", shown(path))))
}

/// A path for a message, shortened when long.
pub(crate) fn shown(path: &Path) -> String {
    crate::key::shorten(&path.display().to_string()).into_owned()
}

fn file_kind(m: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// The temporary names of saves to a file named `name`: `.{name}.{pid}.{n}.kvstore-tmp`.
fn tmp_name(name: &str, pid: u32, n: u64) -> String {
    format!(".{name}.{pid}.{n}.kvstore-tmp")
}

/// Removes temporary files of saves to `target` whose process is gone (killed while
/// saving); those of live processes, this one included, are left alone.
fn remove_stale_tmp(dir: &Path, name: &str) {
    let Ok(listing) = std::fs::read_dir(dir) else { return };
    let prefix = format!(".{name}.");
    for entry in listing.flatten() {
        let file = entry.file_name();
        let Some(rest) = file.to_str().and_then(|f| f.strip_prefix(&prefix)?.strip_suffix(".kvstore-tmp")) else {
            continue;
        };
        let Some((pid, n)) = rest.split_once('.') else { continue };
        let (Ok(pid), Ok(_)) = (pid.parse::<u32>(), n.parse::<u64>()) else { continue };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Writes `bytes` to `target` (from [`save_target`]) through a temporary file in its
/// directory: written, flushed to disk, renamed over `target`, and the directory
/// flushed, so that `target` is always either the old file or the new one, whole.
pub(crate) fn write_file(target: &Path, bytes: &[u8], op: &str) -> Result<()> {
    let (tmp, mut f) = temp_file(target, op)?;
    let written = f.write_all(bytes).and_then(|()| finish_file(&f, &tmp, target));
    written.map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        Error::Io { context: format!("{op} to {}", shown(target)), source }
    })
}

/// A new temporary file beside `target` (made exclusively, 0600, or with the mode of
/// the file it will replace), for [`finish_file`] to put in its place: its path and the
/// file, open for writing. Temporaries of saves whose process is gone are removed first.
pub(crate) fn temp_file(target: &Path, op: &str) -> Result<(PathBuf, File)> {
    let name = target
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::invalid_argument(format!("{op} to {}: not a file name", shown(target))))?;
    let dir = parent_of(target);
    remove_stale_tmp(&dir, name);
    static SAVES: AtomicU64 = AtomicU64::new(0);
    let tmp = dir.join(tmp_name(name, std::process::id(), SAVES.fetch_add(1, Ordering::Relaxed)));
    let made = (|| -> std::io::Result<File> {
        let f = crate::files::create_new(&tmp)?;
        if let Ok(m) = std::fs::metadata(target) {
            f.set_permissions(m.permissions())?;
        }
        Ok(f)
    })();
    made.map(|f| (tmp.clone(), f)).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        Error::Io { context: format!("{op} to {}", shown(target)), source }
    })
}

/// Makes the temporary file `tmp` ([`temp_file`], written; `file`, open) durable as
/// `target`: its data synced, renamed over `target`, and the rename synced with the
/// directory.
pub(crate) fn finish_file(file: &File, tmp: &Path, target: &Path) -> std::io::Result<()> {
    file.sync_all()?;
    std::fs::rename(tmp, target)?;
    // The rename is durable once the directory is.
    File::open(parent_of(target))?.sync_all()
}

fn parent_of(target: &Path) -> PathBuf {
    match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Reads a state file: only a regular file (a FIFO with no writer would block, a device
/// would never end), and only the bytes its header declares (which must be the file's
/// size).
pub(crate) fn read_file(path: &Path, context: &str) -> Result<Vec<u8>> {
    let io = |source| Error::Io { context: context.to_string(), source };
    let not_regular = |m: &std::fs::Metadata| {
        Error::invalid_argument(format!("{context}: {} is {}, not a regular file", shown(path), file_kind(m)))
    };
    let m = std::fs::metadata(path).map_err(io)?;
    if !m.is_file() {
        return Err(not_regular(&m));
    }
    // O_NONBLOCK: if the path was swapped for a FIFO since, opening it does not wait.
    let mut f = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(io)?;
    let m = f.metadata().map_err(io)?;
    if !m.is_file() {
        return Err(not_regular(&m));
    }
    let size = m.len();
    let mut head = [0u8; 8];
    f.read_exact(&mut head).map_err(|_| corrupt(context, format!("the file is {size} bytes, too short")))?;
    let n = u64::from_le_bytes(head);
    if n > MAX_HEADER || n > size - 8 {
        return Err(corrupt(context, format!("a header of {n} bytes in a file of {size}")));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(io)?;
    let end = data_end(&header).ok_or_else(|| corrupt(context, "the header is not a safetensors header"))?;
    let declared = 8 + n + end;
    if declared != size {
        return Err(corrupt(context, format!("the header declares {declared} bytes, the file has {size}")));
    }
    let mut bytes = Vec::with_capacity(declared as usize);
    bytes.extend_from_slice(&head);
    bytes.extend_from_slice(&header);
    f.take(end).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 != declared {
        return Err(corrupt(context, "the file changed while it was read"));
    }
    Ok(bytes)
}

/// The end of the data section that a safetensors header declares.
fn data_end(header: &[u8]) -> Option<u64> {
    let v: Value = serde_json::from_slice(header).ok()?;
    let mut end = 0u64;
    for (name, t) in v.as_object()? {
        if name == "__metadata__" {
            continue;
        }
        end = end.max(t.get("data_offsets")?.get(1)?.as_u64()?);
    }
    Some(end)
}

/// A key of the store as a load sees it: its name, its weight and its state.
pub(crate) struct KeySlot<'a> {
    pub(crate) key: &'a Key,
    /// The key's whole shape (a table on owners' slot holds its rows only).
    pub(crate) shape: &'a [usize],
    pub(crate) weight: &'a NDArray,
    pub(crate) state: &'a mut Option<KeyState>,
}

/// Puts the states of a decoded file into the store's keys: every key of the file must
/// be a key of the store, with the shape it had when saved and states the optimizer
/// accepts. All is checked before anything changes; then every key's state is the
/// file's (keys the file does not name start afresh, as after `set_optimizer`).
///
/// # Errors
/// [`Error::KeyNotInitialized`], [`Error::ShapeMismatch`], or the optimizer's error for
/// a state it does not accept; nothing changed.
pub(crate) fn install(
    rt: &Runtime,
    loaded: Vec<LoadedKey>,
    slots: &mut [KeySlot<'_>],
    op: &'static str,
    context: &str,
) -> Result<()> {
    let at: HashMap<&Key, usize> = slots.iter().enumerate().map(|(i, s)| (s.key, i)).collect();
    let mut targets = Vec::with_capacity(loaded.len());
    for l in &loaded {
        let Some(&i) = at.get(&l.key) else {
            return Err(Error::KeyNotInitialized { op, key: l.key.clone() });
        };
        let weight = slots[i].weight;
        if slots[i].shape != l.shape.as_slice() {
            return Err(Error::ShapeMismatch {
                context: format!("{context}: key \"{}\"", l.key),
                key: Some(l.key.clone()),
                expected: slots[i].shape.to_vec(),
                got: l.shape.clone(),
            });
        }
        rt.check_loaded(&l.key, weight, &l.state)?;
        targets.push(i);
    }
    for s in slots.iter_mut() {
        *s.state = None;
    }
    for (l, i) in loaded.into_iter().zip(targets) {
        *slots[i].state = Some(l.state);
    }
    Ok(())
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
    if get("format")? != FORMAT || !["1", "2"].contains(&get("version")?.as_str()) {
        return Err(corrupt(context, "unknown format or version"));
    }
    verify_checksum(&file, meta, context)?;
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
    if num_update > MAX_COUNT {
        return Err(corrupt(context, format!("num_update {num_update} is above 2^53")));
    }
    let scheduler = match json("scheduler")? {
        Value::Null => None,
        v => Some(LrScheduler::from_json(&v).ok_or_else(|| corrupt(context, "bad scheduler"))?),
    };
    let values: Vec<f64> = serde_json::from_value(json("global")?).map_err(|e| corrupt(context, e))?;
    let keys = json("keys")?;
    let keys = keys.as_array().ok_or_else(|| corrupt(context, "\"keys\" is not a list"))?;
    let mut loaded = Vec::with_capacity(keys.len());
    let mut seen = std::collections::HashSet::new();
    for (n, k) in keys.iter().enumerate() {
        let bad = |what: &str| corrupt(context, format!("key entry {n}: {what}"));
        let key = Key::from(k["key"].as_str().ok_or_else(|| bad("no key"))?);
        if !seen.insert(key.clone()) {
            return Err(bad(&format!("key \"{key}\" appears twice")));
        }
        let count = k["count"].as_u64().filter(|&c| c <= MAX_COUNT).ok_or_else(|| bad("no count up to 2^53"))?;
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

// ---- what a whole-store checkpoint keeps of the optimizer (`kvstore/checkpoint.rs`) ----

/// The names of the state arrays of the installed optimizer's rule, in order.
pub(crate) fn state_names(rt: &Runtime) -> &'static [&'static str] {
    rt.optimizer().rule.states()
}

/// Everything needed to build `rt` again exactly as it is now: the optimizer (name,
/// hyper-parameters, per-key multipliers, the schedule it was built with) and its
/// store-wide state (`num_update`, the schedule's progress, the rule's global values).
pub(crate) fn runtime_json(rt: &Runtime) -> Value {
    let opt = rt.optimizer();
    let snapshot = rt.snapshot();
    let params: serde_json::Map<String, Value> =
        opt.params.0.iter().map(|(k, v)| (k.to_string(), if v.is_nan() { Value::Null } else { json!(v) })).collect();
    let mults =
        |m: &HashMap<Key, f64>| -> BTreeMap<String, f64> { m.iter().map(|(k, v)| (k.to_string(), *v)).collect() };
    json!({
        "name": opt.name,
        "params": params,
        "lr_mult": mults(&opt.lr_mult),
        "wd_mult": mults(&opt.wd_mult),
        "scheduler": opt.scheduler.as_ref().map_or(Value::Null, LrScheduler::to_json),
        "states": opt.rule.states(),
        "num_update": snapshot.num_update,
        "schedule": snapshot.scheduler.as_ref().map_or(Value::Null, LrScheduler::to_json),
        "global": snapshot.values,
    })
}

/// Builds the runtime [`runtime_json`] described, in the state it was in; `bad` makes
/// the error for a part that is missing or wrong.
pub(crate) fn runtime_from_json(v: &Value, bad: &dyn Fn(String) -> Error) -> Result<Runtime> {
    let name = v["name"].as_str().ok_or_else(|| bad("the optimizer has no name".into()))?;
    let mut builder = super::Optimizer::builder(name);
    let params = v["params"].as_object().ok_or_else(|| bad("the optimizer has no hyper-parameters".into()))?;
    for (p, value) in params {
        if !value.is_null() {
            let x = value.as_f64().ok_or_else(|| bad(format!("hyper-parameter {p} is not a number")))?;
            builder = builder.param(p, x);
        }
    }
    for (field, lr) in [("lr_mult", true), ("wd_mult", false)] {
        let mults = v[field].as_object().ok_or_else(|| bad(format!("the optimizer has no {field}")))?;
        for (k, m) in mults {
            let m = m.as_f64().ok_or_else(|| bad(format!("{field} of key \"{k}\" is not a number")))?;
            builder = if lr { builder.lr_mult(k.as_str(), m) } else { builder.wd_mult(k.as_str(), m) };
        }
    }
    // Any problem with the hyper-parameters is the file's: it names what it holds.
    let mut opt = builder.build().map_err(|e| bad(format!("the optimizer: {e}")))?;
    let scheduler = |field: &str| match &v[field] {
        Value::Null => Ok(None),
        s => LrScheduler::from_json(s).map(Some).ok_or_else(|| bad(format!("a bad {field}"))),
    };
    // The schedule the optimizer was built with (its hand-over of the learning rate
    // already done), as it was: not handed over again.
    opt.scheduler = scheduler("scheduler")?;
    if json!(opt.rule.states()) != v["states"] {
        return Err(bad(format!("the state arrays of optimizer {} are not {}", opt.name, v["states"])));
    }
    let num_update = v["num_update"].as_u64().filter(|&n| n <= MAX_COUNT);
    let snapshot = Snapshot {
        num_update: num_update.ok_or_else(|| bad("num_update is not a whole number up to 2^53".into()))?,
        scheduler: scheduler("schedule")?,
        values: serde_json::from_value(v["global"].clone()).map_err(|e| bad(format!("global values: {e}")))?,
    };
    let rt = Runtime::new(opt);
    rt.check_snapshot(&snapshot, "checkpoint").map_err(|e| bad(e.to_string()))?;
    rt.restore(snapshot);
    Ok(rt)
}

#[cfg(test)]
mod tests {
    use super::{Runtime, runtime_from_json, runtime_json};
    use crate::error::Error;
    use crate::optimizer::{Optimizer, OptimizerSpec};

    /// An optimizer's settings come back from JSON bit for bit: from a commit or a state
    /// file (`runtime_json`), and from a binding's description (written as Python's `repr`
    /// and Rust's `{}` write a float, the shortest text that reads back as it). A value
    /// read one unit off made a resumed program's `set_optimizer` of the same optimizer
    /// a different one (1/11 as `rescale_grad`, 1e-3/2250 as the learning rate).
    #[test]
    fn an_optimizers_settings_come_back_from_json_bit_for_bit() {
        let bad = |why: String| Error::invalid_argument(why);
        for n in 1..600u32 {
            let (lr, rescale) = (1e-3 / (n as f64 * 9.0 + 0.25), 1.0 / n as f64);
            let opt = Optimizer::builder("adam").param("learning_rate", lr).param("rescale_grad", rescale).build();
            let rt = Runtime::new(opt.expect("adam"));
            let back = runtime_from_json(&runtime_json(&rt), &bad).expect("read back");
            assert_eq!(back.identity(), rt.identity(), "1/{n}");
            let spec = format!(r#"{{"name": "sgd", "params": {{"learning_rate": {lr}, "rescale_grad": {rescale}}}}}"#);
            let opt = OptimizerSpec::from_json(&spec).and_then(|s| s.build()).expect("sgd");
            assert_eq!(opt.param("learning_rate").map(f64::to_bits), Some(lr.to_bits()), "{spec}");
            assert_eq!(opt.param("rescale_grad").map(f64::to_bits), Some(rescale.to_bits()), "{spec}");
        }
    }
}
