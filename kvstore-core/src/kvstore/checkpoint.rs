//! Whole-store checkpoints (`save_checkpoint` / `load_checkpoint`): every key's name,
//! shape, dtype and value, the optimizer with its hyper-parameters and per-key
//! multipliers, every key's optimizer state and update count, the schedule's state, and
//! a CRC-32 of every tensor and of the whole file. The file is safetensors with JSON
//! metadata, written and read with the machinery of the optimizer-state files
//! (`optimizer/states.rs`: temporary file and rename, fsync of the file and its
//! directory, special files refused, bounded reads).
//!
//! Tensors: `v{n}` is the value of the `n`-th key (in the order the store updates keys
//! within a call: the order they were initialised in, or that of a loaded file's run),
//! `s{n}.{state}` its optimizer states and `s{n}.master` its f32 master copy. Metadata:
//! `format`, `version`, `merger` (`assign`, `custom` or `optimizer`), `optimizer`
//! (null, or everything needed to build it again in its saved state), `keys` (per key:
//! `key`, `shape`, `dtype`, `crc32`, `state`: null or `count`, `master`, `crc32` of
//! each state tensor, and `stype`: `"row_sparse"` for a row-sparse key, absent else), `store` (the kind and number of workers that saved it, for
//! people), and `checksum`.
//!
//! Nothing in a file depends on the number of workers or devices that saved it: under
//! `dist_sync` every worker holds the same values, so rank 0 writes them, and a file
//! loads into any store kind on any number of workers.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype as StDtype, SafeTensors};
use serde_json::{Value, json};

use super::agree::{Said, by_value, ranks, word};
use super::data::{Entry, Merger, Slot, Store};
use super::locks::Held;
use crate::context::Context;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::key::{Key, shorten};
use crate::ndarray::NDArray;
use crate::optimizer::MAX_COUNT;
use crate::optimizer::states::{self as opt_states, shown};
use crate::optimizer::{KeyState, Runtime, state_dtype};

const FORMAT: &str = "kvstore-checkpoint";
const VERSION: &str = "1";
const CHECKSUM: &str = "checksum";

fn st_dtype(d: DType) -> StDtype {
    match d {
        DType::F32 => StDtype::F32,
        DType::F64 => StDtype::F64,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::I32 => StDtype::I32,
        DType::I64 => StDtype::I64,
        DType::I8 => StDtype::I8,
        DType::U8 => StDtype::U8,
    }
}

fn corrupt(context: &str, what: impl std::fmt::Display) -> Error {
    Error::Io {
        context: context.to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not a valid checkpoint: {what}")),
    }
}

fn crc(bytes: &[u8]) -> String {
    format!("{:08x}", crc32fast::hash(bytes))
}

/// What pushes did with their sums when the file was saved, as it is loaded.
enum SavedMerger {
    /// The sum replaced the value.
    Assign,
    /// A custom updater: it is code, so it is not in the file; loading keeps the store's.
    Custom,
    /// An optimizer, rebuilt in the state it was saved in.
    Optimizer(Box<Runtime>),
}

impl SavedMerger {
    /// The merger a store takes from the file: `None` keeps the store's (a custom
    /// updater's file).
    fn into_merger(self) -> Option<Merger> {
        match self {
            SavedMerger::Assign => Some(Merger::Assign),
            SavedMerger::Custom => None,
            // Keys of any dtype may be in the file (the optimizer refuses a push to a
            // key it cannot update, as before the checkpoint); each key's state was
            // checked against its value when read.
            SavedMerger::Optimizer(rt) => Some(Merger::Optimizer(Arc::new(*rt))),
        }
    }
}

/// One key of a file, read and checked.
pub(super) struct SavedKey {
    pub(super) key: Key,
    pub(super) value: NDArray,
    pub(super) state: Option<KeyState>,
    /// Whether the key is row-sparse (`"stype": "row_sparse"`; absent: dense).
    pub(super) row_sparse: bool,
}

/// A file, read and checked whole.
struct Checkpoint {
    keys: Vec<SavedKey>,
    merger: SavedMerger,
    /// Names the file for the comparison across workers: its checksum and length.
    hash: u64,
}

/// A tensor of the file, after checking its dtype, shape and CRC-32: its bytes.
fn checked<'a>(
    file: &SafeTensors<'a>,
    name: &str,
    dtype: DType,
    shape: &[usize],
    crc32: &Value,
    bad: &dyn Fn(String) -> Error,
) -> Result<&'a [u8]> {
    let t = file.tensor(name).map_err(|_| bad(format!("tensor {name} is missing")))?;
    if t.dtype() != st_dtype(dtype) || t.shape() != shape {
        return Err(bad(format!(
            "tensor {name} is {:?} {:?}, the metadata says {dtype} {shape:?}",
            t.dtype(),
            t.shape()
        )));
    }
    if crc32.as_str() != Some(crc(t.data()).as_str()) {
        return Err(bad(format!("tensor {name} is damaged: its CRC-32 does not match")));
    }
    Ok(t.data())
}

