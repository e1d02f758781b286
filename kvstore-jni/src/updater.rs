//! A Java `io.github.kvstore.Updater` as a store [`Updater`]: called on the thread that
//! runs the push: the thread that pushed (attached to the JVM, since the push came from
//! Java), or one of the store's engine threads, which the first such call attaches as a
//! daemon thread (so that it never keeps the JVM from exiting) until the thread ends.
//! The merged and stored arrays are handed over as `NDArray` objects whose handles live
//! only for the call.
//!
//! Ownership: the Java `KVStore` keeps its updater in a strong field; this side holds
//! only a weak global reference. A global reference would be a GC root, and an updater
//! that captures its own store (`kv.setUpdater((k, i, m, s) -> kv...)`) would then keep
//! the store, its native memory and its threads alive forever.
//!
//! Safety on a short stack: the call goes through `Updater.invoke` (a private static
//! method, cached by `JNI_OnLoad` in [`crate::classes`]), so no class or method is
//! looked up here, and an exception of the updater becomes the cause of the `BACKEND`
//! error as it is: no Java method (not even `toString`) is called on it. Pushes nested
//! through updaters (an updater that pushes to another store whose updater pushes ...)
//! are capped at [`MAX_NESTING`] on one thread.

use std::cell::{Cell, RefCell};

use jni::objects::{JObject, JValue, Weak};
use jni::signature::{Primitive, ReturnType};
use jni::{Env, JavaVM};
use kvstore::{Cause, Error, Key, NDArray, Result, Updater};

use crate::classes::classes;
use crate::error::{JResult, JniError};
use crate::handles::ARRAYS;

/// The most updater calls that may run at once on one thread (each inside a push made
/// by the one before). A deeper push fails with `INVALID_ARGUMENT`: every level costs
/// native and Java stack, and a bound keeps a runaway chain from exhausting it.
pub const MAX_NESTING: usize = 8;

thread_local! {
    /// How many Java updater calls are running on this thread.
    static NESTING: Cell<usize> = const { Cell::new(0) };
}

/// Detaches the thread it belongs to from the JVM when the thread ends.
struct Detach(*mut jni::sys::JavaVM);

impl Drop for Detach {
    fn drop(&mut self) {
        // SAFETY: `self.0` is the process's JavaVM (it lives as long as the process), and
        // this thread was attached by `attach_as_daemon` and holds no JNI reference any
        // more: its thread-locals are being destroyed.
        unsafe {
            ((*(*self.0)).v1_1.DetachCurrentThread)(self.0);
        }
    }
}

thread_local! {
    /// Set when this (store engine) thread was attached here.
    static ATTACHED: RefCell<Option<Detach>> = const { RefCell::new(None) };
}

/// Attaches the current thread to the JVM as a daemon thread, unless it is attached
/// already (a Java thread, or an engine thread attached before).
fn attach_as_daemon(vm: &JavaVM) -> Result<()> {
    let raw = vm.get_raw();
    let mut env = std::ptr::null_mut();
    // SAFETY: `raw` is the process's JavaVM; GetEnv only writes the env pointer.
    let state = unsafe { ((*(*raw)).v1_2.GetEnv)(raw, &mut env, jni::sys::JNI_VERSION_1_6) };
    if state == jni::sys::JNI_OK {
        return Ok(());
    }
    // SAFETY: as above; a null argument block attaches with default name and group.
    let attached = unsafe { ((*(*raw)).v1_4.AttachCurrentThreadAsDaemon)(raw, &mut env, std::ptr::null_mut()) };
    if attached != jni::sys::JNI_OK {
        return Err(Error::Backend {
            backend: "java updater",
            message: format!("cannot attach the store's thread to the JVM to run the updater (JNI error {attached})"),
        });
    }
    ATTACHED.with(|a| *a.borrow_mut() = Some(Detach(raw)));
    Ok(())
}

/// One level of [`NESTING`], released when dropped.
struct Nested;

impl Nested {
    fn enter(key: &Key) -> Result<Self> {
        NESTING.with(|n| {
            if n.get() >= MAX_NESTING {
                return Err(Error::invalid_argument(format!(
                    "push of key \"{key}\": pushes nest too deeply through updaters ({MAX_NESTING} updater calls \
                     are already running on this thread, each inside a push made by the one before): an updater \
                     should not push to a store whose updater pushes again"
                )));
            }
            n.set(n.get() + 1);
            Ok(Nested)
        })
    }
}

