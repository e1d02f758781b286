//! `JNI_OnLoad`: the Java classes and method IDs the error and updater paths use, and
//! jni-rs's own class caches, all filled once while the loading thread's stack is
//! healthy.
//!
//! Why: jni-rs 0.22 looks a class up the first time it casts to a type or matches an
//! exception, and when that lookup fails it looks up more classes to map the failure
//! (`NoClassDefFoundError`, then `Thread` for the context class loader, ...). On a
//! thread whose stack is nearly exhausted (an updater that hit `StackOverflowError`, a
//! push made deep in a recursion) every lookup fails again, and the recursion overflows
//! the native stack: the JVM dies with SIGSEGV. With every cache warm, an error path
//! makes no class lookup at all, so a failure there is an ordinary pending Java
//! exception.
//!
//! No class whose static initializer loads this library (`KVStore`, `NDArray`, ...) is
//! touched here: initializing one from inside `JNI_OnLoad` would re-enter
//! `NativeLibrary.load()` and could deadlock against another thread initializing it.
//! Updaters are therefore called through a private static method of the `Updater`
//! interface, which builds the `NDArray` arguments in Java.

use std::ffi::c_void;
use std::sync::OnceLock;

use jni::objects::{
    Global, JClass, JClassLoader, JDoubleArray, JFloatArray, JIntArray, JLongArray, JObject, JObjectArray,
    JStackTraceElement, JStaticMethodID, JString, JThread, JThrowable, JValue, LoaderContext, Reference,
};
use jni::sys::{JNI_ERR, JNI_VERSION_1_8, jint};
use jni::{Env, JavaVM, exceptions, jni_sig, jni_str};

/// What the error and updater paths need from Java, looked up by `JNI_OnLoad`.
pub struct Classes {
    /// `io.github.kvstore.KVStoreException`.
    pub kvstore_exception: Global<JClass<'static>>,
    /// Its constructor `(String code, String message, Throwable cause, String key,
    /// long[] expectedShape, long[] gotShape, int expectedDType, int gotDType,
    /// long expectedLength, long gotLength)`, where a dtype is its code or -1 and a
    /// length -1 when absent.
    pub kvstore_exception_new: jni::objects::JMethodID,
    /// `io.github.kvstore.Updater`.
    pub updater: Global<JClass<'static>>,
    /// `private static void invoke(Updater, String, int, long, long)` of `Updater`.
    pub updater_invoke: JStaticMethodID,
}

static CLASSES: OnceLock<Classes> = OnceLock::new();

/// The classes cached by `JNI_OnLoad`.
///
/// # Errors
/// [`jni::errors::Error::NullPtr`] if `JNI_OnLoad` did not run (the library was not
/// loaded by a JVM); no native method can be called then.
pub fn classes() -> jni::errors::Result<&'static Classes> {
    CLASSES.get().ok_or(jni::errors::Error::NullPtr("kvstore-jni class cache: JNI_OnLoad did not run"))
}

/// Looks up, and so caches, the class of each jni-rs type that jni-rs may look up
/// on its own: the casts, the exceptions its error mapping matches, and what a
/// class-loader lookup touches.
fn warm_jni_rs(env: &mut Env<'_>) -> jni::errors::Result<()> {
    macro_rules! lookup {
        ($($t:ty),* $(,)?) => {
            $( <$t as Reference>::lookup_class(env, &LoaderContext::None)?; )*
        };
    }
    lookup!(
        JObject,
        JClass,
        JClassLoader,
        JString,
        JThrowable,
        JThread,
        JStackTraceElement,
        JObjectArray<JString>,
        JFloatArray,
        JDoubleArray,
        JIntArray,
        JLongArray,
        exceptions::JArrayIndexOutOfBoundsException,
        exceptions::JArrayStoreException,
        exceptions::JClassCircularityError,
        exceptions::JClassFormatError,
        exceptions::JClassNotFoundException,
        exceptions::JExceptionInInitializerError,
        exceptions::JIllegalArgumentException,
        exceptions::JIllegalMonitorStateException,
        exceptions::JInstantiationException,
        exceptions::JLinkageError,
        exceptions::JNoClassDefFoundError,
        exceptions::JNoSuchFieldError,
        exceptions::JNoSuchMethodError,
        exceptions::JNumberFormatException,
        exceptions::JOutOfMemoryError,
        exceptions::JRuntimeException,
        exceptions::JSecurityException,
        exceptions::JStringIndexOutOfBoundsException,
    );
    // The paths themselves, once each: a cast to a string and to a throwable, and a
    // failing lookup through FindClass and through the context class loader (jni-rs
    // maps each failure to an `Err` and clears the exception).
    let s = JString::from_str(env, "warm-up")?;
    let s = env.cast_local::<JString>(JObject::from(s))?;
    let t = env.new_object(
        jni_str!("java/lang/RuntimeException"),
        jni_sig!("(Ljava/lang/String;)V"),
        &[JValue::Object(&s)],
    )?;
    env.cast_local::<JThrowable>(t)?;
    let missing = env.find_class(jni_str!("io/github/kvstore/NoSuchClassWarmUp"));
    debug_assert!(missing.is_err());
    let missing = env.load_class(jni_str!("io.github.kvstore.NoSuchClassWarmUp"));
    debug_assert!(missing.is_err());
    env.exception_clear();
    Ok(())
}

