//! Property tests against a tiny reference model: random sequences of `init`, `push`,
//! `pull`, `pushpull`, `pushpull_in_place` and `broadcast` in every list form, valid and
//! invalid, with and without an updater, over every dtype; and the thread-count
//! independence of big reductions.
//!
//! The data are small integers (plus a few values at the edge of each dtype in stored
//! values), so that every sum is exact and the only rounding is the one the store does
//! on purpose: once per sum and once per update, to the key's dtype. The model rounds
//! the same way and must agree with the store bit for bit after every call.
//!
//! Each property is a function of a [`Backend`], whose `ctx(i)` places the arrays of a
//! call (`cpu(i)`, or `gpu(i)` of the simulated or CUDA devices); `backend_tests!`
//! makes them tests of each backend.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use kvstore_core::{Context, DType, Element, ErrorKind, KVStore, Key, Keys, NDArray, Updater, Values, bf16, f16};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;

use crate::Backend;

// ----- data -----

/// splitmix64. Array contents come from a seed per operation, so that a failing case
/// shrinks by dropping operations while the data of the kept ones stay the same.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Rounds an exact value to `dtype` as the store does after a sum or an update: floats
/// to nearest, integers wrap to their width.
fn round_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F32 => f64::from(x as f32),
        DType::F64 => x,
        DType::F16 => f16::from_f64(x).to_f64(),
        DType::BF16 => bf16::from_f64(x).to_f64(),
        DType::I32 => f64::from(x as i64 as i32),
        DType::I64 => x as i64 as f64,
        DType::I8 => f64::from(x as i64 as i8),
        DType::U8 => f64::from(x as i64 as u8),
    }
}

/// Values (exact in their dtype) where one more small addition rounds (floats) or wraps
/// (integers). i64 has none: the model computes in f64, which cannot hold i64's
/// extremes exactly.
fn edge_values(dtype: DType) -> &'static [f64] {
    match dtype {
        DType::F32 => &[16_777_216.0, -16_777_215.0],
        DType::F64 => &[9_007_199_254_740_992.0, -9_007_199_254_740_991.0],
        DType::F16 => &[2048.0, -2048.0, 65504.0],
        DType::BF16 => &[256.0, -256.0, 3.389_531_389_251_535_5e38],
        DType::I32 => &[2_147_483_647.0, -2_147_483_648.0],
        DType::I64 => &[1_099_511_627_776.0],
        DType::I8 => &[127.0, -128.0, 126.0],
        DType::U8 => &[255.0, 254.0],
    }
}

/// What an array of a call is filled with.
#[derive(Clone, Copy)]
enum Fill {
    /// Small integers: values pushed, whose sums must stay exact.
    Pushed,
    /// Small integers and now and then an edge value: values stored by `init`.
    Stored,
    /// A sentinel, to see whether a pull wrote the array.
    Out,
}

const SENTINEL: f64 = 5.0;