impl Drop for Nested {
    fn drop(&mut self) {
        NESTING.with(|n| n.set(n.get().saturating_sub(1)));
    }
}

/// A Java updater, held weakly (see the module docs).
pub struct JavaUpdater {
    updater: Weak<JObject<'static>>,
}

impl JavaUpdater {
    /// Wraps `updater`, which the caller (the Java `KVStore`) keeps reachable.
    ///
    /// # Errors
    /// A JNI error if the weak reference cannot be made.
    pub fn new(env: &mut Env<'_>, updater: &JObject<'_>) -> JResult<Self> {
        Ok(JavaUpdater { updater: env.new_weak_ref(updater)? })
    }

    fn call(&self, env: &mut Env<'_>, key: &Key, index: usize, merged: i64, stored: i64) -> JResult<()> {
        let classes = classes()?;
        let index = i32::try_from(index).map_err(|_| Error::Internal(format!("key index {index} overflows int")))?;
        let Some(updater) = self.updater.upgrade_local(env)? else {
            return Err(Error::Backend {
                backend: "java updater",
                message: format!(
                    "key \"{key}\": the updater was garbage-collected (the KVStore that holds it was \
                     unreachable during the push)"
                ),
            }
            .into());
        };
        let jkey = env.new_string(key.as_str())?;
        let args = [
            JValue::Object(&updater).as_jni(),
            JValue::Object(&jkey).as_jni(),
            JValue::Int(index).as_jni(),
            JValue::Long(merged).as_jni(),
            JValue::Long(stored).as_jni(),
        ];
        // SAFETY: `updater_invoke` is the static `(Updater, String, int, long, long)void`
        // method of `classes.updater`, and `args` are an Updater, a String, an int and two
        // longs, in that order.
        let r = unsafe {
            env.call_static_method_unchecked(
                &classes.updater,
                classes.updater_invoke,
                ReturnType::Primitive(Primitive::Void),
                &args,
            )
        };
        r.map(|_| ()).map_err(JniError::from).map_err(|e| Self::caught(env, key, "the updater threw; see the cause", e))
    }

    /// The error of a failed call: a pending Java exception (thrown by the updater, or
    /// by the JVM on the way, such as `StackOverflowError`) is cleared and kept as the
    /// cause of the `BACKEND` error, untouched.
    fn caught(env: &mut Env<'_>, key: &Key, what: &str, e: JniError) -> JniError {
        let Some(thrown) = env.exception_occurred() else {
            return e;
        };
        env.exception_clear();
        let (backend, message) = ("java updater", format!("key \"{key}\": {what}"));
        match env.new_global_ref(&thrown) {
            Ok(cause) => Error::Raised { backend, message, cause: Cause::new(cause) }.into(),
            // Out of global references: the push still fails, without its cause.
            Err(_) => {
                env.exception_clear();
                Error::Backend { backend, message }.into()
            }
        }
    }
}

impl Updater for JavaUpdater {
    fn update(&self, key: &Key, index: usize, merged: &NDArray, stored: &NDArray) -> Result<()> {
        let _nested = Nested::enter(key)?;
        let vm = JavaVM::singleton().map_err(|e| JniError::from(e).into_store_error())?;
        attach_as_daemon(&vm)?;
        let (m, s) = (ARRAYS.insert(merged.clone()), ARRAYS.insert(stored.clone()));
        // The thread is attached now: take its env without an attach policy, whose
        // exception handling calls Java methods on a pending exception. Every path below
        // leaves no exception pending.
        let r = vm.with_local_frame(8, |env| -> JResult<()> {
            self.call(env, key, index, m, s).map_err(|e| Self::caught(env, key, "the updater could not be called", e))
        });
        // The Java objects may outlive the call; their handles do not.
        ARRAYS.remove(m);
        ARRAYS.remove(s);
        r.map_err(JniError::into_store_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvstore::ErrorKind;

    #[test]
    fn nesting_is_capped_per_thread_and_released_on_drop() {
        let key = Key::from("k");
        let levels: Vec<Nested> = (0..MAX_NESTING).map(|_| Nested::enter(&key).unwrap()).collect();
        let err = Nested::enter(&key).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.to_string().contains("nest too deeply"), "{err}");
        // Another thread has its own count.
        std::thread::spawn(|| assert!(Nested::enter(&Key::from("t")).is_ok())).join().unwrap();
        drop(levels);
        assert_eq!(NESTING.with(Cell::get), 0);
        assert!(Nested::enter(&key).is_ok());
    }
}
