//! Non-blocking calls from Java: `KVStore.pushAsync` and its siblings submit through
//! `nSubmit` with an id that Java chose for the call's `CompletableFuture`; when the call
//! finishes, its id and result wait here until the Java completer thread takes them
//! (`nTakeDone`, then `nResult`, which throws the call's `KVStoreException`) and
//! completes the future.
//!
//! No Java method is called from the store's engine threads for this: the result is
//! handed over in Rust, and the future's dependents run on the completer thread, never
//! on a thread that runs the store's calls.

use std::collections::{HashMap, VecDeque};
use std::sync::LazyLock;
use std::time::Duration;

use jni::EnvUnowned;
use jni::objects::{Global, JClass, JLongArray, JObjectArray, JString, JThrowable};
use jni::sys::{jint, jlong};
use kvstore_core::{Error, KVStore, Keys, Pending, Release, Values};
use parking_lot::{Condvar, Mutex};

use crate::convert::{arrays, keys};
use crate::error::{JResult, ThrowKvStore, set_cause, take_cause};
use crate::handles::STORES;

/// A finished call's result, with the Java exception an updater threw for it (the
/// cause of its `BACKEND` error), taken on the thread that ran the updater.
type Finished = (kvstore_core::Result<()>, Option<Global<JThrowable<'static>>>);

#[derive(Default)]
struct Done {
    /// Ids of finished calls, in the order they finished.
    ids: VecDeque<i64>,
    results: HashMap<i64, Finished>,
}

static DONE: LazyLock<(Mutex<Done>, Condvar)> = LazyLock::new(Default::default);

/// What releases each unfinished call that a batch of fused calls holds back (see
/// `kvstore_core::Release`), by id: a Java future's `get`, `join` and `isDone` release
/// it first (`nRelease`). Calls that no batch holds are not here.
static RELEASE: LazyLock<Mutex<HashMap<i64, Release>>> = LazyLock::new(Default::default);

/// Hands `pending`'s result, when it comes, to the completer under `id`.
fn track(id: i64, pending: Pending) {
    let held = pending.releaser().map(|r| RELEASE.lock().insert(id, r)).is_some();
    pending.on_done(move |result| {
        if held {
            RELEASE.lock().remove(&id);
        }
        let cause = if result.is_err() { take_cause() } else { None };
        let mut done = DONE.0.lock();
        done.results.insert(id, (result, cause));
        done.ids.push_back(id);
        drop(done);
        DONE.1.notify_one();
    });
}

/// The calls `nSubmit` makes, numbered as `KVStore.java`'s `OP_` constants.
fn submit(
    kv: &KVStore,
    op: jint,
    ks: Vec<kvstore_core::Key>,
    vs: &[kvstore_core::NDArray],
    out_ks: Vec<kvstore_core::Key>,
    outs: &[kvstore_core::NDArray],
    priority: i32,
) -> kvstore_core::Result<Pending> {
    Ok(match op {
        0 => kv.push_async(Keys::Many(ks), Values::Many(vs), priority),
        1 => kv.pull_async(Keys::Many(out_ks), Values::Many(outs), priority),
        2 => kv.pushpull_pairs_async(&ks, vs, &out_ks, outs, priority),
        3 => kv.broadcast_pairs_async(&ks, vs, &out_ks, outs, priority),
        4 | 5 => {
            let (key, arrays) = if op == 4 { (ks, vs) } else { (out_ks, outs) };
            let [key] = <[kvstore_core::Key; 1]>::try_from(key)
                .map_err(|k| Error::Internal(format!("nSubmit: {} keys for a one-key call", k.len())))?;
            match op {
                4 => kv.push_async(key, Values::Many(arrays), priority),
                _ => kv.pull_async(key, Values::Many(arrays), priority),
            }
        }
        _ => return Err(Error::Internal(format!("nSubmit: no call numbered {op}"))),
    })
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub extern "system" fn Java_io_github_kvstore_KVStore_nSubmit<'l>(
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
        track(id, submit(&kv, op, ks, &vs, out_ks, &outs, priority)?);
        Ok(())
    })
    .resolve::<ThrowKvStore>()
}

/// Releases call `id` if a batch of fused calls holds it back (a Java thread is about to
/// wait for its future); nothing for a call that finished or that no batch holds.
#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_KVStore_nRelease<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>, id: jlong) {
    env.with_env(|_| -> JResult<()> {
        let release = RELEASE.lock().get(&id).cloned();
        if let Some(r) = release {
            r.release();
        }
        Ok(())
    })
    .resolve::<ThrowKvStore>()
}

/// Waits up to `timeout_ms` for finished calls and writes their ids into `ids`; returns
/// how many it wrote (0 when none finished in time). With an empty `ids` it only waits.
#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_KVStore_nTakeDone<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    ids: JLongArray<'l>,
    timeout_ms: jint,
) -> jint {
    env.with_env(|env| -> JResult<jint> {
        let room = ids.len(env)?;
        let mut done = DONE.0.lock();
        if done.ids.is_empty() {
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

/// Returns normally if call `id` succeeded, else throws its `KVStoreException` (with
/// the updater's exception as the cause of a `BACKEND` error). Each id once.
#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_KVStore_nResult<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>, id: jlong) {
    env.with_env(|_| -> JResult<()> {
        let finished = DONE.0.lock().results.remove(&id);
        let Some((result, cause)) = finished else {
            return Err(Error::Internal(format!("no finished call numbered {id}")).into());
        };
        if let Some(cause) = cause {
            set_cause(cause);
        }
        Ok(result?)
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_KVStore_nWaitAll<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>, h: jlong) {
    env.with_env(|_| -> JResult<()> {
        let kv = STORES.get(h)?;
        Ok(kv.wait_all()?)
    })
    .resolve::<ThrowKvStore>()
}