impl Fill {
    fn value(self, rng: &mut Rng, dtype: DType) -> f64 {
        let small = |rng: &mut Rng| {
            if dtype == DType::U8 { rng.below(4) as f64 } else { rng.below(7) as f64 - 3.0 }
        };
        match self {
            Fill::Pushed => small(rng),
            Fill::Stored if rng.below(8) == 0 => {
                let edges = edge_values(dtype);
                edges[rng.below(edges.len())]
            }
            Fill::Stored => small(rng),
            Fill::Out => SENTINEL,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Spec {
    shape: Vec<usize>,
    dtype: DType,
}

impl Spec {
    fn size(&self) -> usize {
        self.shape.iter().product()
    }
}

/// An array of `spec` on `ctx` holding `data` (exact in every dtype by construction).
fn array(spec: &Spec, data: &[f64], ctx: Context) -> NDArray {
    fn typed<T: Element>(shape: &[usize], data: &[f64], ctx: Context, convert: fn(f64) -> T) -> NDArray {
        let data: Vec<T> = data.iter().map(|&v| convert(v)).collect();
        NDArray::from_slice_in(shape, &data, ctx).expect("test data match their shape")
    }
    let shape = &spec.shape;
    match spec.dtype {
        DType::F32 => typed(shape, data, ctx, |v| v as f32),
        DType::F64 => typed(shape, data, ctx, |v| v),
        DType::F16 => typed(shape, data, ctx, f16::from_f64),
        DType::BF16 => typed(shape, data, ctx, bf16::from_f64),
        DType::I32 => typed(shape, data, ctx, |v| v as i32),
        DType::I64 => typed(shape, data, ctx, |v| v as i64),
        DType::I8 => typed(shape, data, ctx, |v| v as i8),
        DType::U8 => typed(shape, data, ctx, |v| v as u8),
    }
}

/// A shape other than `shape`: one more axis of length 1 (same number of elements), or
/// one element more.
fn wrong_shape(shape: &[usize], extra_axis: bool) -> Vec<usize> {
    if extra_axis { shape.iter().copied().chain([1]).collect() } else { vec![shape.iter().product::<usize>() + 1] }
}

/// What an updater was called with: key and index, in call order.
type UpdateLog = Arc<Mutex<Vec<(String, usize)>>>;

/// The updater that makes a push accumulate instead of assign (`stored += merged`), and
/// logs its calls.
fn accumulate(log: UpdateLog) -> impl Updater {
    move |key: &Key, index: usize, merged: &NDArray, stored: &NDArray| {
        log.lock().unwrap_or_else(PoisonError::into_inner).push((key.as_str().to_owned(), index));
        stored.add_assign(merged)
    }
}

// ----- the model -----

#[derive(Debug, Clone)]
struct Slot {
    spec: Spec,
    values: Vec<f64>,
}

/// The reference: each key's dtype, shape and exact values, and the keys in init order;
/// and the updater calls expected, beside those the store made.
#[derive(Default)]
struct Model {
    order: Vec<String>,
    slots: HashMap<String, Slot>,
    accumulate: bool,
    expected_updates: Vec<(String, usize)>,
    updates: UpdateLog,
}

impl Model {
    fn has(&self, key: &str) -> bool {
        self.slots.contains_key(key)
    }

    fn spec(&self, key: &str) -> Option<Spec> {
        self.slots.get(key).map(|s| s.spec.clone())
    }

    fn values(&self, key: &str) -> Vec<f64> {
        self.slots.get(key).map(|s| s.values.clone()).unwrap_or_default()
    }

    fn init(&mut self, key: &str, spec: Spec, values: Vec<f64>) {
        self.order.push(key.to_owned());
        self.slots.insert(key.to_owned(), Slot { spec, values });
    }

    /// One key's part of a push: the exact sum rounded once, then assigned or added
    /// (and rounded again).
    fn push(&mut self, key: &str, inputs: &[&[f64]]) {
        let accumulate = self.accumulate;
        let Some(slot) = self.slots.get_mut(key) else { return };
        let dtype = slot.spec.dtype;
        for (i, stored) in slot.values.iter_mut().enumerate() {
            let merged = round_to(dtype, inputs.iter().map(|v| v[i]).sum());
            *stored = if accumulate { round_to(dtype, *stored + merged) } else { merged };
        }
    }

    /// A whole push: `owners[p]` is the key of array `p`; each key gets the sum of its
    /// arrays, in call order.
    ///
    /// With the updater, it runs once per distinct key, in the order the keys were first
    /// initialised, with the key's index in that order.
    fn push_all(&mut self, names: &[String], owners: &[usize], data: &[Vec<f64>]) {
        let mut keys: Vec<usize> = Vec::new();
        for &k in owners {
            if !keys.iter().any(|&seen| names[seen] == names[k]) {
                keys.push(k);
            }
        }
        if self.accumulate {
            let mut updates: Vec<(String, usize)> = keys
                .iter()
                .filter_map(|&k| self.order.iter().position(|o| *o == names[k]).map(|i| (names[k].clone(), i)))
                .collect();
            updates.sort_by_key(|u| u.1);
            self.expected_updates.extend(updates);
        }
        for k in keys {
            let inputs: Vec<&[f64]> =
                owners.iter().zip(data).filter(|(o, _)| names[**o] == names[k]).map(|(_, d)| &d[..]).collect();
            self.push(&names[k], &inputs);
        }
    }
}

/// Pulls every key of the model from the store and compares exactly; also the key order
/// and the updater calls since the last check.
fn check_store(b: &dyn Backend, kv: &KVStore, model: &mut Model, step: usize) -> Result<(), TestCaseError> {
    let keys: Vec<String> = kv.keys().iter().map(|k| k.as_str().to_owned()).collect();
    prop_assert_eq!(&keys, &model.order, "step {}: the store's keys", step);
    let updates = std::mem::take(&mut *model.updates.lock().unwrap_or_else(PoisonError::into_inner));
    prop_assert_eq!(updates, std::mem::take(&mut model.expected_updates), "step {}: updater calls", step);
    for name in &model.order {
        let slot = &model.slots[name];
        let out = NDArray::zeros_with(&slot.spec.shape, slot.spec.dtype, b.ctx(0))?;
        kv.pull(name.as_str(), &out, 0)?;
        prop_assert_eq!(out.to_f64_vec()?, slot.values.clone(), "step {}: key {:?}", step, name);
    }
    Ok(())
}

// ----- operations -----

/// The key pool. `"3"` and the integer 3 are one key.
const POOL: [&str; 7] = ["a", "b", "c", "0", "1", "2", "3"];

/// A key of a call: an initialised one (`live`, when there is one) or any of the pool.
#[derive(Debug, Clone, Copy)]
struct Pick {
    live: bool,
    slot: usize,
    /// Pass a numeric key as an integer rather than a string.
    as_int: bool,
}

#[derive(Debug, Clone)]
struct KeyArg {
    /// A list of keys (`Keys::Many`), else the first pick alone (`Keys::One`).
    list: bool,
    picks: Vec<Pick>,
}

/// The form of the values or outs of a call. For one key: one array, or `Flat(m)`
/// arrays (`Nested` counts as `Flat` of its first count). For a list of keys: one array
/// per key (`One` counts as `Flat` when there is more than one key), or `Nested`, the
/// given numbers of arrays per key (cycled).
#[derive(Debug, Clone)]
enum Layout {
    One,
    Flat(usize),
    Nested(Vec<usize>),
}

/// A deliberate mistake in one array (index modulo the number of arrays), in the number
/// of arrays of a list call (`Length(true)`: one more), or in the form (`Form`: a list
/// of lists for one key, one array for a list of keys).
#[derive(Debug, Clone, Copy)]
enum Fault {
    None,
    Shape(usize),
    DType(usize),
    Length(bool),
    Form,
}

#[derive(Debug, Clone)]
enum Op {
    Init { keys: KeyArg, values: Layout, specs: Vec<Spec>, fault: Fault, seed: u64 },
    Broadcast { keys: KeyArg, values: Layout, outs: Layout, specs: Vec<Spec>, fault: Fault, seed: u64 },
    Push { keys: KeyArg, values: Layout, fault: Fault, share: bool, seed: u64 },
    Pull { keys: KeyArg, outs: Layout, fault: Fault, seed: u64 },
    PushPull { keys: KeyArg, values: Layout, outs: Layout, fault: Fault, on_outs: bool, share: bool, seed: u64 },
    PushPullInPlace { keys: KeyArg, values: Layout, fault: Fault, seed: u64 },
    SetUpdater(bool),
}

/// The keys of a call, resolved against the model.
struct Call {
    list: bool,
    names: Vec<String>,
    keys: Keys,
}

fn key_of(name: &str, as_int: bool) -> Key {
    match name.parse::<i32>() {
        Ok(n) if as_int => Key::from(n),
        _ => Key::from(name),
    }
}

fn resolve(model: &Model, arg: &KeyArg) -> Call {
    let picks = if arg.list { &arg.picks[..] } else { &arg.picks[..1] };
    let names: Vec<String> = picks
        .iter()
        .map(|p| match model.order.len() {
            n if p.live && n > 0 => model.order[p.slot % n].clone(),
            _ => POOL[p.slot % POOL.len()].to_owned(),
        })
        .collect();
    let mut keys: Vec<Key> = names.iter().zip(picks).map(|(n, p)| key_of(n, p.as_int)).collect();
    let keys = if arg.list { Keys::Many(keys) } else { Keys::One(keys.remove(0)) };
    Call { list: arg.list, names, keys }
}

/// How many arrays a call passes, in the form of [`Values`].
enum Structure {
    One,
    Many(usize),
    Nested(Vec<usize>),
}

impl Structure {
    fn new(call: &Call, layout: &Layout, fault: Fault) -> Self {
        let n = call.names.len();
        let n = match (call.list, fault) {
            (true, Fault::Length(true)) => n + 1,
            (true, Fault::Length(false)) => n - 1,
            _ => n,
        };
        let first = |counts: &[usize]| counts.first().copied().unwrap_or(1);
        match (call.list, fault, layout) {
            (false, Fault::Form, Layout::Nested(counts)) => Structure::Nested(vec![first(counts)]),
            (false, Fault::Form, _) => Structure::Nested(vec![1]),
            (true, Fault::Form, _) => Structure::One,
            (false, _, Layout::One) => Structure::One,
            (false, _, Layout::Flat(m)) => Structure::Many(*m),
            (false, _, Layout::Nested(counts)) => Structure::Many(first(counts)),
            (true, _, Layout::One) if n == 1 => Structure::One,
            (true, _, Layout::One | Layout::Flat(_)) => Structure::Many(n),
            (true, _, Layout::Nested(counts)) => Structure::Nested(counts.iter().copied().cycle().take(n).collect()),
        }
    }

    fn total(&self) -> usize {
        match self {
            Structure::One => 1,
            Structure::Many(n) => *n,
            Structure::Nested(counts) => counts.iter().sum(),
        }
    }

    /// The key (index into the call's names) the store pairs each array with, or the
    /// error the pairing must fail with: MXNet's flattening rules, written down again.
    fn owners(&self, call: &Call) -> Result<Vec<usize>, ErrorKind> {
        let n = call.names.len();
        match (call.list, self) {
            (false, Structure::One) => Ok(vec![0]),
            (false, Structure::Many(m)) => Ok(vec![0; *m]),
            (false, Structure::Nested(_)) => Err(ErrorKind::InvalidArgument),
            (true, Structure::One) if n == 1 => Ok(vec![0]),
            (true, Structure::Many(m)) if *m == n => Ok((0..n).collect()),
            (true, Structure::Nested(counts)) if counts.len() == n => {
                Ok(counts.iter().enumerate().flat_map(|(k, &m)| std::iter::repeat_n(k, m)).collect())
            }
            (true, _) => Err(ErrorKind::LengthMismatch),
        }
    }
}

/// The values or the outs of a call, with what the model needs to know about them.
struct Side {
    built: Built,
    arrays: Vec<NDArray>,
    specs: Vec<Spec>,
    /// The contents of each array when the call was made.
    data: Vec<Vec<f64>>,
    owners: Result<Vec<usize>, ErrorKind>,
    /// The array made to mismatch its key, and the error that must cause.
    fault: Option<(usize, ErrorKind)>,
}

enum Built {
    One(NDArray),
    Many(Vec<NDArray>),
    Nested(Vec<Vec<NDArray>>),
}

impl Built {
    fn values(&self) -> Values<'_> {
        match self {
            Built::One(a) => Values::One(a),
            Built::Many(v) => Values::Many(v),
            Built::Nested(v) => Values::Nested(v),
        }
    }
}

/// Builds one side of a call. `spec_of(k)` is the spec the arrays of key `k` must have;
/// `share` makes the first two arrays one handle when they have the same spec.
#[allow(clippy::too_many_arguments, reason = "one side of a call: where its arrays go, how they are shaped and filled")]
fn side(
    b: &dyn Backend,
    rng: &mut Rng,
    call: &Call,
    layout: &Layout,
    fault: Fault,
    spec_of: &dyn Fn(usize) -> Spec,
    fill: Fill,
    share: bool,
) -> Side {
    let structure = Structure::new(call, layout, fault);
    let total = structure.total();
    let owners = structure.owners(call);
    let last = call.names.len() - 1;
    let mut specs: Vec<Spec> = (0..total).map(|p| spec_of(owners.as_ref().map_or(p.min(last), |o| o[p]))).collect();
    let mut fault_at = None;
    if owners.is_ok() && total > 0 {
        match fault {
            Fault::Shape(i) => {
                let p = i % total;
                specs[p].shape = wrong_shape(&specs[p].shape, i % 2 == 0);
                fault_at = Some((p, ErrorKind::ShapeMismatch));
            }
            Fault::DType(i) => {
                let p = i % total;
                let at = DType::ALL.iter().position(|&d| d == specs[p].dtype).unwrap_or(0);
                specs[p].dtype = DType::ALL[(at + 1 + i % 7) % DType::ALL.len()];
                fault_at = Some((p, ErrorKind::DTypeMismatch));
            }
            Fault::None | Fault::Length(_) | Fault::Form => {}
        }
    }
    let mut data: Vec<Vec<f64>> =
        specs.iter().map(|s| (0..s.size()).map(|_| fill.value(rng, s.dtype)).collect()).collect();
    let mut arrays: Vec<NDArray> =
        specs.iter().zip(&data).map(|(s, d)| array(s, d, b.ctx(rng.below(4) as u32))).collect();
    if share && total >= 2 && specs[0] == specs[1] {
        data[1] = data[0].clone();
        arrays[1] = arrays[0].clone();
    }
    let built = match &structure {
        Structure::One => Built::One(arrays[0].clone()),
        Structure::Many(_) => Built::Many(arrays.clone()),
        Structure::Nested(counts) => {
            let mut rest = arrays.iter().cloned();
            Built::Nested(counts.iter().map(|&m| rest.by_ref().take(m).collect()).collect())
        }
    };
    Side { built, arrays, specs, data, owners, fault: fault_at }
}

/// A spec for keys the store does not hold.
fn any_spec(rng: &mut Rng) -> Spec {
    Spec { shape: vec![rng.below(4) + 1], dtype: DType::ALL[rng.below(DType::ALL.len())] }
}

/// The errors a push, pull or pushpull may fail with: a pairing error, else an
/// uninitialised key or a mismatched array. Empty: the call must succeed.
fn access_errors(model: &Model, call: &Call, sides: &[&Side]) -> Vec<ErrorKind> {
    let mut kinds: Vec<ErrorKind> = sides.iter().filter_map(|s| s.owners.as_ref().err().copied()).collect();
    if !kinds.is_empty() {
        return kinds;
    }
    for s in sides {
        let owners = s.owners.as_deref().unwrap_or_default();
        if owners.iter().any(|&k| !model.has(&call.names[k])) {
            kinds.push(ErrorKind::KeyNotInitialized);
        }
        if let Some((p, kind)) = s.fault
            && model.has(&call.names[owners[p]])
        {
            kinds.push(kind);
        }
    }
    kinds
}

/// The errors an init (or the init half of a broadcast) may fail with.
fn init_errors(model: &Model, call: &Call, values: &Side) -> Vec<ErrorKind> {
    match &values.owners {
        Err(kind) => vec![*kind],
        Ok(owners) => {
            let mut seen = HashSet::new();
            if owners.iter().any(|&k| !seen.insert(&call.names[k]) || model.has(&call.names[k])) {
                vec![ErrorKind::AlreadyInitialized]
            } else {
                Vec::new()
            }
        }
    }
}

/// Checks a call's result against the errors it may fail with; true if it succeeded.
fn outcome(result: kvstore_core::Result<()>, possible: &[ErrorKind], step: usize) -> Result<bool, TestCaseError> {
    match result {
        Ok(()) => {
            prop_assert!(possible.is_empty(), "step {}: succeeded, but must fail with one of {:?}", step, possible);
            Ok(true)
        }
        Err(e) => {
            prop_assert!(
                possible.contains(&e.kind()),
                "step {}: failed with {:?} ({}), expected {}",
                step,
                e.kind(),
                e,
                if possible.is_empty() { "success".to_string() } else { format!("one of {possible:?}") }
            );
            Ok(false)
        }
    }
}

/// Every array of `side` holds what it held when the call was made.
fn unchanged(side: &Side, step: usize, what: &str) -> Result<(), TestCaseError> {
    for (p, (a, d)) in side.arrays.iter().zip(&side.data).enumerate() {
        prop_assert_eq!(&a.to_f64_vec()?, d, "step {}: {} {} was changed", step, what, p);
    }
    Ok(())
}

/// Every array of `side` holds the model's value of its key.
fn holds_model(side: &Side, model: &Model, call: &Call, step: usize, what: &str) -> Result<(), TestCaseError> {
    let owners = side.owners.as_deref().unwrap_or_default();
    for (p, (a, &k)) in side.arrays.iter().zip(owners).enumerate() {
        prop_assert_eq!(a.to_f64_vec()?, model.values(&call.names[k]), "step {}: {} {} (key {:?})", step, what, p, k);
    }
    Ok(())
}

/// Adds 1 to every array of `side`: the store copied them, so its values must not move.
fn scribble(side: &Side) -> Result<(), TestCaseError> {
    for a in &side.arrays {
        a.add_assign(1.0)?;
    }
    Ok(())
}

fn run_op(b: &dyn Backend, kv: &KVStore, model: &mut Model, op: &Op, step: usize) -> Result<(), TestCaseError> {
    match op {
        Op::Init { keys, values, specs, fault, seed } => {
            let rng = &mut Rng(*seed);
            let call = resolve(model, keys);
            // A shape or dtype "fault" is no mistake for init: it only varies the spec.
            let values = side(b, rng, &call, values, *fault, &|k| specs[k % specs.len()].clone(), Fill::Stored, false);
            let possible = init_errors(model, &call, &values);
            if outcome(kv.init(call.keys.clone(), values.built.values()), &possible, step)? {
                for ((&k, spec), data) in
                    values.owners.as_deref().unwrap_or_default().iter().zip(&values.specs).zip(&values.data)
                {
                    model.init(&call.names[k], spec.clone(), data.clone());
                }
            }
            unchanged(&values, step, "init value")?;
            scribble(&values)?;
        }
        Op::Broadcast { keys, values, outs, specs, fault, seed } => {
            let rng = &mut Rng(*seed);
            let call = resolve(model, keys);
            let values =
                side(b, rng, &call, values, Fault::None, &|k| specs[k % specs.len()].clone(), Fill::Stored, false);
            let fallback = any_spec(rng);
            let value_spec = |k: usize| {
                let owners = values.owners.as_deref().unwrap_or_default();
                // The store checks an out against the first value of its key (by name).
                let first = owners.iter().position(|&o| call.names[o] == call.names[k]);
                first.map_or_else(|| fallback.clone(), |p| values.specs[p].clone())
            };
            let outs = side(b, rng, &call, outs, *fault, &value_spec, Fill::Out, false);
            let mut possible: Vec<ErrorKind> = outs.owners.as_ref().err().copied().into_iter().collect();
            possible.extend(init_errors(model, &call, &values));
            possible.extend(outs.fault.map(|(_, kind)| kind));
            let result = kv.broadcast(call.keys.clone(), values.built.values(), outs.built.values(), 0);
            if outcome(result, &possible, step)? {
                for ((&k, spec), data) in
                    values.owners.as_deref().unwrap_or_default().iter().zip(&values.specs).zip(&values.data)
                {
                    model.init(&call.names[k], spec.clone(), data.clone());
                }
                holds_model(&outs, model, &call, step, "broadcast out")?;
            } else {
                unchanged(&outs, step, "broadcast out")?;
            }
            unchanged(&values, step, "broadcast value")?;
            scribble(&values)?;
        }
        Op::Push { keys, values, fault, share, seed } => {
            let rng = &mut Rng(*seed);
            let call = resolve(model, keys);
            let fallback = any_spec(rng);
            let spec_of = |k: usize| model.spec(&call.names[k]).unwrap_or_else(|| fallback.clone());
            let values = side(b, rng, &call, values, *fault, &spec_of, Fill::Pushed, *share);
            let possible = access_errors(model, &call, &[&values]);
            if outcome(kv.push(call.keys.clone(), values.built.values(), 0), &possible, step)? {
                model.push_all(&call.names, values.owners.as_deref().unwrap_or_default(), &values.data);
            }
            unchanged(&values, step, "pushed value")?;
            scribble(&values)?;
        }
        Op::Pull { keys, outs, fault, seed } => {
            let rng = &mut Rng(*seed);
            let call = resolve(model, keys);
            let fallback = any_spec(rng);
            let spec_of = |k: usize| model.spec(&call.names[k]).unwrap_or_else(|| fallback.clone());
            let outs = side(b, rng, &call, outs, *fault, &spec_of, Fill::Out, false);
            let possible = access_errors(model, &call, &[&outs]);
            if outcome(kv.pull(call.keys.clone(), outs.built.values(), 0), &possible, step)? {
                holds_model(&outs, model, &call, step, "pull out")?;
            } else {
                unchanged(&outs, step, "pull out")?;
            }
        }
        Op::PushPull { keys, values, outs, fault, on_outs, share, seed } => {
            let rng = &mut Rng(*seed);
            let call = resolve(model, keys);
            let fallback = any_spec(rng);
            let spec_of = |k: usize| model.spec(&call.names[k]).unwrap_or_else(|| fallback.clone());
            let (value_fault, out_fault) = if *on_outs { (Fault::None, *fault) } else { (*fault, Fault::None) };
            let values = side(b, rng, &call, values, value_fault, &spec_of, Fill::Pushed, *share);
            let outs = side(b, rng, &call, outs, out_fault, &spec_of, Fill::Out, false);
            let possible = access_errors(model, &call, &[&values, &outs]);
            let result = kv.pushpull(call.keys.clone(), values.built.values(), outs.built.values(), 0);
            if outcome(result, &possible, step)? {
                model.push_all(&call.names, values.owners.as_deref().unwrap_or_default(), &values.data);
                holds_model(&outs, model, &call, step, "pushpull out")?;
            } else {
                unchanged(&outs, step, "pushpull out")?;
            }
            unchanged(&values, step, "pushpull value")?;
        }
        Op::PushPullInPlace { keys, values, fault, seed } => {
            let rng = &mut Rng(*seed);
            let call = resolve(model, keys);
            let fallback = any_spec(rng);
            let spec_of = |k: usize| model.spec(&call.names[k]).unwrap_or_else(|| fallback.clone());
            let values = side(b, rng, &call, values, *fault, &spec_of, Fill::Pushed, false);
            let possible = access_errors(model, &call, &[&values]);
            if outcome(kv.pushpull_in_place(call.keys.clone(), values.built.values(), 0), &possible, step)? {
                model.push_all(&call.names, values.owners.as_deref().unwrap_or_default(), &values.data);
                holds_model(&values, model, &call, step, "pushpull_in_place value")?;
            } else {
                unchanged(&values, step, "pushpull_in_place value")?;
            }
        }
        Op::SetUpdater(on) => {
            if *on {
                kv.set_updater(accumulate(Arc::clone(&model.updates))).expect("install the updater");
            } else {
                kv.clear_updater().expect("install the updater");
            }
            model.accumulate = *on;
        }
    }
    Ok(())
}

// ----- strategies -----

fn shape() -> impl Strategy<Value = Vec<usize>> {
    prop_oneof![
        Just(vec![]),
        Just(vec![1]),
        Just(vec![1, 1]),
        (1usize..=64).prop_map(|n| vec![n]),
        (1usize..=8, 1usize..=8).prop_map(|(a, b)| vec![a, b]),
        (1usize..=4, 1usize..=4, 1usize..=4).prop_map(|(a, b, c)| vec![a, b, c]),
        Just(vec![0]),
        Just(vec![3, 0]),
    ]
}

fn spec() -> impl Strategy<Value = Spec> {
    (shape(), select(DType::ALL.to_vec())).prop_map(|(shape, dtype)| Spec { shape, dtype })
}

/// Keys, each initialised already with probability about `live`.
fn key_arg(live: f64) -> impl Strategy<Value = KeyArg> {
    let pick = (prop::bool::weighted(live), 0usize..16, any::<bool>()).prop_map(|(live, slot, as_int)| Pick {
        live,
        slot,
        as_int,
    });
    (any::<bool>(), vec(pick, 1..=4)).prop_map(|(list, picks)| KeyArg { list, picks })
}

fn layout() -> impl Strategy<Value = Layout> {
    prop_oneof![Just(Layout::One), (1usize..=4).prop_map(Layout::Flat), vec(1usize..=3, 4).prop_map(Layout::Nested),]
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        12 => Just(Fault::None),
        1 => any::<usize>().prop_map(Fault::Shape),
        1 => any::<usize>().prop_map(Fault::DType),
        1 => any::<bool>().prop_map(Fault::Length),
        1 => Just(Fault::Form),
    ]
}

fn init_op(fault: impl Strategy<Value = Fault>) -> impl Strategy<Value = Op> {
    (key_arg(0.15), layout(), vec(spec(), 4), fault, any::<u64>())
        .prop_map(|(keys, values, specs, fault, seed)| Op::Init { keys, values, specs, fault, seed })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => init_op(fault()),
        1 => (key_arg(0.15), layout(), layout(), vec(spec(), 4), fault(), any::<u64>()).prop_map(
            |(keys, values, outs, specs, fault, seed)| Op::Broadcast { keys, values, outs, specs, fault, seed }
        ),
        4 => (key_arg(0.95), layout(), fault(), any::<bool>(), any::<u64>())
            .prop_map(|(keys, values, fault, share, seed)| Op::Push { keys, values, fault, share, seed }),
        2 => (key_arg(0.95), layout(), fault(), any::<u64>())
            .prop_map(|(keys, outs, fault, seed)| Op::Pull { keys, outs, fault, seed }),
        2 => (key_arg(0.95), layout(), layout(), fault(), any::<bool>(), any::<bool>(), any::<u64>()).prop_map(
            |(keys, values, outs, fault, on_outs, share, seed)| Op::PushPull {
                keys,
                values,
                outs,
                fault,
                on_outs,
                share,
                seed
            }
        ),
        2 => (key_arg(0.95), layout(), fault(), any::<u64>())
            .prop_map(|(keys, values, fault, seed)| Op::PushPullInPlace { keys, values, fault, seed }),
        1 => any::<bool>().prop_map(Op::SetUpdater),
    ]
}

