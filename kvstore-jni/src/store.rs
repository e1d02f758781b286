//! Natives of `io.github.kvstore.KVStore`: thin shims over [`kvstore::KVStore`].

use std::sync::Arc;

use jni::objects::{JByteArray, JClass, JLongArray, JObject, JObjectArray, JString};
use jni::sys::{jboolean, jint, jlong};
use jni::{Env, EnvUnowned};
use kvstore::{KVStore, Keys, Values};

use crate::convert::{arrays, keys, string};
use crate::error::{JResult, ThrowKvStore};
use crate::handles::{ARRAYS, STORES};
use crate::optimizer::optimizer_from_json;
use crate::updater::JavaUpdater;

/// Runs `f` with the store of handle `h`.
fn with_store<T>(h: jlong, f: impl FnOnce(&KVStore) -> kvstore::Result<T>) -> JResult<T> {
    let kv = STORES.get(h)?;
    Ok(f(&kv)?)
}

/// What a JVM user of the default jar is told to use for `dist_*` kinds.
const WITHOUT_MPI: &str = "this is the kvstore jar, built without MPI: use the kvstore-mpi jar \
     (`make jar FEATURES=mpi` writes target/kvstore-mpi.jar; `make install FEATURES=mpi` installs \
     io.github.kvstore/kvstore-mpi)";

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nCreate<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    kind: JString<'l>,
) -> jlong {
    env.with_env(|env| -> JResult<jlong> {
        let kv = kvstore::create_or_say(&string(env, &kind, "the store kind")?, WITHOUT_MPI)?;
        Ok(STORES.insert(Arc::new(kv)))
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nVersion<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
) -> JString<'l> {
    env.with_env(|env| -> JResult<JString<'l>> { Ok(env.new_string(kvstore::VERSION)?) }).resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nMpiSupported<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
) -> jboolean {
    env.with_env(|_| -> JResult<jboolean> { Ok(kvstore::HAS_MPI) }).resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nFinalizeMpi<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>) {
    env.with_env(|_| -> JResult<()> { Ok(kvstore::finalize()?) }).resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nFree<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
) {
    env.with_env(|_| -> JResult<()> {
        STORES.remove(h);
        Ok(())
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nType<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
) -> JString<'l> {
    env.with_env(|env| -> JResult<JString<'l>> {
        let kind = with_store(h, |kv| Ok(kv.kind().to_string()))?;
        Ok(env.new_string(kind)?)
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nRank<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
) -> jint {
    env.with_env(|_| -> JResult<jint> { with_store(h, |kv| Ok(kv.rank() as jint)) }).resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nNumWorkers<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
) -> jint {
    env.with_env(|_| -> JResult<jint> { with_store(h, |kv| Ok(kv.num_workers() as jint)) }).resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nInit<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    ks: JObjectArray<'l, JString<'l>>,
    vs: JLongArray<'l>,
) {
    env.with_env(|env| -> JResult<()> {
        let (ks, vs) = (keys(env, &ks, "a key")?, arrays(env, &vs)?);
        with_store(h, |kv| kv.init(Keys::Many(ks), &vs))
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nPush<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    ks: JObjectArray<'l, JString<'l>>,
    vs: JLongArray<'l>,
    priority: jint,
) {
    env.with_env(|env| -> JResult<()> {
        let (ks, vs) = (keys(env, &ks, "a key")?, arrays(env, &vs)?);
        with_store(h, |kv| kv.push(Keys::Many(ks), &vs, priority))
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nPull<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    ks: JObjectArray<'l, JString<'l>>,
    outs: JLongArray<'l>,
    priority: jint,
) {
    env.with_env(|env| -> JResult<()> {
        let (ks, outs) = (keys(env, &ks, "a key")?, arrays(env, &outs)?);
        with_store(h, |kv| kv.pull(Keys::Many(ks), &outs, priority))
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nPushKey<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    key: JString<'l>,
    vs: JLongArray<'l>,
    priority: jint,
) {
    env.with_env(|env| -> JResult<()> {
        let (key, vs) = (string(env, &key, "the key")?, arrays(env, &vs)?);
        with_store(h, |kv| kv.push(key, &vs, priority))
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nPullKey<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    key: JString<'l>,
    outs: JLongArray<'l>,
    priority: jint,
) {
    env.with_env(|env| -> JResult<()> {
        let (key, outs) = (string(env, &key, "the key")?, arrays(env, &outs)?);
        with_store(h, |kv| kv.pull(key, &outs, priority))
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nPullNew<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    key: JString<'l>,
    priority: jint,
) -> jlong {
    env.with_env(|env| -> JResult<jlong> {
        let key = string(env, &key, "the key")?;
        let out = with_store(h, |kv| kv.pull_new(key, priority))?;
        Ok(ARRAYS.insert(out))
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nKeys<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
) -> JObjectArray<'l, JString<'l>> {
    env.with_env(|env| -> JResult<JObjectArray<'l, JString<'l>>> {
        let keys = with_store(h, |kv| Ok(kv.keys()))?;
        let empty = JString::from_str(env, "")?;
        let out = JObjectArray::<JString>::new(env, keys.len(), &empty)?;
        for (i, key) in keys.iter().enumerate() {
            let s = JString::from_str(env, key.as_str())?;
            out.set_element(env, i, &s)?;
            // One local reference per key: a store of many keys must not fill the frame.
            env.delete_local_ref(s);
        }
        Ok(out)
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nNumKeys<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
) -> jint {
    env.with_env(|_| -> JResult<jint> { with_store(h, |kv| Ok(jint::try_from(kv.keys().len()).unwrap_or(jint::MAX))) })
        .resolve::<ThrowKvStore>()
}

/// The flat arguments of `nPushPull` and `nBroadcast`.
type PairsOp = fn(&KVStore, &[kvstore::Key], Values<'_>, &[kvstore::Key], Values<'_>, i32) -> kvstore::Result<()>;

#[allow(clippy::too_many_arguments)]
fn pairs_call(
    env: &mut Env<'_>,
    h: jlong,
    ks: &JObjectArray<'_, JString<'_>>,
    vs: &JLongArray<'_>,
    out_ks: &JObjectArray<'_, JString<'_>>,
    outs: &JLongArray<'_>,
    priority: jint,
    op: PairsOp,
) -> JResult<()> {
    let (ks, vs) = (keys(env, ks, "a key")?, arrays(env, vs)?);
    let (out_ks, outs) = (keys(env, out_ks, "an out key")?, arrays(env, outs)?);
    with_store(h, |kv| op(kv, &ks, (&vs).into(), &out_ks, (&outs).into(), priority))
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nPushPull<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    ks: JObjectArray<'l, JString<'l>>,
    vs: JLongArray<'l>,
    out_ks: JObjectArray<'l, JString<'l>>,
    outs: JLongArray<'l>,
    priority: jint,
) {
    env.with_env(|env| {
        pairs_call(env, h, &ks, &vs, &out_ks, &outs, priority, |kv, ks, vs, oks, os, p| {
            kv.pushpull_pairs(ks, vs, oks, os, p)
        })
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nBroadcast<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    ks: JObjectArray<'l, JString<'l>>,
    vs: JLongArray<'l>,
    out_ks: JObjectArray<'l, JString<'l>>,
    outs: JLongArray<'l>,
    priority: jint,
) {
    env.with_env(|env| {
        pairs_call(env, h, &ks, &vs, &out_ks, &outs, priority, |kv, ks, vs, oks, os, p| {
            kv.broadcast_pairs(ks, vs, oks, os, p)
        })
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nSetUpdater<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    updater: JObject<'l>,
) {
    env.with_env(|env| -> JResult<()> {
        let kv = STORES.get(h)?;
        // Both wait for the pushes in flight (each holds the updater it started with),
        // and refuse a call from inside an updater of this store.
        if updater.is_null() {
            kv.clear_updater()?;
        } else {
            kv.set_updater(JavaUpdater::new(env, &updater)?)?;
        }
        Ok(())
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nBarrier<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
) {
    env.with_env(|_| -> JResult<()> { with_store(h, KVStore::barrier) }).resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nNumDeadNode<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    node_id: jint,
) -> jint {
    env.with_env(|_| -> JResult<jint> { with_store(h, |kv| Ok(kv.num_dead_node(node_id) as jint)) })
        .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nSetBarrierBeforeExit<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    barrier: jboolean,
) {
    env.with_env(|_| -> JResult<()> {
        with_store(h, |kv| {
            kv.set_barrier_before_exit(barrier);
            Ok(())
        })
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nSendCommandToServers<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    head: jint,
    body: JString<'l>,
) {
    env.with_env(|env| -> JResult<()> {
        let body = string(env, &body, "the command body")?;
        with_store(h, |kv| kv.send_command_to_servers(head, &body))
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nSetGradientCompression<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    kvs: JObjectArray<'l, JString<'l>>,
) {
    env.with_env(|env| -> JResult<()> {
        let flat = keys(env, &kvs, "a gradient-compression parameter")?;
        let pairs: Vec<(&str, &str)> =
            flat.chunks(2).map(|p| (p[0].as_str(), p.get(1).map_or("", |v| v.as_str()))).collect();
        with_store(h, |kv| kv.set_gradient_compression(&pairs))
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nIsCapable<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    capability: JString<'l>,
) -> jboolean {
    env.with_env(|env| -> JResult<jboolean> {
        let capability = string(env, &capability, "the capability")?;
        with_store(h, |kv| kv.is_capable(&capability))
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nSetOptimizer<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    json: JString<'l>,
) {
    env.with_env(|env| -> JResult<()> {
        let optimizer = optimizer_from_json(&string(env, &json, "the optimizer JSON")?)?;
        with_store(h, |kv| kv.set_optimizer(optimizer))
    })
    .resolve::<ThrowKvStore>()
}

/// A store call on a file whose path comes from Java (state files, checkpoints).
fn with_path(
    mut env: EnvUnowned<'_>,
    h: jlong,
    path: &JString<'_>,
    f: impl FnOnce(&KVStore, &str) -> kvstore::Result<()>,
) {
    env.with_env(|env| -> JResult<()> {
        let path = string(env, path, "the path")?;
        with_store(h, |kv| f(kv, &path))
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nSaveOptimizerStates<'l>(
    env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    path: JString<'l>,
) {
    with_path(env, h, &path, |kv, path| kv.save_optimizer_states(path));
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nLoadOptimizerStates<'l>(
    env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    path: JString<'l>,
) {
    with_path(env, h, &path, |kv, path| kv.load_optimizer_states(path));
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nSaveCheckpoint<'l>(
    env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    path: JString<'l>,
) {
    with_path(env, h, &path, |kv, path| kv.save_checkpoint(path));
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nLoadCheckpoint<'l>(
    env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    path: JString<'l>,
) {
    with_path(env, h, &path, |kv, path| kv.load_checkpoint(path));
}

/// `text` as a Java string, or null.
fn or_null<'l>(env: &mut Env<'l>, text: Option<impl AsRef<str>>) -> JResult<JString<'l>> {
    match text {
        Some(t) => Ok(env.new_string(t.as_ref())?),
        None => Ok(JString::null()),
    }
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nOptimizerName<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
) -> JString<'l> {
    env.with_env(|env| -> JResult<JString<'l>> { or_null(env, with_store(h, |kv| Ok(kv.optimizer_name()))?) })
        .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nStartTimeline<'l>(
    env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    path: JString<'l>,
) {
    with_path(env, h, &path, |kv, path| kv.start_timeline(path));
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nStopTimeline<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
) -> JString<'l> {
    env.with_env(|env| -> JResult<JString<'l>> {
        let path = with_store(h, KVStore::stop_timeline)?;
        or_null(env, path.as_ref().map(|p| p.to_string_lossy()))
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nCommit<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    step: jlong,
    extra: JByteArray<'l>,
) {
    env.with_env(|env| -> JResult<()> {
        let step = u64::try_from(step)
            .map_err(|_| kvstore::Error::invalid_argument(format!("commit: step {step} is negative")))?;
        let extra = if extra.is_null() { Vec::new() } else { env.convert_byte_array(&extra)? };
        with_store(h, |kv| kv.commit(step, &extra))
    })
    .resolve::<ThrowKvStore>()
}

/// What the store restored: the step (8 bytes, little-endian), then the extra bytes;
/// null for nothing.
#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nRestored<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
) -> JByteArray<'l> {
    env.with_env(|env| -> JResult<JByteArray<'l>> {
        match with_store(h, |kv| Ok(kv.restored()))? {
            Some(r) => {
                let mut bytes = r.step.to_le_bytes().to_vec();
                bytes.extend_from_slice(&r.extra);
                Ok(env.byte_array_from_slice(&bytes)?)
            }
            None => Ok(JByteArray::null()),
        }
    })
    .resolve::<ThrowKvStore>()
}

/// The JVM's shutdown hook (`KVStore`'s static initialiser): a program of one process
/// closes its timeline's file whole. Nothing to throw to: an error is printed.
#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nCloseTimelineAtExit<'l>(
    _env: EnvUnowned<'l>,
    _c: JClass<'l>,
) {
    if let Err(e) = kvstore::timeline::close_at_exit() {
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!("kvstore: the timeline's file was not closed: {e}\n"),
        );
    }
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nStats<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
) -> JLongArray<'l> {
    env.with_env(|env| -> JResult<JLongArray<'l>> {
        let s = with_store(h, |kv| Ok(kv.stats()))?;
        let long = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let mut out: Vec<i64> =
            [s.bytes_pushed, s.bytes_pulled, s.wire_bytes_sent, s.wire_bytes_received, s.collectives]
                .into_iter()
                .chain([s.held.values, s.held.state, s.held.buffers])
                .map(long)
                .collect();
        // (In the order `Stats.java` reads them: NATIVES.md.)
        for kind in kvstore::Stats::KINDS {
            let c = s.calls.get(kind).copied().unwrap_or_default();
            out.extend([long(c.calls), long(c.keys)]);
        }
        for phase in kvstore::Stats::PHASES {
            let ns = s.phases.get(phase).map_or(0, |d| d.as_nanos());
            out.push(i64::try_from(ns).unwrap_or(i64::MAX));
        }
        out.push(long(s.ranks.len() as u64));
        for r in &s.ranks {
            out.extend([(r.held_up_s * 1e9) as i64, long(r.last), (r.mean_lateness_s * 1e9) as i64]);
        }
        let array = env.new_long_array(out.len())?;
        array.set_region(env, 0, &out)?;
        Ok(array)
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nResetStats<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
) {
    env.with_env(|_| -> JResult<()> {
        with_store(h, |kv| {
            kv.reset_stats();
            Ok(())
        })
    })
    .resolve::<ThrowKvStore>()
}
