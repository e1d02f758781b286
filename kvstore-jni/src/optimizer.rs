//! Natives of `io.github.kvstore.Optimizer`, and the JSON that carries an optimizer
//! from Java to Rust.
//!
//! Java describes an optimizer as data (`Optimizer.toJson()`) and hands it over as one
//! string, so that one native call, not one per setter, builds it; Rust checks it whole
//! with the same code that `KVStore::set_optimizer` uses. The format, its defaults and
//! its errors are [`kvstore::OptimizerSpec`]'s.

use jni::EnvUnowned;
use jni::objects::{JClass, JString};
use kvstore::{Optimizer, OptimizerSpec, Result};

use crate::error::{JResult, ThrowKvStore};

/// The optimizer described by `json`, read by [`OptimizerSpec::from_json`] and built
/// by [`OptimizerSpec::build`].
///
/// # Errors
/// [`kvstore::Error::InvalidArgument`] for JSON that does not parse, an unknown
/// or ill-typed field, a non-finite number, and everything the builder rejects;
/// [`kvstore::Error::Unsupported`] for an optimizer whose rule this build lacks.
pub fn optimizer_from_json(json: &str) -> Result<Optimizer> {
    OptimizerSpec::from_json(json)?.build()
}

/// Core's canonical JSON ([`OptimizerSpec::to_json`]) of the description in `json`,
/// read but not built (so that an optimizer whose rule this build lacks echoes too).
///
/// # Errors
/// What [`OptimizerSpec::from_json`] rejects.
pub fn canonical_json(json: &str) -> Result<String> {
    Ok(OptimizerSpec::from_json(json)?.to_json())
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

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_Optimizer_nCanonicalJson<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    json: JString<'l>,
) -> JString<'l> {
    env.with_env(|env| -> JResult<JString<'l>> {
        let out = canonical_json(&crate::convert::string(env, &json, "the optimizer JSON")?)?;
        Ok(env.new_string(out)?)
    })
    .resolve::<ThrowKvStore>()
}