// ----- properties -----

/// Random sequences of calls, valid and invalid, in every list form, agree with the
/// model after every call, on every kind of store and thread count.
pub fn random_call_sequences_agree_with_the_model(b: &dyn Backend) {
    proptest!(ProptestConfig::with_cases(256), |(
        kind in select(vec!["local", "device", "LOCAL_UPDATE_CPU"]),
        threads in 0usize..=2,
        accumulating in any::<bool>(),
        first in init_op(Just(Fault::None)),
        ops in vec(op(), 1..48),
    )| {
        let kv = KVStore::builder(kind).num_threads(threads).build()?;
        let mut model = Model::default();
        run_op(b, &kv, &mut model, &Op::SetUpdater(accumulating), 0)?;
        for (step, op) in std::iter::once(&first).chain(&ops).enumerate() {
            run_op(b, &kv, &mut model, op, step + 1)?;
            check_store(b, &kv, &mut model, step + 1)?;
        }
    });
}

/// An init list with one key already held (or repeated) fails and inits none of its
/// keys; the list without that key goes through.
pub fn an_init_list_with_one_bad_key_inits_nothing(b: &dyn Backend) {
    proptest!(ProptestConfig::with_cases(64), |(
        held in 1usize..=3,
        fresh in 1usize..=4,
        at in any::<usize>(),
        duplicate in any::<bool>(),
        spec in spec(),
    )| {
        let kv = KVStore::create("local")?;
        let one = |s: &Spec| array(s, &vec![1.0; s.size()], b.ctx(0));
        for k in 0..held {
            kv.init(k as i32, &one(&spec))?;
        }
        let before = kv.keys();
        let mut keys: Vec<Key> = (0..fresh).map(|k| Key::from(format!("fresh{k}"))).collect();
        let bad = if duplicate { keys[at % fresh].clone() } else { Key::from(at % held) };
        keys.insert(at % (fresh + 1), bad);
        let values: Vec<NDArray> = keys.iter().map(|_| one(&spec)).collect();
        let e = kv.init(keys.clone(), &values).expect_err("an init list with a bad key must fail");
        prop_assert_eq!(e.kind(), ErrorKind::AlreadyInitialized);
        prop_assert_eq!(kv.keys(), before.clone());
        let out = one(&spec);
        for k in 0..fresh {
            let e = kv.pull(format!("fresh{k}"), &out, 0).expect_err("a key of the failed init must not exist");
            prop_assert_eq!(e.kind(), ErrorKind::KeyNotInitialized);
        }
        // Without the bad key the same list goes through.
        keys.remove(at % (fresh + 1));
        kv.init(keys, &values[..fresh])?;
        prop_assert_eq!(kv.keys().len(), before.len() + fresh);
    });
}

