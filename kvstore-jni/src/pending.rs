//! Non-blocking calls from Java: `AsyncKVStore.push` and its siblings submit through
//! `nSubmit` with an id that Java chose for the call's `CompletableFuture`; when the call
//! finishes, its id waits here until a Java completer thread takes it (`nTakeDone`,
//! the id negated for a call that failed; then `nResult` throws the failed call's
//! `KVStoreException`) and completes the future.
//!
//! No Java method is called from the store's engine threads for this: the result is
//! handed over in Rust, and the future's dependents run on the completer's threads (or
//! in `waitAll`), never on a thread that runs the store's calls.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::LazyLock;
use std::time::Duration;

use jni::EnvUnowned;
use jni::objects::{JClass, JLongArray, JObjectArray, JString};
use jni::sys::{jint, jlong};
use kvstore::{Error, KVStore, Keys, Pending, Release, Values};
use parking_lot::{Condvar, Mutex};

use crate::convert::{arrays, keys, string};
use crate::error::{JResult, ThrowKvStore};
use crate::handles::STORES;

/// A failed call's error (with the Java exception an updater threw for it inside, the
/// cause of its `BACKEND` error: [`Error::Raised`]).
type Failed = Error;

#[derive(Default)]
struct Done {
    /// Ids of finished calls, in the order they finished; negated for calls that failed.
    ids: VecDeque<i64>,
    /// The errors of the calls that failed, by id.
    failed: HashMap<i64, Failed>,
}

static DONE: LazyLock<(Mutex<Done>, Condvar)> = LazyLock::new(Default::default);

/// What releases each unfinished call that a batch of fused calls holds back (see
/// `kvstore::Release`), by id: a Java future's `get`, `join` and `isDone` release
/// it first (`nRelease`). Calls that no batch holds are not here.
static RELEASE: LazyLock<Mutex<HashMap<i64, Release>>> = LazyLock::new(Default::default);

thread_local! {
    /// The handles of the calls this thread submitted, kept until their calls are done
    /// and then dropped here, at a later submit: a call's memory (the call, its lists,
    /// the callback) is freed on the thread that allocated it, not on the engine's
    /// thread, which would move the allocator's lists between cores at every call.
    static KEPT: RefCell<Kept> = const { RefCell::new(Kept { handles: VecDeque::new(), sweep_at: SWEEP_MIN }) };
}

/// How many kept handles make `Kept::reap` look past the first unfinished one.
const SWEEP_MIN: usize = 64;

struct Kept {
    handles: VecDeque<Pending>,
    /// The length at which `reap` drops the finished handles behind an unfinished one.
    sweep_at: usize,
}

impl Kept {
    /// Drops the handles of finished calls: those in front (calls mostly finish in the
    /// order they were made), and all of them once the list has grown to `sweep_at`
    /// (a call that runs long, or that a batch holds, keeps none of the others).
    fn reap(&mut self) {
        while self.handles.front().is_some_and(Pending::is_finished) {
            self.handles.pop_front();
        }
        if self.handles.len() >= self.sweep_at {
            self.handles.retain(|p| !p.is_finished());
            self.sweep_at = (2 * self.handles.len()).max(SWEEP_MIN);
        }
    }
}

/// Keeps `pending` on this thread's list (see `KEPT`), first dropping the handles of
/// calls that finished. A finished call's handle holds only memory (the engine lets
/// go of the store and the arrays' loans when the call finishes), so dropping it calls
/// nothing that could come back here.
fn keep(pending: Pending) {
    KEPT.with_borrow_mut(|k| {
        k.reap();
        k.handles.push_back(pending);
    });
}

/// Hands `pending`'s result, when it comes, to the completer under `id`.
fn track(id: i64, pending: Pending) {
    let held = pending.releaser().map(|r| RELEASE.lock().insert(id, r)).is_some();
    pending.on_done(move |result| {
        if held {
            RELEASE.lock().remove(&id);
        }
        let mut done = DONE.0.lock();
        match result {
            Ok(()) => done.ids.push_back(id),
            Err(e) => {
                done.failed.insert(id, e);
                done.ids.push_back(-id);
            }
        }
        drop(done);
        DONE.1.notify_one();
    });
    keep(pending);
}

/// The calls `nSubmit` makes, numbered as `KVStore.java`'s `OP_` constants.
fn submit(
    kv: &KVStore,
    op: jint,
    ks: Vec<kvstore::Key>,
    vs: Values<'_>,
    out_ks: Vec<kvstore::Key>,
    outs: Values<'_>,
    priority: i32,
) -> kvstore::Result<Pending> {
    Ok(match op {
        0 => kv.push_async(Keys::Many(ks), vs, priority),
        1 => kv.pull_async(Keys::Many(out_ks), outs, priority),
        2 => kv.pushpull_pairs_async(&ks, vs, &out_ks, outs, priority),
        3 => kv.broadcast_pairs_async(&ks, vs, &out_ks, outs, priority),
        _ => return Err(Error::Internal(format!("nSubmit: no call numbered {op}"))),
    })
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nSubmit<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    id: jlong,
    op: jint,
    ks: JObjectArray<'l, JString<'l>>,
    vs: JLongArray<'l>,
    out_ks: JObjectArray<'l, JString<'l>>,
    outs: JLongArray<'l>,
    priority: jint,
) {
    env.with_env(|env| -> JResult<()> {
        let (ks, vs) = (keys(env, &ks, "a key")?, arrays(env, &vs)?);
        let (out_ks, outs) = (keys(env, &out_ks, "an out key")?, arrays(env, &outs)?);
        let kv = STORES.get(h)?;
        track(id, submit(&kv, op, ks, (&vs).into(), out_ks, (&outs).into(), priority)?);
        Ok(())
    })
    .resolve::<ThrowKvStore>()
}