/// A checked tensor's bytes as a new host array.
fn host_array(shape: &[usize], dtype: DType, bytes: &[u8]) -> Result<NDArray> {
    let a = NDArray::zeros_with(shape, dtype, Context::default())?;
    a.write()?.bytes_mut().copy_from_slice(bytes);
    Ok(a)
}

/// One key of a file, read and checked, its tensors still the file's bytes.
pub(super) struct KeyBytes<'a> {
    key: Key,
    shape: Vec<usize>,
    dtype: DType,
    value: &'a [u8],
    /// The update count and the state tensors (the optimizer's, then the master copy's).
    state: Option<(u64, Vec<&'a [u8]>, bool)>,
    row_sparse: bool,
}

impl KeyBytes<'_> {
    /// The key as new host arrays (a copy of its tensors).
    pub(super) fn arrays(&self) -> Result<SavedKey> {
        let value = host_array(&self.shape, self.dtype, self.value)?;
        let state_dtype = state_dtype(self.dtype);
        let state = match &self.state {
            None => None,
            Some((count, tensors, master)) => {
                let mut arrays: Vec<NDArray> =
                    tensors.iter().map(|t| host_array(&self.shape, state_dtype, t)).collect::<Result<_>>()?;
                let master = if *master { arrays.pop() } else { None };
                Some(KeyState { count: *count, states: arrays, master })
            }
        };
        Ok(SavedKey { key: self.key.clone(), value, state, row_sparse: self.row_sparse })
    }
}

/// A file read and checked whole (format, every tensor's dtype, shape and CRC-32, the
/// file's checksum, the optimizer, every key's state against it), its tensors still in
/// the file's bytes: [`KeyBytes::arrays`] copies one key out, so that a loader may put
/// each key in place before it copies the next one.
pub(super) struct Layout<'a> {
    keys: Vec<KeyBytes<'a>>,
    merger: SavedMerger,
    /// Names the file for the comparison across workers: its checksum and length.
    hash: u64,
}

impl<'a> Layout<'a> {
    /// What the file says pushes do with their sums (`None` keeps the store's: a file
    /// saved with a custom updater; else the file's assignment or optimizer), and its
    /// keys in the file's order.
    pub(super) fn split(self) -> (Option<Merger>, Vec<KeyBytes<'a>>) {
        (self.merger.into_merger(), self.keys)
    }
}

/// Reads a file's bytes whole and checks them: format, every tensor's CRC-32, the
/// file's checksum, the optimizer, and every key's value and state (which must fit the
/// optimizer); copies no tensor.
pub(super) fn read<'a>(bytes: &'a [u8], context: &str) -> Result<Layout<'a>> {
    let file = SafeTensors::deserialize(bytes).map_err(|e| corrupt(context, e))?;
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| corrupt(context, e))?;
    let meta = meta.metadata().as_ref().ok_or_else(|| corrupt(context, "no metadata"))?;
    let get = |name: &str| meta.get(name).ok_or_else(|| corrupt(context, format!("no \"{name}\" in the metadata")));
    let json = |name: &str| -> Result<Value> { serde_json::from_str(get(name)?).map_err(|e| corrupt(context, e)) };
    if get("format")? != FORMAT {
        return Err(corrupt(context, format!("the format is \"{}\", not \"{FORMAT}\"", shorten(get("format")?))));
    }
    if get("version")? != VERSION {
        return Err(corrupt(context, format!("version {} is not known here", shorten(get("version")?))));
    }
    let bad = |what: String| corrupt(context, what);
    let merger = match get("merger")?.as_str() {
        "assign" => SavedMerger::Assign,
        "custom" => SavedMerger::Custom,
        "optimizer" => SavedMerger::Optimizer(Box::new(opt_states::runtime_from_json(&json("optimizer")?, &bad)?)),
        other => return Err(bad(format!("unknown merger \"{}\"", shorten(other)))),
    };
    let keys = json("keys")?;
    let keys = keys.as_array().ok_or_else(|| bad("\"keys\" is not a list".into()))?;
    let mut saved = Vec::with_capacity(keys.len());
    let mut seen = HashSet::new();
    for (n, k) in keys.iter().enumerate() {
        let bad = |what: String| corrupt(context, format!("key entry {n}: {what}"));
        let key = Key::from(k["key"].as_str().ok_or_else(|| bad("no key".into()))?);
        if !seen.insert(key.clone()) {
            return Err(bad(format!("key \"{key}\" appears twice")));
        }
        let shape: Vec<usize> = serde_json::from_value(k["shape"].clone()).map_err(|_| bad("no shape".into()))?;
        let dtype: DType = k["dtype"].as_str().and_then(|d| d.parse().ok()).ok_or_else(|| bad("no dtype".into()))?;
        let value = checked(&file, &format!("v{n}"), dtype, &shape, &k["crc32"], &bad)?;
        let state = match (&k["state"], &merger) {
            (Value::Null, _) => None,
            (s, SavedMerger::Optimizer(rt)) => {
                let count = s["count"].as_u64().filter(|&c| c <= MAX_COUNT).ok_or_else(|| bad("no count".into()))?;
                let master = s["master"].as_bool().ok_or_else(|| bad("no master flag".into()))?;
                let state_dtype = state_dtype(dtype);
                let names = opt_states::state_names(rt).iter().map(|s| format!("s{n}.{s}"));
                let names: Vec<String> = names.chain(master.then(|| format!("s{n}.master"))).collect();
                let crcs = s["crc32"].as_array().filter(|c| c.len() == names.len());
                let crcs = crcs.ok_or_else(|| bad(format!("{} state checksums expected", names.len())))?;
                let tensors: Vec<&[u8]> = names
                    .iter()
                    .zip(crcs)
                    .map(|(name, c)| checked(&file, name, state_dtype, &shape, c, &bad))
                    .collect::<Result<_>>()?;
                let states = tensors.len() - usize::from(master);
                rt.check_loaded_kinds(&key, dtype, &vec![state_dtype; states], master)?;
                Some((count, tensors, master))
            }
            _ => return Err(bad("a state, but no optimizer".into())),
        };
        let row_sparse = match &k["stype"] {
            Value::Null => false,
            Value::String(s) if s == "row_sparse" => true,
            Value::String(s) if s == "default" => false,
            other => return Err(bad(format!("unknown stype {}", shorten(&other.to_string())))),
        };
        saved.push(KeyBytes { key, shape, dtype, value, state, row_sparse });
    }
    let tensors = file.tensors();
    let sum = opt_states::checksum(meta, tensors.iter().map(|(n, t)| (n.as_str(), t.dtype(), t.shape(), t.data())));
    if get(CHECKSUM)? != &format!("crc32:{sum:08x}") {
        return Err(corrupt(context, "the checksum does not match the contents (the file is damaged)"));
    }
    // What the workers compare: the contents' checksum (not the bytes', which depend on
    // the order in which the writer's process lists the metadata) and the length.
    let hash = (u64::from(sum) << 32) | (bytes.len() as u64 & 0xffff_ffff);
    Ok(Layout { keys: saved, merger, hash })
}

