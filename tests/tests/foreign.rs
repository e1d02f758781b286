//! Arrays over memory the store does not own (`NDArray::from_foreign`): what the Python
//! and Java bindings lend it. They are read and written in place, a read-only one is
//! only ever read, and the owner's memory is given back when the last handle goes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kvstore_core::{DType, ErrorKind, ForeignMemory, KVStore, Key, NDArray};

/// Memory in a shared buffer, counting its drops; `at` bytes in (to misalign it).
struct Lent {
    /// Keeps the memory `ptr` points into alive.
    _buf: Arc<std::sync::Mutex<Vec<u8>>>,
    ptr: *mut u8,
    len: usize,
    drops: Arc<AtomicUsize>,
}

// SAFETY (test): `ptr` points into `buf`'s vector, which is never resized and lives as
// long as the `Arc` this struct holds.
unsafe impl Send for Lent {}
// SAFETY (test): as above.
unsafe impl Sync for Lent {}

impl ForeignMemory for Lent {
    fn bytes(&self) -> &[u8] {
        // SAFETY (test): see the `Send` impl.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY (test): see the `Send` impl.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

/// An f32 array over a buffer holding `values`, `at` bytes into it.
fn lent(values: &[f32], at: usize, drops: &Arc<AtomicUsize>) -> (Arc<std::sync::Mutex<Vec<u8>>>, Box<Lent>) {
    let mut bytes = vec![0u8; at + values.len() * 4 + 64];
    // A start 64-byte aligned (then `at` past it).
    let base = bytes.as_ptr().align_offset(64);
    for (i, v) in values.iter().enumerate() {
        bytes[base + at + 4 * i..base + at + 4 * i + 4].copy_from_slice(&v.to_ne_bytes());
    }
    let buf = Arc::new(std::sync::Mutex::new(bytes));
    let ptr = unsafe { buf.lock().unwrap().as_mut_ptr().add(base + at) };
    let mem = Lent { _buf: Arc::clone(&buf), ptr, len: values.len() * 4, drops: Arc::clone(drops) };
    (buf, Box::new(mem))
}

fn floats(buf: &std::sync::Mutex<Vec<u8>>, n: usize) -> Vec<f32> {
    let b = buf.lock().unwrap();
    let base = b.as_ptr().align_offset(64);
    (0..n).map(|i| f32::from_ne_bytes(b[base + 4 * i..base + 4 * i + 4].try_into().unwrap())).collect()
}

#[test]
fn foreign_arrays_are_pushed_and_pulled_in_place() {
    let drops = Arc::new(AtomicUsize::new(0));
    let kv = KVStore::create("local").unwrap();
    kv.init("w", &NDArray::zeros(&[4]).unwrap()).unwrap();
    let (_, mem) = lent(&[1.0, 2.0, 3.0, 4.0], 0, &drops);
    let value = NDArray::from_foreign(&[4], DType::F32, mem, false).unwrap();
    kv.push("w", &[value.clone(), value.clone()][..], 0).unwrap();
    let (out_buf, mem) = lent(&[0.0; 4], 0, &drops);
    let out = NDArray::from_foreign(&[4], DType::F32, mem, true).unwrap();
    kv.pull("w", &out, 0).unwrap();
    assert_eq!(floats(&out_buf, 4), vec![2.0, 4.0, 6.0, 8.0], "the pull wrote the owner's memory");
    drop((value, out));
    assert_eq!(drops.load(Ordering::SeqCst), 2, "each owner's memory given back once");
}

#[test]
fn a_read_only_foreign_array_is_pushed_but_never_written() {
    let drops = Arc::new(AtomicUsize::new(0));
    let kv = KVStore::create("local").unwrap();
    kv.init("w", &NDArray::full(&[2], 7.0).unwrap()).unwrap();
    let (buf, mem) = lent(&[5.0, 5.0], 0, &drops);
    let ro = NDArray::from_foreign(&[2], DType::F32, mem, false).unwrap();
    assert!(ro.is_read_only());
    let e = kv.pull("w", &ro, 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("read-only"), "{e}");
    assert_eq!(floats(&buf, 2), vec![5.0, 5.0], "nothing written");
    assert_eq!(ro.add_assign(1.0).unwrap_err().kind(), ErrorKind::InvalidArgument);
    let e = kv.pushpull_in_place("w", &ro, 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert_eq!(kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap(), vec![7.0, 7.0], "the store kept its value");
    kv.push("w", &ro, 0).unwrap();
    assert_eq!(kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap(), vec![5.0, 5.0]);
}

#[test]
fn foreign_memory_of_the_wrong_size_or_alignment_is_refused() {
    let drops = Arc::new(AtomicUsize::new(0));
    let (_, mem) = lent(&[1.0, 2.0], 0, &drops);
    let e = NDArray::from_foreign(&[3], DType::F32, mem, true).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    let (_, mem) = lent(&[1.0, 2.0], 2, &drops);
    let e = NDArray::from_foreign(&[2], DType::F32, mem, true).unwrap_err();
    assert!(e.to_string().contains("aligned"), "{e}");
    // Aligned for its dtype is enough: 4 bytes past a 64-byte boundary.
    let (_, mem) = lent(&[1.0, 2.0], 4, &drops);
    let a = NDArray::from_foreign(&[2], DType::F32, mem, true).unwrap();
    assert_eq!(a.to_vec::<f32>().unwrap().len(), 2);
}

#[test]
fn a_write_to_a_foreign_value_lent_to_a_queued_push_copies_it_first() {
    let drops = Arc::new(AtomicUsize::new(0));
    let kv = KVStore::create("local").unwrap();
    kv.init("w", &NDArray::zeros(&[3]).unwrap()).unwrap();
    let (_, mem) = lent(&[1.0; 3], 0, &drops);
    let g = NDArray::from_foreign(&[3], DType::F32, mem, true).unwrap();
    let pushed = kv.push_async("w", &g, 0);
    g.add_assign(10.0).unwrap();
    pushed.wait().unwrap();
    assert_eq!(kv.pull_new("w", 0).unwrap().to_vec::<f32>().unwrap(), vec![1.0; 3], "the push summed the 1s");
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![11.0; 3]);
}

/// An empty array over foreign memory (a zero-length numpy array or direct buffer,
/// whose pointer need not be aligned for the dtype) reads and writes as empty.
#[test]
fn an_empty_foreign_array_at_any_address_reads_as_empty() {
    let drops = Arc::new(AtomicUsize::new(0));
    for at in [0, 1, 2, 3] {
        let (_, mem) = lent(&[], at, &drops);
        let a = NDArray::from_foreign(&[0, 3], DType::F32, mem, true).unwrap();
        assert_eq!(a.to_vec::<f32>().unwrap(), Vec::<f32>::new(), "at {at}");
        a.add_assign(1.0).unwrap();
        let kv = KVStore::create("local").unwrap();
        kv.init("e", &a).unwrap();
        kv.push("e", &a, 0).unwrap();
        kv.pull("e", &a, 0).unwrap();
    }
}

/// `n` f32 arrays of `len` over the same bytes of one buffer (as a binding wraps the same
/// memory once per time it is given: numpy views, one torch tensor given n times), and
/// the buffer.
fn views(len: usize, n: usize) -> (Arc<std::sync::Mutex<Vec<u8>>>, Vec<NDArray>) {
    let drops = Arc::new(AtomicUsize::new(0));
    let (buf, first) = lent(&vec![0.0; len], 0, &drops);
    let ptr = first.ptr;
    let mut arrays = vec![NDArray::from_foreign(&[len], DType::F32, first, true).unwrap()];
    for _ in 1..n {
        let mem = Box::new(Lent { _buf: Arc::clone(&buf), ptr, len: len * 4, drops: Arc::clone(&drops) });
        arrays.push(NDArray::from_foreign(&[len], DType::F32, mem, true).unwrap());
    }
    (buf, arrays)
}

const KEYS: usize = 256;
const LEN: usize = 256;

/// A store (`kind`) with keys 0..256 holding `k` each, and the keys.
fn counting_store(kind: &str) -> (KVStore, Vec<String>) {
    let kv = KVStore::create(kind).unwrap();
    let keys: Vec<String> = (0..KEYS).map(|k| k.to_string()).collect();
    let values: Vec<NDArray> = (0..KEYS).map(|k| NDArray::full(&[LEN], k as f64).unwrap()).collect();
    kv.init(keys.as_slice(), values.as_slice()).unwrap();
    (kv, keys)
}

/// A pull of many keys into outs over the same memory, each wrapped on its own, writes
/// them in key order, as when one array is given for every key: the last key's value.
/// Spread over threads, each key was written whenever its thread got to it.
#[test]
fn a_pull_into_outs_over_the_same_memory_writes_them_in_key_order() {
    for kind in ["local", "device"] {
        let (kv, keys) = counting_store(kind);
        let one = NDArray::zeros(&[LEN]).unwrap();
        kv.pull(keys.as_slice(), vec![one.clone(); KEYS].as_slice(), 0).unwrap();
        let expected = one.to_vec::<f32>().unwrap();
        assert_eq!(expected, vec![(KEYS - 1) as f32; LEN], "{kind}: one array for every key");
        for round in 0..20 {
            let (buf, outs) = views(LEN, KEYS);
            kv.pull(keys.as_slice(), outs.as_slice(), 0).unwrap();
            assert_eq!(floats(&buf, LEN), expected, "{kind}: round {round}: outs over one buffer");
            let (buf, outs) = views(LEN, KEYS);
            kv.pull_async(keys.as_slice(), outs.as_slice(), 0).wait().unwrap();
            assert_eq!(floats(&buf, LEN), expected, "{kind}: round {round}: non-blocking");
        }
    }
}

/// A pushpull whose outs are other arrays over the memory of other keys' values gives
/// what it gives when they are those values' own handles: every sum reads its value
/// before any out is written.
#[test]
fn a_pushpull_whose_outs_are_views_of_other_keys_values_reads_every_value_first() {
    let value = |k: usize| (1000 + k) as f32;
    let (kv, keys) = counting_store("local");
    // The same arrays as handles: the ordinary result.
    let vals: Vec<NDArray> = (0..KEYS).map(|k| NDArray::full(&[LEN], value(k) as f64).unwrap()).collect();
    let outs: Vec<NDArray> = (0..KEYS).map(|k| vals[(k + KEYS / 2) % KEYS].clone()).collect();
    kv.pushpull(keys.as_slice(), vals.as_slice(), outs.as_slice(), 0).unwrap();
    let expected: Vec<f32> = vals.iter().map(|v| v.to_vec::<f32>().unwrap()[0]).collect();
    assert_eq!(expected, (0..KEYS).map(|k| value((k + KEYS / 2) % KEYS)).collect::<Vec<_>>());
    for round in 0..20 {
        // Each value over a buffer of its own, and each out another array over the
        // buffer of the value half the list away.
        let drops = Arc::new(AtomicUsize::new(0));
        let mut bufs = Vec::new();
        let mut vals = Vec::new();
        let mut ptrs = Vec::new();
        for k in 0..KEYS {
            let (buf, mem) = lent(&vec![value(k); LEN], 0, &drops);
            ptrs.push(mem.ptr);
            vals.push(NDArray::from_foreign(&[LEN], DType::F32, mem, true).unwrap());
            bufs.push(buf);
        }
        let outs: Vec<NDArray> = (0..KEYS)
            .map(|k| {
                let j = (k + KEYS / 2) % KEYS;
                let mem = Lent { _buf: Arc::clone(&bufs[j]), ptr: ptrs[j], len: LEN * 4, drops: Arc::clone(&drops) };
                NDArray::from_foreign(&[LEN], DType::F32, Box::new(mem), true).unwrap()
            })
            .collect();
        kv.pushpull(keys.as_slice(), vals.as_slice(), outs.as_slice(), 0).unwrap();
        let got: Vec<f32> = bufs.iter().map(|b| floats(b, 1)[0]).collect();
        assert_eq!(got, expected, "round {round}");
    }
}

#[test]
fn arrays_over_overlapping_memory_share_it() {
    let (_buf, arrays) = views(8, 2);
    assert!(arrays[0].shares_memory(&arrays[1]) && arrays[0].same_storage(&arrays[1]));
    let drops = Arc::new(AtomicUsize::new(0));
    let (buf, mem) = lent(&[0.0; 8], 0, &drops);
    let ptr = mem.ptr;
    let whole = NDArray::from_foreign(&[8], DType::F32, mem, true).unwrap();
    // The second half of the same bytes, and a buffer of its own.
    let half = Lent { _buf: Arc::clone(&buf), ptr: ptr.wrapping_add(16), len: 16, drops: Arc::clone(&drops) };
    let half = NDArray::from_foreign(&[4], DType::F32, Box::new(half), true).unwrap();
    assert!(whole.shares_memory(&half) && half.shares_memory(&whole));
    let other = NDArray::zeros(&[8]).unwrap();
    assert!(!whole.shares_memory(&other) && other.shares_memory(&other.clone()));
}

/// A wrapper of `buf`'s bytes from `first` (as `views` makes them): `len` f32 from
/// `at` bytes in, writable or not.
fn wrapper(
    buf: &Arc<std::sync::Mutex<Vec<u8>>>,
    ptr: *mut u8,
    at: usize,
    len: usize,
    writable: bool,
) -> (NDArray, Arc<AtomicUsize>) {
    let drops = Arc::new(AtomicUsize::new(0));
    let mem = Lent { _buf: Arc::clone(buf), ptr: ptr.wrapping_add(at), len: len * 4, drops: Arc::clone(&drops) };
    (NDArray::from_foreign(&[len], DType::F32, Box::new(mem), writable).unwrap(), drops)
}

/// Wrappers of the same bytes seen the same way are one array while one lives (the
/// later ones' memory objects kept by their handles); in another shape, dtype or
/// writability, or of other bytes, they are arrays of their own.
#[test]
fn wrappers_of_the_same_memory_are_one_array_while_one_lives() {
    let drops = Arc::new(AtomicUsize::new(0));
    let (buf, mem) = lent(&[0.0; 8], 0, &drops);
    let ptr = mem.ptr;
    let first = NDArray::from_foreign(&[8], DType::F32, mem, true).unwrap();
    let (again, again_drops) = wrapper(&buf, ptr, 0, 8, true);
    assert!(again.same_storage(&first));
    assert_eq!(again_drops.load(Ordering::SeqCst), 0, "the second wrapper's handle keeps its memory object");
    let (read_only, _) = wrapper(&buf, ptr, 0, 8, false);
    let (half, _) = wrapper(&buf, ptr, 0, 4, true);
    let mem = Lent { _buf: Arc::clone(&buf), ptr, len: 32, drops: Arc::clone(&drops) };
    let as_bytes = NDArray::from_foreign(&[32], DType::U8, Box::new(mem), true).unwrap();
    for other in [&read_only, &half, &as_bytes] {
        assert!(!other.same_storage(&first) && other.shares_memory(&first));
    }
    drop(again);
    assert_eq!(again_drops.load(Ordering::SeqCst), 1, "it goes with the handle");
    drop(first);
    assert_eq!(drops.load(Ordering::SeqCst), 1, "the first memory object goes with the array");
    let (anew, anew_drops) = wrapper(&buf, ptr, 0, 8, true);
    assert_eq!(anew_drops.load(Ordering::SeqCst), 0, "none lives: a new array");
    assert!(!anew.same_storage(&read_only));
}

/// A handle kept alive by an owner keeps it while a clone of it lives, a call's too;
/// a handle to the same array got from another wrapper keeps that wrapper's memory
/// object instead.
#[test]
fn a_handle_keeps_its_owner_while_it_or_a_call_holds_it() {
    let drops = Arc::new(AtomicUsize::new(0));
    let (buf, mem) = lent(&[0.0; 4], 0, &drops);
    let ptr = mem.ptr;
    let owner = Arc::new(());
    let gone = Arc::downgrade(&owner);
    let a = NDArray::from_foreign(&[4], DType::F32, mem, true).unwrap().kept_alive_by(Box::new(owner));
    let (twin, twin_drops) = wrapper(&buf, ptr, 0, 4, true);
    assert!(twin.same_storage(&a));
    assert_eq!(twin_drops.load(Ordering::SeqCst), 0, "the twin handle keeps its memory object");
    drop(twin);
    assert_eq!(twin_drops.load(Ordering::SeqCst), 1, "and lets it go with its last clone");
    let kv = two_keys(4);
    kv.set_updater(|_: &Key, _, merged: &NDArray, stored: &NDArray| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        stored.copy_from(merged)
    })
    .unwrap();
    let pushed = kv.push_async("a", &NDArray::full(&[4], 3.0).unwrap(), 0);
    let pulled = kv.pull_async("a", &a, 0);
    drop(a);
    assert!(gone.upgrade().is_some(), "the queued pull holds the handle");
    pulled.wait().unwrap();
    pushed.wait().unwrap();
    kv.wait_all().unwrap();
    assert!(gone.upgrade().is_none(), "the owner goes with the call's handle");
    assert_eq!(floats(&buf, 4), vec![3.0; 4]);
}

/// A local store whose updater sleeps (so that calls queue behind a push), with "a"
/// holding 7, "b" holding 5 and "c" zeros, of `n` elements.
fn two_keys(n: usize) -> KVStore {
    let kv = KVStore::create("local").unwrap();
    kv.set_updater(|_: &Key, _, merged: &NDArray, stored: &NDArray| {
        std::thread::sleep(std::time::Duration::from_millis(2));
        stored.copy_from(merged)
    })
    .unwrap();
    kv.init("a", &NDArray::full(&[n], 7.0).unwrap()).unwrap();
    kv.init("b", &NDArray::full(&[n], 5.0).unwrap()).unwrap();
    kv.init("c", &NDArray::zeros(&[n]).unwrap()).unwrap();
    kv
}

/// Calls on one memory through different wrappers take effect in call order: a
/// blocking pull after a non-blocking pull into the same bytes (another wrapper) ends
/// with its own value, and a push after such a pull pushes what the pull wrote. Each
/// wrapper is made just before its call, as a binding does.
#[test]
fn calls_through_different_wrappers_of_one_memory_take_effect_in_call_order() {
    const N: usize = 1 << 14;
    let kv = two_keys(N);
    for round in 0..20 {
        let drops = Arc::new(AtomicUsize::new(0));
        let (buf, mem) = lent(&[0.0; N], 0, &drops);
        let ptr = mem.ptr;
        let pushed = kv.push_async("a", &NDArray::full(&[N], 7.0).unwrap(), 0);
        let pending = kv.pull_async("a", &NDArray::from_foreign(&[N], DType::F32, mem, true).unwrap(), 0);
        kv.pull("b", &wrapper(&buf, ptr, 0, N, true).0, 0).unwrap();
        pending.wait().unwrap();
        pushed.wait().unwrap();
        assert_eq!(floats(&buf, N), vec![5.0; N], "round {round}: the later, blocking pull's value");
        let pushed = kv.push_async("a", &NDArray::full(&[N], 7.0).unwrap(), 0);
        let pending = kv.pull_async("a", &wrapper(&buf, ptr, 0, N, true).0, 0);
        kv.push("c", &wrapper(&buf, ptr, 0, N, true).0, 0).unwrap();
        pending.wait().unwrap();
        pushed.wait().unwrap();
        let b = NDArray::zeros(&[N]).unwrap();
        kv.pull("c", &b, 0).unwrap();
        assert_eq!(b.to_vec::<f32>().unwrap(), vec![7.0; N], "round {round}: the push read what the pull wrote");
    }
}

/// Two threads pulling different values into one memory through wrappers of their own
/// never leave it torn: a third thread reading through its own wrapper sees one value
/// whole.
#[test]
fn threads_pulling_into_one_memory_through_their_own_wrappers_do_not_tear_it() {
    const N: usize = 1 << 16;
    let kv = KVStore::create("local").unwrap();
    kv.init("a", &NDArray::full(&[N], 7.0).unwrap()).unwrap();
    kv.init("b", &NDArray::full(&[N], 5.0).unwrap()).unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    let (buf, mem) = lent(&[7.0; N], 0, &drops);
    let ptr = mem.ptr as usize;
    // Kept for the test's length, as the bindings' callers hold their arrays.
    let held = NDArray::from_foreign(&[N], DType::F32, mem, true).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let torn = std::thread::scope(|s| {
        for key in ["a", "b"] {
            let (kv, buf, stop) = (&kv, &buf, &stop);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    kv.pull(key, &wrapper(buf, ptr as *mut u8, 0, N, true).0, 0).unwrap();
                }
            });
        }
        let mut torn = 0;
        for _ in 0..1000 {
            let seen = wrapper(&buf, ptr as *mut u8, 0, N, true).0.to_vec::<f32>().unwrap();
            torn += usize::from(seen.iter().any(|v| *v != seen[0]));
        }
        stop.store(true, Ordering::Relaxed);
        torn
    });
    drop(held);
    assert_eq!(torn, 0, "reads that saw a mix of the two values");
}