/// A push list with one bad entry (an uninitialised key, a wrong shape or dtype) fails
/// and moves no value; the list without that entry goes through.
pub fn a_push_list_with_one_bad_entry_pushes_nothing(b: &dyn Backend) {
    proptest!(ProptestConfig::with_cases(64), |(
        specs in vec(spec(), 1..=4),
        repeats in vec(0usize..4, 0..4),
        at in any::<usize>(),
        mistake in 0usize..3,
        accumulating in any::<bool>(),
        seed in any::<u64>(),
    )| {
        let rng = &mut Rng(seed);
        let kv = KVStore::create("local")?;
        let mut model = Model::default();
        run_op(b, &kv, &mut model, &Op::SetUpdater(accumulating), 0)?;
        let names: Vec<String> = (0..specs.len()).map(|k| format!("k{k}")).collect();
        for (name, spec) in names.iter().zip(&specs) {
            let data: Vec<f64> = (0..spec.size()).map(|_| Fill::Stored.value(rng, spec.dtype)).collect();
            kv.init(name.as_str(), &array(spec, &data, b.ctx(0)))?;
            model.init(name, spec.clone(), data);
        }
        // Every key once, then some again: a list with repeats.
        let owners: Vec<usize> = (0..specs.len()).chain(repeats.iter().map(|r| r % specs.len())).collect();
        let data: Vec<Vec<f64>> =
            owners.iter().map(|&k| (0..specs[k].size()).map(|_| Fill::Pushed.value(rng, specs[k].dtype)).collect()).collect();
        let mut keys: Vec<String> = owners.iter().map(|&k| names[k].clone()).collect();
        let mut values: Vec<NDArray> =
            owners.iter().zip(&data).map(|(&k, d)| array(&specs[k], d, b.ctx(rng.below(4) as u32))).collect();
        let p = at % keys.len();
        let spec = &specs[owners[p]];
        let expected = match mistake {
            0 => {
                keys[p] = "never initialised".to_owned();
                ErrorKind::KeyNotInitialized
            }
            1 => {
                let shape = wrong_shape(&spec.shape, at % 2 == 0);
                values[p] = array(&Spec { shape: shape.clone(), dtype: spec.dtype }, &vec![1.0; shape.iter().product()], b.ctx(0));
                ErrorKind::ShapeMismatch
            }
            _ => {
                let dtype = if spec.dtype == DType::F64 { DType::F32 } else { DType::F64 };
                values[p] = array(&Spec { shape: spec.shape.clone(), dtype }, &vec![1.0; spec.size()], b.ctx(0));
                ErrorKind::DTypeMismatch
            }
        };
        let e = kv.push(&keys, &values, 0).expect_err("a push list with a bad entry must fail");
        prop_assert_eq!(e.kind(), expected);
        check_store(b, &kv, &mut model, 1)?;
        // The same list without the bad entry goes through, and only then do values move.
        keys.remove(p);
        values.remove(p);
        let mut owners = owners;
        owners.remove(p);
        let mut data = data;
        data.remove(p);
        kv.push(&keys, &values, 0)?;
        model.push_all(&names, &owners, &data);
        check_store(b, &kv, &mut model, 2)?;
    });
}