/// Reads a file's bytes whole ([`read`]) and copies every key out.
fn decode(bytes: &[u8], context: &str) -> Result<Checkpoint> {
    let layout = read(bytes, context)?;
    let keys = layout.keys.iter().map(KeyBytes::arrays).collect::<Result<_>>()?;
    Ok(Checkpoint { keys, merger: layout.merger, hash: layout.hash })
}

/// A key of a loaded file: its slot among the locked entries (`None` for a new key),
/// name, value, optimizer state and whether it is row-sparse.
type PlannedKey = (Option<usize>, Key, NDArray, Option<KeyState>, bool);

/// A loaded file, ready to go into the store: every array already where it will live.
struct Plan {
    /// Per key of the file: its slot among the locked entries, or `None` for a new key.
    keys: Vec<PlannedKey>,
    /// The new merger; `None` keeps the store's (a file saved with a custom updater).
    merger: Option<Merger>,
}

/// The store as one consistent step, for a file: its tensors in the file's order and
/// what its metadata says, taken with every key and the merger held
/// (`Store::snapshot`). Its tensors' CRC-32s are the writer's: each is hashed as its
/// bytes are copied ([`Snapshot::header`]), so a file costs one pass over the data.
/// A durability layer writes one ([`Seam::whole_snapshot`](super::Seam::whole_snapshot)):
/// tensor `i`'s bytes ([`Snapshot::bytes`]) at its offset ([`Snapshot::offsets`]) after
/// the header.
pub struct Snapshot<'a> {
    /// Per tensor: name, dtype, shape and bytes (keys in update order, each value then
    /// its optimizer states and master copy).
    pub(super) tensors: Vec<(String, StDtype, Vec<usize>, &'a [u8])>,
    /// Per key: its metadata without checksums, and how many tensors it has.
    keys: Vec<(Value, usize)>,
    /// The file's metadata but `keys` and the checksum.
    fixed: HashMap<String, String>,
    /// The tensors in the file's order: by dtype, widest first, then by name (as
    /// safetensors writes them), so that every tensor's data is aligned to its element.
    pub(super) file_order: Vec<usize>,
    /// The keys' gradient-compression residuals, of keys that have them (this rank's
    /// own: a commit keeps them apart from the file, `kvstore-commit`).
    pub(super) residuals: Vec<(&'a str, &'a [Vec<f32>])>,
    /// Per tensor, where this rank holds only its part of it (a snapshot in parts, of a
    /// `dist_sync` store whose state lives on owners): each rank's byte range of it, by
    /// rank; `None` for a tensor held whole.
    pub(super) parts: Vec<Option<Vec<Range<usize>>>>,
}

/// The length of a safetensors file's header-length field.
const LEN_FIELD: usize = 8;

