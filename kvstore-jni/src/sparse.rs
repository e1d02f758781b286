//! Natives of `io.github.kvstore.RowSparse` and the row-sparse calls of
//! `io.github.kvstore.KVStore`: thin shims over [`kvstore::RowSparse`] and the
//! store's `*_row_sparse*` calls.
//!
//! Java describes row-sparse arrays as a `long[]` of handles (their data arrays) and a
//! `long[]` description: for each array, `ndim, shape..., n, indices...` (NATIVES.md).

use jni::objects::{JClass, JLongArray, JObjectArray, JString};
use jni::sys::{jint, jlong};
use jni::{Env, EnvUnowned};
use kvstore::{Error, Key, NDArray, RowSparse, StorageType, Values};

use crate::convert::{keys, longs, shape_of, string};
use crate::error::{JResult, ThrowKvStore};
use crate::handles::{ARRAYS, STORES};

/// The row-sparse arrays of `datas` (handles) and `desc` (see the module docs).
fn row_sparse_arrays(datas: Vec<NDArray>, desc: &[i64]) -> Result<Vec<RowSparse>, Error> {
    let malformed = || Error::invalid_argument("malformed row-sparse description");
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[i64], Error> {
        let part = desc.get(at..at.checked_add(n).ok_or_else(malformed)?).ok_or_else(malformed)?;
        at += n;
        Ok(part)
    };
    let mut out = Vec::with_capacity(datas.len());
    for data in datas {
        let ndim = usize::try_from(take(1)?[0]).map_err(|_| malformed())?;
        let shape = shape_of(take(ndim)?)?;
        let n = usize::try_from(take(1)?[0]).map_err(|_| malformed())?;
        let indices = take(n)?.to_vec();
        out.push(RowSparse::new(data, indices, &shape)?);
    }
    if at != desc.len() {
        return Err(malformed());
    }
    Ok(out)
}

/// The arrays of `datas` and `desc`, Java arguments; or the reason they make none (a
/// closed or stale data array, a malformed description), which a store call takes as
/// its refused form: it fails as the store's own refusals do, under `dist_sync` on
/// every worker, in call order.
fn arrays_of(env: &Env<'_>, datas: &JLongArray<'_>, desc: &JLongArray<'_>) -> JResult<Result<Vec<RowSparse>, Error>> {
    let (datas, desc) = (longs(env, datas)?, longs(env, desc)?);
    Ok(ARRAYS.get_all(&datas).and_then(|datas| row_sparse_arrays(datas, &desc)))
}

/// The one row-sparse array of a data handle and its description.
fn one_of(env: &Env<'_>, data: jlong, desc: &JLongArray<'_>) -> JResult<RowSparse> {
    let data = ARRAYS.get(data)?;
    Ok(row_sparse_arrays(vec![data], &longs(env, desc)?)?.remove(0))
}

/// `[data handle, rows, indices...]`: a row-sparse array for Java (its data handle is
/// the caller's to free).
fn to_java<'l>(env: &mut Env<'l>, rsp: RowSparse) -> JResult<JLongArray<'l>> {
    let mut out = Vec::with_capacity(rsp.indices().len() + 2);
    out.push(0);
    out.push(rsp.shape()[0] as i64);
    out.extend_from_slice(rsp.indices());
    let array = JLongArray::new(env, out.len())?;
    out[0] = ARRAYS.insert(rsp.data().clone());
    if let Err(e) = array.set_region(env, 0, &out) {
        ARRAYS.remove(out[0]);
        return Err(e.into());
    }
    Ok(array)
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_RowSparse_nCheck<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    data: jlong,
    desc: JLongArray<'l>,
) {
    env.with_env(|env| -> JResult<()> { one_of(env, data, &desc).map(drop) }).resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_RowSparse_nFromDense<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    dense: jlong,
) -> JLongArray<'l> {
    env.with_env(|env| -> JResult<JLongArray<'l>> {
        let rsp = RowSparse::from_dense(&ARRAYS.get(dense)?)?;
        to_java(env, rsp)
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_RowSparse_nToDense<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    data: jlong,
    desc: JLongArray<'l>,
) -> jlong {
    env.with_env(|env| -> JResult<jlong> { Ok(ARRAYS.insert(one_of(env, data, &desc)?.to_dense()?)) })
        .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nInitRowSparse<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    ks: JObjectArray<'l, JString<'l>>,
    datas: JLongArray<'l>,
    desc: JLongArray<'l>,
) {
    env.with_env(|env| -> JResult<()> {
        let ks = keys(env, &ks, "a key")?;
        let kv = STORES.get(h)?;
        Ok(match arrays_of(env, &datas, &desc)? {
            Ok(values) => kv.init_row_sparse_many(&ks, &values),
            Err(refused) => kv.init(ks, Values::Refused(&refused)),
        }?)
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nPushRowSparse<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    ks: JObjectArray<'l, JString<'l>>,
    datas: JLongArray<'l>,
    desc: JLongArray<'l>,
    priority: jint,
) {
    env.with_env(|env| -> JResult<()> {
        let ks = keys(env, &ks, "a key")?;
        let pushes = arrays_of(env, &datas, &desc)?.and_then(|values| match ks.len() == values.len() {
            true => Ok(ks.into_iter().zip(values).map(|(k, v)| (k, vec![v])).collect::<Vec<(Key, Vec<RowSparse>)>>()),
            false => Err(Error::LengthMismatch {
                context: "pushRowSparse".into(),
                what: "values",
                expected: ks.len(),
                got: values.len(),
            }),
        });
        Ok(STORES.get(h)?.push_row_sparse_many(&pushes, priority)?)
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nRowSparsePull<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    key: JString<'l>,
    row_ids: JLongArray<'l>,
    priority: jint,
) -> JLongArray<'l> {
    env.with_env(|env| -> JResult<JLongArray<'l>> {
        let key = string(env, &key, "the key")?;
        let ids = longs(env, &row_ids)?;
        let rsp = STORES.get(h)?.row_sparse_pull(key, &ids, priority)?;
        to_java(env, rsp)
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_StoreNatives_nStype<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    key: JString<'l>,
) -> jint {
    env.with_env(|env| -> JResult<jint> {
        let key = string(env, &key, "the key")?;
        Ok(match STORES.get(h)?.stype(key)? {
            StorageType::Default => 0,
            StorageType::RowSparse => 1,
        })
    })
    .resolve::<ThrowKvStore>()
}