// ----- thread-count independence -----

/// A non-integer value spread over several binades, so that the order of additions shows.
fn scattered(rng: &mut Rng) -> f32 {
    let mantissa = rng.below(1 << 24) as f32 / (1 << 24) as f32 - 0.5;
    mantissa * 2f32.powi(rng.below(21) as i32 - 10)
}

/// Each value's bits after converting to `dtype`, and arrays holding them.
fn scattered_arrays(b: &dyn Backend, rng: &mut Rng, dtype: DType, n: usize, count: usize) -> Vec<(Vec<f32>, NDArray)> {
    (0..count)
        .map(|i| {
            let raw: Vec<f32> = (0..n).map(|_| scattered(rng)).collect();
            let ctx = b.ctx((i % 4) as u32);
            match dtype {
                DType::F16 => {
                    let v: Vec<f16> = raw.iter().map(|&x| f16::from_f32(x)).collect();
                    (v.iter().map(|x| x.to_f32()).collect(), NDArray::from_slice_in(&[n], &v, ctx))
                }
                DType::BF16 => {
                    let v: Vec<bf16> = raw.iter().map(|&x| bf16::from_f32(x)).collect();
                    (v.iter().map(|x| x.to_f32()).collect(), NDArray::from_slice_in(&[n], &v, ctx))
                }
                _ => (raw.clone(), NDArray::from_slice_in(&[n], &raw, ctx)),
            }
        })
        .map(|(v, a)| (v, a.expect("scattered data match their shape")))
        .collect()
}