impl Snapshot<'_> {
    /// The file's header (its length field, then the JSON metadata padded to 8 bytes),
    /// with the CRC-32 state `crcs` of each tensor's bytes. Its length does not depend
    /// on the CRCs (each is 8 hex digits), so a writer may reserve it with any.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a number of checksums other than
    /// [`Snapshot::count`]; [`Error::Internal`] where the metadata cannot be written.
    pub fn header(&self, crcs: &[crc32fast::Hasher]) -> Result<Vec<u8>> {
        if crcs.len() != self.tensors.len() {
            return Err(Error::invalid_argument(format!(
                "checkpoint header: {} checksums for {} tensors (one per tensor)",
                crcs.len(),
                self.tensors.len()
            )));
        }
        let hex = |c: &crc32fast::Hasher| format!("{:08x}", c.clone().finalize());
        let mut at = 0;
        let mut meta_keys = Vec::with_capacity(self.keys.len());
        for (meta, n) in &self.keys {
            let mut meta = meta.clone();
            let key_crcs: Vec<String> = crcs[at..at + n].iter().map(hex).collect();
            meta["crc32"] = json!(key_crcs[0]);
            if meta["state"].is_object() {
                meta["state"]["crc32"] = json!(key_crcs[1..]);
            }
            meta_keys.push(meta);
            at += n;
        }
        let mut metadata = self.fixed.clone();
        metadata.insert("keys".to_string(), Value::Array(meta_keys).to_string());
        let tensors = self.tensors.iter().enumerate().zip(crcs);
        let sum = opt_states::checksum_of(
            &metadata,
            tensors.map(|((i, (n, d, s, _)), crc)| (n.as_str(), *d, s.as_slice(), self.len(i), crc.clone())),
        );
        metadata.insert(CHECKSUM.to_string(), format!("crc32:{sum:08x}"));
        let offsets = self.offsets();
        let infos = self
            .file_order
            .iter()
            .map(|&i| {
                let (name, dtype, shape, _) = &self.tensors[i];
                let info = TensorInfo {
                    dtype: *dtype,
                    shape: shape.clone(),
                    data_offsets: (offsets[i], offsets[i] + self.len(i)),
                };
                (name.clone(), info)
            })
            .collect();
        let internal = |e: &dyn std::fmt::Display| Error::Internal(format!("checkpoint: {e}"));
        let metadata = Metadata::new(Some(metadata), infos).map_err(|e| internal(&e))?;
        let mut json = serde_json::to_vec(&metadata).map_err(|e| internal(&e))?;
        json.resize(json.len().next_multiple_of(LEN_FIELD), b' ');
        let mut header = Vec::with_capacity(LEN_FIELD + json.len());
        header.extend_from_slice(&(json.len() as u64).to_le_bytes());
        header.extend_from_slice(&json);
        Ok(header)
    }

    /// The whole file, in memory.
    ///
    /// # Errors
    /// As [`Snapshot::header`]; [`Error::Internal`] for a snapshot in parts.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        if self.parts.iter().any(Option::is_some) {
            return Err(Error::Internal("checkpoint: a snapshot in parts has no whole file in memory".into()));
        }
        let crcs: Vec<crc32fast::Hasher> = self
            .tensors
            .iter()
            .map(|t| {
                let mut crc = crc32fast::Hasher::new();
                crc.update(t.3);
                crc
            })
            .collect();
        let mut bytes = self.header(&crcs)?;
        bytes.reserve_exact(self.data_len());
        self.file_order.iter().for_each(|&i| bytes.extend_from_slice(self.tensors[i].3));
        Ok(bytes)
    }

    /// Each tensor's offset in the file's data (by [`Snapshot::file_order`]).
    pub fn offsets(&self) -> Vec<usize> {
        let mut offsets = vec![0; self.tensors.len()];
        let mut at = 0;
        for &i in &self.file_order {
            offsets[i] = at;
            at += self.len(i);
        }
        offsets
    }

    /// The bytes of all its tensors, whole.
    pub fn data_len(&self) -> usize {
        (0..self.tensors.len()).map(|i| self.len(i)).sum()
    }

    /// Tensor `i`'s length in bytes, whole.
    pub fn len(&self, i: usize) -> usize {
        match &self.parts[i] {
            Some(parts) => parts.iter().map(|p| p.end).max().unwrap_or(0),
            None => self.tensors[i].3.len(),
        }
    }

    /// Where this rank holds only its part of tensor `i` (a snapshot in parts): each
    /// rank's byte range of it, by rank (a rank with none: an empty range), with
    /// [`Snapshot::bytes`] this rank's; `None` where it holds the tensor whole.
    pub fn parts(&self, i: usize) -> Option<&[Range<usize>]> {
        self.parts[i].as_deref()
    }

    /// How many tensors it has.
    pub fn count(&self) -> usize {
        self.tensors.len()
    }

    /// Tensor `i`'s CRC-32, of a tensor in parts, from each rank's part's (`crcs`, by
    /// rank), joined in the order of their ranges; `None` where there is not one per
    /// rank or the ranges do not cover the tensor once.
    pub fn joined_crc(&self, i: usize, crcs: &[u32]) -> Option<crc32fast::Hasher> {
        let parts = self.parts(i)?;
        if crcs.len() != parts.len() {
            return None;
        }
        let mut pieces: Vec<(&Range<usize>, u32)> =
            parts.iter().zip(crcs.iter().copied()).filter(|(range, _)| !range.is_empty()).collect();
        pieces.sort_by_key(|(range, _)| range.start);
        let mut crc = crc32fast::Hasher::new();
        let mut at = 0;
        for (range, piece) in pieces {
            if range.start != at {
                return None;
            }
            crc.combine(&crc32fast::Hasher::new_with_initial_len(piece, range.len() as u64));
            at = range.end;
        }
        (at == self.len(i)).then_some(crc)
    }

    /// Tensor `i`'s bytes (this rank's part of it, where [`Snapshot::parts`] says so).
    pub fn bytes(&self, i: usize) -> &[u8] {
        self.tensors[i].3
    }

    /// The tensors' indices in the file's order.
    pub fn file_order(&self) -> &[usize] {
        &self.file_order
    }

    /// The keys' gradient-compression residuals (key, one per device), of keys that
    /// have them: this rank's own, kept apart from the file.
    pub fn residuals(&self) -> &[(&str, &[Vec<f32>])] {
        &self.residuals
    }
}

