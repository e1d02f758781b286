//! A Java `io.github.kvstore.Updater` as a store [`Updater`]: called on the thread that
//! pushed (already attached to the JVM, since the push came from Java), with the merged
//! and stored arrays handed over as `NDArray` objects whose handles live only for the
//! call.

use jni::objects::{Global, JClass, JObject, JValue};
use jni::{Env, JavaVM, jni_sig, jni_str};
use kvstore_core::{Error, Key, NDArray, Result, Updater};

use crate::error::{JResult, JniError, set_cause};
use crate::handles::ARRAYS;

/// A Java updater and the `NDArray` class it is called with.
pub struct JavaUpdater {
    updater: Global<JObject<'static>>,
    ndarray_class: Global<JClass<'static>>,
}

impl JavaUpdater {
    /// Wraps `updater`. The `NDArray` class is looked up now, from the native method of
    /// `KVStore` (whose class loader knows it), not later from an updater call.
    pub fn new(env: &mut Env<'_>, updater: &JObject<'_>) -> JResult<Self> {
        let class = env.find_class(jni_str!("io/github/kvstore/NDArray"))?;
        Ok(JavaUpdater { updater: env.new_global_ref(updater)?, ndarray_class: env.new_global_ref(class)? })
    }

    fn call(&self, env: &mut Env<'_>, key: &Key, index: usize, merged: i64, stored: i64) -> JResult<()> {
        let jkey = env.new_string(key.as_str())?;
        let index = i32::try_from(index).map_err(|_| Error::Internal(format!("key index {index} overflows int")))?;
        let m = env.new_object(&self.ndarray_class, jni_sig!("(J)V"), &[JValue::Long(merged)])?;
        let s = env.new_object(&self.ndarray_class, jni_sig!("(J)V"), &[JValue::Long(stored)])?;
        let r = env.call_method(
            &self.updater,
            jni_str!("update"),
            jni_sig!("(Ljava/lang/String;ILio/github/kvstore/NDArray;Lio/github/kvstore/NDArray;)V"),
            &[JValue::Object(&jkey), JValue::Int(index), JValue::Object(&m), JValue::Object(&s)],
        );
        match r {
            Ok(_) => Ok(()),
            Err(jni::errors::Error::JavaException) => {
                let Some(thrown) = env.exception_occurred() else {
                    return Err(Error::Backend { backend: "java updater", message: "threw".into() }.into());
                };
                env.exception_clear();
                let text = env
                    .call_method(&thrown, jni_str!("toString"), jni_sig!("()Ljava/lang/String;"), &[])
                    .and_then(|v| v.l())
                    .and_then(|o| env.cast_local::<jni::objects::JString>(o))
                    .and_then(|s| s.try_to_string(env))
                    .unwrap_or_else(|_| "an exception".to_string());
                env.exception_clear();
                set_cause(env.new_global_ref(thrown)?);
                Err(Error::Backend { backend: "java updater", message: format!("key \"{key}\": {text}") }.into())
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl Updater for JavaUpdater {
    fn update(&self, key: &Key, index: usize, merged: &NDArray, stored: &NDArray) -> Result<()> {
        let vm = JavaVM::singleton().map_err(|e| JniError::from(e).into_store_error())?;
        let (m, s) = (ARRAYS.insert(merged.clone()), ARRAYS.insert(stored.clone()));
        let r = vm.attach_current_thread(|env| self.call(env, key, index, m, s));
        // The Java objects may outlive the call; their handles do not.
        ARRAYS.remove(m);
        ARRAYS.remove(s);
        r.map_err(JniError::into_store_error)
    }
}