/// The bits of the naive sum: left to right in f32, then (f16/bf16) rounded once.
fn naive_sum_bits(dtype: DType, inputs: &[&[f32]]) -> Vec<u32> {
    let n = inputs.first().map_or(0, |v| v.len());
    (0..n)
        .map(|i| {
            let sum = inputs.iter().skip(1).fold(inputs[0][i], |acc, v| acc + v[i]);
            match dtype {
                DType::F16 => u32::from(f16::from_f32(sum).to_bits()),
                DType::BF16 => u32::from(bf16::from_f32(sum).to_bits()),
                _ => sum.to_bits(),
            }
        })
        .collect()
}

fn bits(a: &NDArray) -> kvstore_core::Result<Vec<u32>> {
    Ok(match a.dtype() {
        DType::F16 => a.to_vec::<f16>()?.iter().map(|x| u32::from(x.to_bits())).collect(),
        DType::BF16 => a.to_vec::<bf16>()?.iter().map(|x| u32::from(x.to_bits())).collect(),
        _ => a.to_vec::<f32>()?.iter().map(|x| x.to_bits()).collect(),
    })
}

/// Big pushes (split over the store's threads) and lists of mid-size keys give the
/// naive left-to-right sum bit for bit, for 1, 2 and 4 threads.
pub fn big_pushes_give_the_naive_sum_bit_for_bit_for_any_thread_count(b: &dyn Backend) {
    proptest!(ProptestConfig::with_cases(4), |(
        dtype in select(vec![DType::F32, DType::F16, DType::BF16]),
        count in 2usize..=3,
        odd in 0usize..64,
        seed in any::<u64>(),
    )| {
        let rng = &mut Rng(seed);
        // Over 1 MiB per array, so that the store splits it across its threads; an odd
        // length, so that the last chunk is short.
        let n = ((1 << 20) + (1 << 16)) / dtype.size() + odd;
        let big = scattered_arrays(b, rng, dtype, n, count);
        let big_values: Vec<NDArray> = big.iter().map(|(_, a)| a.clone()).collect();
        let expected_big = naive_sum_bits(dtype, &big.iter().map(|(v, _)| &v[..]).collect::<Vec<_>>());
        // And four mid-size keys in one list call, which run as parallel small jobs.
        let mid = scattered_arrays(b, rng, dtype, 20_000 + odd, 4 * count);
        let mid_keys: Vec<String> = (0..4 * count).map(|i| format!("mid{}", i % 4)).collect();
        let mid_values: Vec<NDArray> = mid.iter().map(|(_, a)| a.clone()).collect();
        let expected_mid: Vec<Vec<u32>> = (0..4)
            .map(|k| naive_sum_bits(dtype, &mid.iter().skip(k).step_by(4).map(|(v, _)| &v[..]).collect::<Vec<_>>()))
            .collect();
        for threads in [1, 2, 4] {
            let kv = KVStore::builder("local").num_threads(threads).build()?;
            let out = NDArray::zeros_with(&[n], dtype, b.ctx(0))?;
            kv.init("big", &out)?;
            kv.push("big", &big_values, 0)?;
            kv.pull("big", &out, 0)?;
            prop_assert!(bits(&out)? == expected_big, "{} threads: one key, {} values of {}", threads, count, dtype);
            // A list of the same key repeated is the same sum.
            let repeated = vec!["big"; count];
            kv.push(&repeated, &big_values, 0)?;
            kv.pull("big", &out, 0)?;
            prop_assert!(bits(&out)? == expected_big, "{} threads: repeated-key list of {}", threads, dtype);
            let mid_outs: Vec<NDArray> =
                (0..4).map(|_| NDArray::zeros_with(&[20_000 + odd], dtype, b.ctx(0))).collect::<Result<_, _>>()?;
            kv.init(&mid_keys[..4], &mid_outs)?;
            kv.push(&mid_keys, &mid_values, 0)?;
            kv.pull(&mid_keys[..4], &mid_outs, 0)?;
            for (k, out) in mid_outs.iter().enumerate() {
                prop_assert!(bits(out)? == expected_mid[k], "{} threads: mid{} of {}", threads, k, dtype);
            }
        }
    });
}