impl Store {
    /// Runs `f` on the store as it is, with every key and the merger held for the whole
    /// of it, so that it sees one consistent step. With owners, every key's state is
    /// gathered whole from them (on every worker), unless `in_parts`: then each state
    /// tensor is this worker's part ([`Snapshot::parts`]), and nothing moves.
    pub(super) fn snapshot<R>(
        &self,
        op: &'static str,
        in_parts: bool,
        f: impl FnOnce(&Snapshot<'_>) -> Result<R>,
    ) -> Result<R> {
        let held = Held::new(op, self, &[])?;
        let merger = held.merger_read(op, &self.merger)?;
        let entries = self.entries();
        let locked: Vec<&Arc<Entry>> = entries.iter().collect();
        let guards = held.read(op, &locked)?;
        // Keys are written in the order their updates go (`Slot::order`), so that a
        // run resumed from the file updates them as this one does.
        let mut by_order: Vec<usize> = (0..entries.len()).collect();
        by_order.sort_by_key(|&i| guards[i].order);
        let (entries, guards): (Vec<&Arc<Entry>>, Vec<&Slot>) =
            by_order.iter().map(|&i| (&entries[i], &*guards[i])).unzip();
        let (name, runtime) = match &*merger {
            Merger::Assign => ("assign", None),
            Merger::Custom(_) => ("custom", None),
            Merger::Optimizer(rt) => ("optimizer", Some(rt)),
        };
        let names = runtime.map_or(&[][..], |rt| opt_states::state_names(rt));
        // With owners, every key's state gathered whole (on every worker).
        let pairs: Vec<(&Entry, &Slot)> = entries.iter().map(|e| &***e).zip(guards.iter().copied()).collect();
        let gathered = match runtime {
            Some(rt) if !in_parts => self.whole_states(rt, &pairs)?,
            _ => None,
        };
        // Tables on owners: their values gathered whole too, or in parts.
        let tables = match in_parts {
            false => self.whole_values(&pairs)?,
            true => None,
        };
        // In parts: each worker's elements of each key's state (`None`: held whole).
        let owned = match runtime {
            Some(rt) if in_parts => self.owned_ranges(rt, pairs.iter().map(|(e, _)| (e.owner, e.size()))),
            _ => None,
        };
        let states: Vec<Option<&KeyState>> = match &gathered {
            Some(whole) => whole.iter().map(Option::as_ref).collect(),
            None => guards.iter().map(|g| g.opt.as_ref().filter(|_| runtime.is_some())).collect(),
        };
        // Per key: the value, then its state arrays (with an optimizer only).
        let arrays: Vec<Vec<&NDArray>> = guards
            .iter()
            .zip(&states)
            .enumerate()
            .map(|(n, (g, state))| {
                let value = tables.as_ref().and_then(|t| t[n].as_ref()).unwrap_or(&g.value);
                std::iter::once(value).chain(state.iter().flat_map(|s| s.states.iter().chain(&s.master))).collect()
            })
            .collect();
        let bufs: Vec<Vec<_>> =
            arrays.iter().map(|a| a.iter().map(|a| a.read()).collect::<Result<Vec<_>>>()).collect::<Result<_>>()?;
        let mut tensors = Vec::new();
        let mut parts = Vec::new();
        let mut keys = Vec::with_capacity(entries.len());
        for (n, ((entry, g), (arrays, bufs))) in entries.iter().zip(&guards).zip(arrays.iter().zip(&bufs)).enumerate() {
            let state = states[n];
            if let Some(st) = state
                && st.states.len() != names.len()
            {
                return Err(Error::Internal(format!(
                    "{op}: key \"{}\" has {} state arrays, the optimizer {}",
                    entry.key,
                    st.states.len(),
                    names.len()
                )));
            }
            for (j, (a, buf)) in arrays.iter().zip(bufs).enumerate() {
                let tensor_name = match j {
                    0 => format!("v{n}"),
                    j if j <= names.len() => format!("s{n}.{}", names[j - 1]),
                    _ => format!("s{n}.master"),
                };
                let each = a.dtype().size();
                // A table's value in parts is its rows on each owner.
                let ranges = match (j, &self.collective) {
                    (0, Some(group)) if in_parts && entry.owner.holds_rows() => {
                        Some(entry.owner.ranges(entry.size(), group.size(), true))
                    }
                    (0, _) => None,
                    _ => owned.as_ref().map(|o| o[n].clone()),
                };
                let part = ranges.map(|o| o.iter().map(|r| r.start * each..r.end * each).collect::<Vec<_>>());
                // (A part's shape is the whole key's.)
                let shape = if part.is_some() { entry.shape() } else { a.shape() };
                tensors.push((tensor_name, st_dtype(a.dtype()), shape.to_vec(), buf.bytes()));
                parts.push(part);
            }
            let mut meta = json!({
                "key": entry.key.as_str(),
                "shape": entry.shape(),
                "dtype": entry.dtype.name(),
                "crc32": Value::Null,
                "state": state.map_or(Value::Null, |st| json!({
                    "count": st.count,
                    "master": st.master.is_some(),
                    "crc32": Value::Null,
                })),
            });
            if g.row_sparse {
                meta["stype"] = json!("row_sparse");
            }
            keys.push((meta, arrays.len()));
        }
        let fixed = HashMap::from([
            ("format".to_string(), FORMAT.to_string()),
            ("version".to_string(), VERSION.to_string()),
            ("merger".to_string(), name.to_string()),
            ("optimizer".to_string(), runtime.map_or(Value::Null, |rt| opt_states::runtime_json(rt)).to_string()),
            ("store".to_string(), json!({"kind": self.kind, "workers": self.workers()}).to_string()),
        ]);
        let mut file_order: Vec<usize> = (0..tensors.len()).collect();
        file_order.sort_by(|&a, &b| tensors[b].1.cmp(&tensors[a].1).then_with(|| tensors[a].0.cmp(&tensors[b].0)));
        let residuals = entries
            .iter()
            .zip(&guards)
            .filter(|(_, g)| !g.residuals.is_empty())
            .map(|(e, g)| (e.key.as_str(), g.residuals.as_slice()))
            .collect();
        f(&Snapshot { tensors, keys, fixed, file_order, residuals, parts })
    }

    /// The file's bytes, from the store as it is ([`Store::snapshot`]).
    pub(super) fn checkpoint_bytes(&self, op: &'static str) -> Result<Vec<u8>> {
        self.snapshot(op, false, |snap| snap.to_bytes())
    }

    fn workers(&self) -> usize {
        self.collective.as_ref().map_or(1, |c| c.size())
    }

    /// Under `dist_sync`, tells every worker how every other one fared at `step`, so
    /// that all fail or none does: `local` is this worker's outcome (with the hash of
    /// the file it read, for a load). Errors name the workers that failed, or that read
    /// another file. Elsewhere, and for a worker whose own step failed, it says nothing.
    pub(super) fn agree(
        &self,
        step: &str,
        context: &str,
        local: std::result::Result<u64, ()>,
        what_failed: &str,
    ) -> Result<()> {
        let Some(group) = self.peers() else { return Ok(()) };
        let mut mine = [0u8; 9];
        match local {
            Ok(hash) => mine[..8].copy_from_slice(&hash.to_le_bytes()),
            Err(()) => mine[8] = 1,
        }
        let said = Said::of(group.exchange(step, &mine)?);
        if local.is_err() {
            return Ok(());
        }
        let failed = said.ranks_where(|r| r.get(8) == Some(&1));
        if !failed.is_empty() {
            let those = if failed.len() == 1 { "that rank" } else { "those ranks" };
            return Err(Error::Io {
                context: context.to_string(),
                source: std::io::Error::other(format!(
                    "{} {what_failed} (the error on {those} says why); no rank changed anything",
                    ranks(&failed)
                )),
            });
        }
        let groups = by_value(said.records().map(|r| word(r, 0)));
        if groups.len() > 1 {
            let said: Vec<String> = groups
                .iter()
                .map(|(h, list)| {
                    format!("{} read a file of {} bytes with checksum {:08x}", ranks(list), h & 0xffff_ffff, h >> 32)
                })
                .collect();
            return Err(Error::invalid_argument(format!(
                "{context}: the ranks read different files: {}; every rank must load the same checkpoint, so nothing \
                 was loaded",
                said.join("; ")
            )));
        }
        Ok(())
    }

    /// Saves now (the caller ordered it after the calls before it): rank 0 writes (with
    /// owners, on a file system every rank shares, each rank its own parts), and
    /// every rank returns once the file is durable, or fails if rank 0 failed.
    pub(super) fn save_checkpoint_now(&self, path: &Path) -> Result<()> {
        const OP: &str = "save_checkpoint";
        self.check_step(OP, &[], Ok(()))?;
        // With owners, on a file system every rank shares: each writes its own parts.
        if self.save_in_parts(OP, path)? {
            return Ok(());
        }
        let rank = self.collective.as_ref().map_or(0, |c| c.rank());
        let written = if rank == 0 {
            let bytes = self.checkpoint_bytes(OP);
            opt_states::save_target(path, OP).and_then(|target| opt_states::write_file(&target, &bytes?, OP))
        } else if self.layout == super::layout::Layout::Owners {
            // The owners' states reach rank 0 through every rank's snapshot.
            self.snapshot(OP, false, |_| Ok(()))
        } else {
            Ok(())
        };
        let context = format!("{OP} to {}", shown(path));
        self.agree(OP, &context, written.as_ref().map(|_| 0).map_err(|_| ()), "could not write the file")?;
        written
    }

    /// Loads now (the caller ordered it after the calls before it): every rank reads and
    /// checks the file whole and makes every array it needs, the ranks compare what they
    /// read, and only when every rank succeeded with the same file does any change.
    pub(super) fn load_checkpoint_now(&self, path: &Path) -> Result<()> {
        const OP: &str = "load_checkpoint";
        let context = format!("{OP} from {}", shown(path));
        let read = opt_states::read_file(path, &context);
        self.load_checkpoint_bytes(OP, &context, read.as_deref().map_err(Error::clone)).map(|_| ())
    }

    /// [`Store::load_checkpoint_now`] of a checkpoint's `bytes` (read by the caller; an
    /// error is this rank's failure, which every rank hears of): the checksum of what it
    /// loaded (its contents' and length, as the workers compare them).
    pub(super) fn load_checkpoint_bytes(&self, op: &'static str, context: &str, bytes: Result<&[u8]>) -> Result<u64> {
        self.check_step(op, &[], Ok(()))?;
        let held = Held::new(op, self, &[])?;
        let mut merger = held.merger_write(op, &self.merger)?;
        let entries = self.entries();
        let locked: Vec<&Arc<Entry>> = entries.iter().collect();
        let mut guards = held.write(op, &locked)?;
        let checkpoint = bytes.and_then(|bytes| decode(bytes, context));
        let plan = checkpoint.and_then(|c| {
            let hash = c.hash;
            Ok((self.plan(c, &entries, &guards, context)?, hash))
        });
        self.agree(op, context, plan.as_ref().map(|(_, h)| *h).map_err(|_| ()), "could not read or check the file")?;
        let (plan, hash) = plan?;
        // Everything is checked and made: from here on nothing fails but a key that
        // another thread initialised meanwhile, which is checked before any change.
        let mut table = self.table.write();
        if let Some((_, key, ..)) = plan.keys.iter().find(|(i, k, ..)| i.is_none() && table.contains_key(k)) {
            return Err(Error::AlreadyInitialized {
                op,
                key: key.clone(),
                detail: "it was initialised while the checkpoint was loaded",
            });
        }
        let replaced = plan.merger.is_some();
        if replaced {
            for g in guards.iter_mut() {
                g.opt = None;
            }
        }
        // With owners, each key keeps this worker's part of its state (the runtime
        // the file brings, or the store's), cut before anything changes: a new key's
        // owner is where `add_entry` will place it, in the file's order.
        let runtime = match (&plan.merger, &*merger) {
            (Some(Merger::Optimizer(rt)), _) | (None, Merger::Optimizer(rt)) => Some(Arc::clone(rt)),
            _ => None,
        };
        let mut balance = table.balance.clone();
        let mut keys = Vec::with_capacity(plan.keys.len());
        for (slot, key, value, state, row_sparse) in plan.keys {
            let owner = match slot {
                Some(i) => entries[i].owner,
                None => self.place_loaded(&mut balance, &value, row_sparse),
            };
            let n = value.size();
            let state = match (&runtime, state) {
                (Some(rt), Some(st)) => Some(self.own_part(owner, n, rt, st)?),
                (_, state) => state,
            };
            // A table on owners keeps this worker's rows.
            let (shape, value) = (value.shape().to_vec(), self.own_rows(owner, value)?);
            keys.push((slot, key, value, state, row_sparse, owner, shape));
        }
        // The file's keys are updated in the file's order from now on, after the
        // store's other keys: the order of the run that saved it.
        for (slot, key, value, state, row_sparse, owner, shape) in keys {
            let order = table.take_order();
            match slot {
                Some(i) => {
                    let g = &mut guards[i];
                    g.value = value;
                    g.opt = state;
                    g.merge = None;
                    g.spare = None;
                    g.order = order;
                    g.row_sparse = row_sparse || owner.holds_rows();
                }
                None if owner.holds_rows() => {
                    let mut slot = Slot::new(value, order);
                    slot.opt = state;
                    slot.row_sparse = true;
                    self.add_table(&mut table, key, slot, &shape)?;
                }
                None => {
                    let mut slot = Slot::new(value, order);
                    slot.opt = state;
                    slot.row_sparse = row_sparse;
                    self.add_entry(&mut table, key, slot);
                }
            }
        }
        if let Some(new) = plan.merger {
            let old = std::mem::replace(&mut *merger, new);
            drop((table, guards, merger));
            drop(old);
        }
        Ok(hash)
    }

    /// Checks a file against the store and makes every array where it will live: a
    /// key the store has keeps its shape, dtype and context; a new key is initialised
    /// as `init` would.
    fn plan(
        &self,
        c: Checkpoint,
        entries: &[Arc<Entry>],
        guards: &[parking_lot::RwLockWriteGuard<'_, Slot>],
        context: &str,
    ) -> Result<Plan> {
        let at: HashMap<&Key, usize> = entries.iter().enumerate().map(|(i, e)| (&e.key, i)).collect();
        let mut keys = Vec::with_capacity(c.keys.len());
        for SavedKey { key, value, state, row_sparse } in c.keys {
            let slot = at.get(&key).copied();
            let value = match slot {
                Some(i) => {
                    let stored = &guards[i].value;
                    super::plan::check_like(
                        || format!("{context}: key \"{key}\""),
                        &key,
                        entries[i].like(),
                        (value.shape(), value.dtype()),
                    )?;
                    if stored.context() == value.context() { value } else { value.copy_to(stored.context())? }
                }
                None => self.comm.init_value(&value)?,
            };
            let mut state = state;
            for a in state.iter_mut().flat_map(|st| st.states.iter_mut().chain(st.master.iter_mut())) {
                if a.context() != value.context() {
                    *a = a.copy_to(value.context())?;
                }
            }
            keys.push((slot, key, value, state, row_sparse));
        }
        Ok(Plan { keys, merger: c.merger.into_merger() })
    }
}

impl Store {
    /// `save_optimizer_states` once this store's calls are done: every key's state with
    /// the optimizer's, written to `target`.
    pub(super) fn save_optimizer_states_now(&self, path: &Path) -> Result<()> {
        const OP: &str = "save_optimizer_states";
        // (A path this worker cannot write to fails its own call only, after the
        // others' states were gathered.)
        let target = opt_states::save_target(path, OP);
        if self.layout == super::layout::Layout::Owners {
            // Every worker gathers the owners' states: a step of them all.
            self.check_step(OP, &[], Ok(()))?;
        }
        let held = Held::new(OP, self, &[])?;
        let merger = held.merger_read(OP, &self.merger)?;
        let runtime = Store::runtime(OP, &merger)?;
        let entries = self.entries();
        let locked: Vec<&Arc<Entry>> = entries.iter().collect();
        let guards = held.read(OP, &locked)?;
        // With owners, every key's state gathered whole (every worker saves).
        let pairs: Vec<(&Entry, &Slot)> = entries.iter().map(|e| &**e).zip(guards.iter().map(|g| &**g)).collect();
        let gathered = self.whole_states(runtime, &pairs)?;
        let states: Vec<Option<&KeyState>> = match &gathered {
            Some(whole) => whole.iter().map(Option::as_ref).collect(),
            None => guards.iter().map(|g| g.opt.as_ref()).collect(),
        };
        let keyed: Vec<(Key, Vec<usize>, &KeyState)> = entries
            .iter()
            .zip(&guards)
            .zip(states)
            .filter_map(|((e, _), st)| Some((e.key.clone(), e.shape().to_vec(), st?)))
            .collect();
        let bytes = opt_states::encode(runtime, &runtime.snapshot(), &keyed)?;
        drop(guards);
        drop(merger);
        opt_states::write_file(&target?, &bytes, OP)
    }

    /// `load_optimizer_states` once this store's calls are done: the file at `path`
    /// (`context` names it in errors) installed in every key's state.
    pub(super) fn load_optimizer_states_now(&self, path: &Path, context: &str) -> Result<()> {
        const OP: &str = "load_optimizer_states";
        let held = Held::new(OP, self, &[])?;
        // Fail early, before reading, when no optimizer is set.
        Store::runtime(OP, &*held.merger_read(OP, &self.merger)?)?;
        let bytes = opt_states::read_file(path, context)?;
        let merger = held.merger_write(OP, &self.merger)?;
        let runtime = Store::runtime(OP, &merger)?;
        let (snapshot, loaded) = opt_states::decode(runtime, &bytes, context)?;
        runtime.check_snapshot(&snapshot, context)?;
        let entries = self.entries();
        let locked: Vec<&Arc<Entry>> = entries.iter().collect();
        let mut guards = held.write(OP, &locked)?;
        let mut slots: Vec<opt_states::KeySlot<'_>> = entries
            .iter()
            .zip(guards.iter_mut())
            .map(|(e, g)| {
                let Slot { value, opt, .. } = &mut **g;
                opt_states::KeySlot { key: &e.key, shape: e.shape(), weight: value, state: opt }
            })
            .collect();
        // With owners, each key's state is cut to this worker's part before anything
        // changes.
        let by_key: HashMap<&Key, &Arc<Entry>> = entries.iter().map(|e| (&e.key, e)).collect();
        let loaded = loaded
            .into_iter()
            .map(|mut l| {
                if let Some(e) = by_key.get(&l.key) {
                    let n = e.shape().iter().product();
                    l.state = self.own_part(e.owner, n, runtime, l.state)?;
                }
                Ok(l)
            })
            .collect::<Result<Vec<_>>>()?;
        opt_states::install(runtime, loaded, &mut slots, OP, context)?;
        runtime.restore(snapshot);
        Ok(())
    }
}