/// Looks up the classes and method IDs of [`Classes`], and builds one
/// `KVStoreException` so that its class and its `Code` enum are initialized now, not
/// on a thread that is short of stack.
fn lookup_classes(env: &mut Env<'_>) -> jni::errors::Result<Classes> {
    let class = env.find_class(jni_str!("io/github/kvstore/KVStoreException"))?;
    let kvstore_exception_new = env.get_method_id(
        &class,
        jni_str!("<init>"),
        jni_sig!("(Ljava/lang/String;Ljava/lang/String;Ljava/lang/Throwable;Ljava/lang/String;[J[JIIJJ)V"),
    )?;
    let kvstore_exception = env.new_global_ref(&class)?;
    let code = JString::from_str(env, "INTERNAL")?;
    let message = JString::from_str(env, "warm-up")?;
    let null = JObject::null();
    let args = [
        JValue::Object(&code).as_jni(),
        JValue::Object(&message).as_jni(),
        JValue::Object(&null).as_jni(),
        JValue::Object(&null).as_jni(),
        JValue::Object(&null).as_jni(),
        JValue::Object(&null).as_jni(),
        JValue::Int(-1).as_jni(),
        JValue::Int(-1).as_jni(),
        JValue::Long(-1).as_jni(),
        JValue::Long(-1).as_jni(),
    ];
    // SAFETY: `kvstore_exception_new` is the constructor of `class` whose signature was
    // just given, and `args` are of its types (a String, a String, then nulls and -1s).
    unsafe { env.new_object_unchecked(&class, kvstore_exception_new, &args)? };
    let class = env.find_class(jni_str!("io/github/kvstore/Updater"))?;
    let updater_invoke = env.get_static_method_id(
        &class,
        jni_str!("invoke"),
        jni_sig!("(Lio/github/kvstore/Updater;Ljava/lang/String;IJJ)V"),
    )?;
    let updater = env.new_global_ref(&class)?;
    Ok(Classes { kvstore_exception, kvstore_exception_new, updater, updater_invoke })
}

/// Called by the JVM when it loads the library: installs the panic hook
/// ([`crate::error::install_panic_hook`]) and fills the caches (see the module docs).
/// On failure the load fails (`UnsatisfiedLinkError`), rather than leaving error paths
/// that can crash.
///
/// # Safety
/// Only the JVM may call it, on the thread that loads the library, with its own
/// `JavaVM` pointer.
#[unsafe(no_mangle)]
pub unsafe extern "system" fn JNI_OnLoad(vm: *mut jni::sys::JavaVM, _reserved: *mut c_void) -> jint {
    if vm.is_null() {
        return JNI_ERR;
    }
    crate::error::install_panic_hook();
    // SAFETY: the JVM passes JNI_OnLoad a pointer to itself, valid for as long as the
    // library is loaded, and supports JNI 1.8 (JDK 8 and later).
    let vm = unsafe { JavaVM::from_raw(vm) };
    let loaded = vm.attach_current_thread(|env| -> jni::errors::Result<()> {
        warm_jni_rs(env)?;
        let classes = lookup_classes(env)?;
        // Set once: the JVM runs JNI_OnLoad once per loaded copy of the library.
        let _ = CLASSES.set(classes);
        Ok(())
    });
    match loaded {
        Ok(()) => JNI_VERSION_1_8,
        Err(_) => JNI_ERR,
    }
}