/// The one-key calls, `OP_PUSH_KEY` (4: `hs` are the values' handles) and `OP_PULL_KEY` (5:
/// the outs): one string and one array from Java, the fewest JNI calls for the most
/// frequent calls.
#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nSubmitKey<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    id: jlong,
    op: jint,
    key: JString<'l>,
    hs: JLongArray<'l>,
    priority: jint,
) {
    env.with_env(|env| -> JResult<()> {
        let (key, arrays) = (string(env, &key, "the key")?, arrays(env, &hs)?);
        let kv = STORES.get(h)?;
        let pending = match op {
            4 => kv.push_async(key, &arrays, priority),
            5 => kv.pull_async(key, &arrays, priority),
            _ => return Err(Error::Internal(format!("nSubmitKey: no one-key call numbered {op}")).into()),
        };
        track(id, pending);
        Ok(())
    })
    .resolve::<ThrowKvStore>()
}

/// Releases call `id` if a batch of fused calls holds it back (a Java thread is about to
/// wait for its future); nothing for a call that finished or that no batch holds.
#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nRelease<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    id: jlong,
) {
    env.with_env(|_| -> JResult<()> {
        let release = RELEASE.lock().get(&id).cloned();
        if let Some(r) = release {
            r.release();
        }
        Ok(())
    })
    .resolve::<ThrowKvStore>()
}

/// Waits up to `timeout_ms` for finished calls and writes their ids into `ids` (negated
/// for calls that failed: `nResult` throws their errors); returns how many it wrote (0
/// when none finished in time). With an empty `ids` it only waits.
#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nTakeDone<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    ids: JLongArray<'l>,
    timeout_ms: jint,
) -> jint {
    env.with_env(|env| -> JResult<jint> {
        let room = ids.len(env)?;
        let mut done = DONE.0.lock();
        // Only a take that waits (the completer's taker's) sleeps on the condition
        // variable: a take with no time to wait (`waitAll`'s) could otherwise be handed
        // the wake-up meant for the taker in the instant before its own timeout removes it.
        if done.ids.is_empty() && timeout_ms > 0 {
            let _ = DONE.1.wait_for(&mut done, Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0)));
        }
        let n = room.min(done.ids.len());
        let taken: Vec<i64> = done.ids.drain(..n).collect();
        drop(done);
        ids.set_region(env, 0, &taken)?;
        Ok(n as jint)
    })
    .resolve::<ThrowKvStore>()
}

/// Throws the `KVStoreException` of call `id`, which `nTakeDone` gave as failed (with
/// the updater's exception as the cause of a `BACKEND` error). Each id once.
#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nResult<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    id: jlong,
) {
    env.with_env(|_| -> JResult<()> {
        let failed = DONE.0.lock().failed.remove(&id);
        let Some(error) = failed else {
            return Err(Error::Internal(format!("no failed call numbered {id}")).into());
        };
        Err(error.into())
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nWaitAll<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
) {
    env.with_env(|_| -> JResult<()> {
        let kv = STORES.get(h)?;
        Ok(kv.wait_all()?)
    })
    .resolve::<ThrowKvStore>()
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use kvstore::NDArray;

    use super::*;

    #[test]
    fn kept_handles_of_finished_calls_go_at_the_next_reap_even_behind_a_running_one() {
        let init = |kv: &KVStore, key: &str| kv.init(key, &NDArray::zeros(&[4]).unwrap()).unwrap();
        let one = NDArray::ones(&[4]).unwrap();
        // A store whose calls on "slow" wait until the test lets them go.
        let blocked = KVStore::create("local").unwrap();
        init(&blocked, "slow");
        let (go, gate) = mpsc::channel::<()>();
        let gate = Mutex::new(gate);
        blocked
            .set_updater(move |_: &kvstore::Key, _, merged: &NDArray, stored: &NDArray| {
                let _ = gate.lock().recv_timeout(Duration::from_secs(10));
                stored.copy_from(merged)
            })
            .unwrap();
        let kv = KVStore::create("local").unwrap();
        let keys: Vec<String> = (0..SWEEP_MIN).map(|i| format!("k{i}")).collect();
        keys.iter().for_each(|k| init(&kv, k));
        let mut kept = Kept { handles: VecDeque::new(), sweep_at: SWEEP_MIN };

        // Finished calls in front go at once.
        kept.handles.push_back(kv.push_async("k0", &one, 0));
        kv.wait_all().unwrap();
        kept.reap();
        assert!(kept.handles.is_empty());

        // Behind a running call, finished ones stay while the list is short...
        kept.handles.push_back(blocked.push_async("slow", &one, 0));
        for k in &keys[..8] {
            kept.handles.push_back(kv.push_async(k.as_str(), &one, 0));
        }
        kv.wait_all().unwrap();
        kept.reap();
        assert_eq!(kept.handles.len(), 9);
        assert!(!kept.handles[0].is_finished());

        // ...and go once it is long: only the running call's handle is left.
        for k in &keys {
            kept.handles.push_back(kv.push_async(k.as_str(), &one, 0));
        }
        kv.wait_all().unwrap();
        kept.reap();
        assert_eq!(kept.handles.len(), 1, "finished handles were kept behind a running call");
        assert!(!kept.handles[0].is_finished(), "the running call's handle went");
        assert_eq!(kept.sweep_at, SWEEP_MIN);

        go.send(()).unwrap();
        blocked.wait_all().unwrap();
        kept.reap();
        assert!(kept.handles.is_empty());
        assert_eq!(blocked.pull_new("slow", 0).unwrap().to_vec::<f32>().unwrap(), vec![1.0; 4]);
    }
}
