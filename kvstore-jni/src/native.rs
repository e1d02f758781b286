//! Natives of `io.github.kvstore.Native`, a package-private class for tests: they check
//! that the two lists of error codes cannot drift and that a panic cannot cross FFI.

use jni::EnvUnowned;
use jni::objects::{JClass, JObjectArray, JString};
use kvstore::ErrorKind;

use crate::error::{JResult, ThrowKvStore};

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_Native_nErrorCodes<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
) -> JObjectArray<'l, JString<'l>> {
    env.with_env(|env| -> JResult<JObjectArray<'l, JString<'l>>> {
        let empty = JString::from_str(env, "")?;
        let out = JObjectArray::<JString>::new(env, ErrorKind::ALL.len(), &empty)?;
        for (i, kind) in ErrorKind::ALL.iter().enumerate() {
            let s = JString::from_str(env, kind.code())?;
            out.set_element(env, i, &s)?;
        }
        Ok(out)
    })
    .resolve::<ThrowKvStore>()
}

#[unsafe(no_mangle)]
pub extern "system" fn Java_io_github_kvstore_Native_nDebugPanic<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>) {
    env.with_env(|_| -> JResult<()> { panic!("nDebugPanic was called: a panic must surface as INTERNAL") })
        .resolve::<ThrowKvStore>()
}
