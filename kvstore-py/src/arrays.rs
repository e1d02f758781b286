//! Python arrays as store arrays, in place: a numpy array (or anything the package's
//! Python layer turns into a numpy view without a copy: DLPack, `__array_interface__`)
//! becomes an [`NDArray`] over the same memory ([`NDArray::from_foreign`]), and store
//! arrays go back to Python as numpy views that keep their memory alive.

use kvstore::{DType, HostMemory, NDArray, bf16, f16};
use numpy::ndarray::{ArrayViewD, IxDyn};
use numpy::{PyArray, PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods, npyffi};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use std::collections::HashMap;

use parking_lot::{Mutex, MutexGuard};

/// The store dtype of a numpy dtype, if it is one of the eight (in native byte order).
fn dtype_of(py: Python<'_>, descr: &Bound<'_, PyArrayDescr>) -> Option<DType> {
    if !descr.is_native_byteorder().unwrap_or(true) {
        return None;
    }
    let d = match (descr.kind(), descr.itemsize()) {
        (b'f', 4) => DType::F32,
        (b'f', 8) => DType::F64,
        (b'f', 2) => DType::F16,
        (b'i', 4) => DType::I32,
        (b'i', 8) => DType::I64,
        (b'i', 1) => DType::I8,
        (b'u', 1) => DType::U8,
        (b'V', 2) if is_bfloat16(py, descr) => DType::BF16,
        _ => return None,
    };
    Some(d)
}

/// numpy's own descriptors of the seven builtin dtypes (native byte order), held so
/// that they live (and keep their addresses) as long as the module.
static COMMON: PyOnceLock<Vec<(Py<PyArrayDescr>, DType)>> = PyOnceLock::new();

/// The dtype of an array whose descriptor is `descr`, when it is one of numpy's own
/// for the seven builtin dtypes (what nearly every array has: `np.zeros(n,
/// np.float32).dtype is np.dtype(np.float32)`): a pointer comparison, where
/// [`dtype_of`] asks numpy several questions.
fn common_dtype(py: Python<'_>, descr: *mut npyffi::PyArray_Descr) -> Option<DType> {
    let common = COMMON.get_or_init(py, || {
        vec![
            (numpy::dtype::<f32>(py).unbind(), DType::F32),
            (numpy::dtype::<f64>(py).unbind(), DType::F64),
            (numpy::dtype::<f16>(py).unbind(), DType::F16),
            (numpy::dtype::<i32>(py).unbind(), DType::I32),
            (numpy::dtype::<i64>(py).unbind(), DType::I64),
            (numpy::dtype::<i8>(py).unbind(), DType::I8),
            (numpy::dtype::<u8>(py).unbind(), DType::U8),
        ]
    });
    common.iter().find(|(d, _)| d.as_ptr().cast::<npyffi::PyArray_Descr>() == descr).map(|(_, t)| *t)
}

/// Whether `descr` is ml_dtypes' bfloat16 (looked up only for 2-byte void dtypes, and
/// only if ml_dtypes is already imported: an array of it cannot exist otherwise).
fn is_bfloat16(py: Python<'_>, descr: &Bound<'_, PyArrayDescr>) -> bool {
    let imported =
        py.import("sys").and_then(|sys| sys.getattr("modules")).and_then(|m| m.contains("ml_dtypes")).unwrap_or(false);
    imported && descr.is_equiv_to(&numpy::dtype::<bf16>(py))
}

/// A description of `obj` for messages: its type, and shape and dtype for an array.
fn describe(obj: &Bound<'_, PyAny>) -> String {
    match obj.cast::<PyUntypedArray>() {
        Ok(a) => format!("a numpy array of shape {:?} and dtype {}", a.shape(), a.dtype()),
        Err(_) => obj.get_type().name().map_or_else(|_| "an object".to_string(), |n| format!("a {n}")),
    }
}

/// DLPack's `kDLCUDA` device type.
pub(crate) const KDL_CUDA: i32 = 2;

/// The CUDA device `obj` is on, if it is a tensor on a GPU (by its `__dlpack_device__`).
/// An object whose `__dlpack_device__` fails or says something else (PyTorch raises for
/// its `meta` and `mps` devices) is not one: the package's Python layer then names it.
fn cuda_device(obj: &Bound<'_, PyAny>) -> Option<i32> {
    let (kind, id): (i32, i32) = obj.call_method0("__dlpack_device__").ok()?.extract().ok()?;
    (kind == KDL_CUDA).then_some(id)
}

/// `obj`, a tensor on the CUDA device `device`, as a `gpu(device)` array over its memory.
#[cfg(feature = "cuda")]
fn wrap_cuda(obj: &Bound<'_, PyAny>, device: i32, what: &str) -> PyResult<NDArray> {
    crate::dlpack::wrap_cuda(obj, device, what)
}

#[cfg(not(feature = "cuda"))]
fn wrap_cuda(_obj: &Bound<'_, PyAny>, device: i32, what: &str) -> PyResult<NDArray> {
    Err(crate::errors::type_error(format!(
        "{what} is a tensor on CUDA device {device}, and this build of kvstore has no GPU support (the `cuda` feature)"
    )))
}

/// What the caller does with an array: reads it (a value) or writes it (an out).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Use {
    Read,
    Write,
}

/// `obj` as a store array over the same memory, for `what` ("value", "out").
///
/// A numpy array must be C-contiguous, aligned, in native byte order and of one of the
/// eight dtypes, and writable when it is written; a tensor on a GPU (its
/// `__dlpack_device__` says CUDA) becomes a `gpu(i)` array over its memory
/// (`dlpack.rs`); anything else that is not a numpy array goes through the package's `kvstore._arrays.as_numpy`, which returns a numpy
/// view of it without a copy (DLPack, `__array_interface__`) or raises `TypeError`.
pub(crate) fn wrap<'py>(
    obj: &Bound<'py, PyAny>,
    usage: Use,
    what: &str,
    reuse: Option<&mut Reusing<'_, 'py>>,
) -> PyResult<NDArray> {
    let py = obj.py();
    let converted;
    let (array, reuse) = match obj.cast::<PyUntypedArray>() {
        Ok(a) => (a, reuse),
        // A view made here lives for this call only: not reused.
        Err(_) => {
            if crate::sparse::is_row_sparse(obj) {
                return Err(crate::sparse::not_here(what));
            }
            if let Some(device) = cuda_device(obj) {
                return wrap_cuda(obj, device, what);
            }
            let view = py.import("kvstore._arrays")?.call_method1("as_numpy", (obj, usage == Use::Write, what))?;
            match view.cast_into::<PyUntypedArray>() {
                Ok(a) => {
                    converted = a;
                    (&converted, None)
                }
                Err(_) => {
                    return Err(crate::errors::type_error(format!(
                        "{what} must be an array (numpy, or with __dlpack__), not {}",
                        describe(obj)
                    )));
                }
            }
        }
    };
    let raw = array.as_array_ptr();
    // SAFETY: `raw` is the live PyArrayObject of `array` (held above); reading its
    // descriptor pointer does not change it.
    let dtype = match common_dtype(py, unsafe { (*raw).descr }) {
        Some(d) => d,
        None => {
            let descr = array.dtype();
            dtype_of(py, &descr).ok_or_else(|| {
                crate::errors::type_error(format!(
                    "{what}: dtype {descr} is not supported: use float32, float64, float16, bfloat16, int32, int64, int8 or uint8"
                ))
            })?
        }
    };
    if !array.is_c_contiguous() {
        return Err(crate::errors::value_error(format!(
            "{what} must be C-contiguous (it is read and written in place): got {}; pass numpy.ascontiguousarray(...) for a value",
            describe(obj)
        )));
    }
    // SAFETY: `raw` is the live PyArrayObject of `array` (held above); reading its
    // flags and data pointer does not change it.
    let (flags, data) = unsafe { ((*raw).flags, (*raw).data) };
    if flags & npyffi::NPY_ARRAY_ALIGNED == 0 {
        return Err(crate::errors::value_error(format!("{what} is not aligned for its dtype: {}", describe(obj))));
    }
    let writable = flags & npyffi::NPY_ARRAY_WRITEABLE != 0;
    if usage == Use::Write && !writable {
        return Err(crate::errors::value_error(format!(
            "{what} is read-only: the store writes it in place ({})",
            describe(obj)
        )));
    }
    let shape = array.shape();
    let len = array.len() * dtype.size();
    if len == 0 {
        // No memory to share: a new empty array of the same shape.
        // SAFETY: no bytes: the pointer is not read.
        return unsafe { HostMemory::wrap(shape, dtype, std::ptr::null_mut(), 0, true, None) }
            .map_err(crate::errors::to_py);
    }
    let ptr = data.cast::<u8>();
    let make = || {
        // SAFETY: `ptr` points to the `len` bytes of `array`'s buffer (C-contiguous,
        // aligned for `dtype`, writable only if numpy says so, all checked above). The
        // memory keeps no reference to the array: every store array over Python memory
        // is used only through a handle that holds one ([`NDArray::kept_alive_by`],
        // given the numpy array: every non-blocking call's, and every call's array made
        // over a view made for the call), or by a blocking call that holds the array
        // until it returns (`CallArrays`) and checked that its buffer is this one, in
        // the same shape, dtype and writability (`Reusing::wrapped`, and
        // `NDArray::from_foreign`, which gives an array already made over the same
        // memory to every wrapper of it). Numpy frees or moves an array's buffer only
        // when the array is freed or resized, and `ndarray.resize` refuses an array that
        // another reference holds (unless the user passes `refcheck=False`, which numpy
        // documents as unsafe). Python code that touches the bytes while a call uses
        // them breaks the store's documented rule (docs/python.md).
        unsafe { HostMemory::wrap(shape, dtype, ptr, len, writable, None) }.map_err(crate::errors::to_py)
    };
    match reuse {
        Some(reuse) => reuse.wrapped(obj, ptr, writable, shape, dtype, make),
        // A non-blocking call's (or one made over a view made here): the array's
        // handles keep the numpy array, as long as the call holds one.
        None => Ok(make()?.kept_alive_by(Box::new(array.clone().into_any().unbind()))),
    }
}

/// Keeps a store array alive for the numpy views of its memory (their base).
#[pyclass(frozen, module = "kvstore._kvstore")]
pub(crate) struct Owner {
    _array: NDArray,
}

/// A numpy array over `array`'s host memory, keeping `array` alive; writable unless
/// `array` is read-only.
///
/// Only for arrays no other thread writes meanwhile: a new array (a pull into no out)
/// or an updater's arguments, which the store hands to the updater alone for the call.
pub(crate) fn view<'py>(py: Python<'py>, array: &NDArray) -> PyResult<Bound<'py, PyAny>> {
    if !array.context().is_cpu() {
        return Err(crate::errors::value_error(format!(
            "an array on {} has no host memory to view: copy it to the host first",
            array.context()
        )));
    }
    fn typed<'py, T: numpy::Element + kvstore::Element>(
        py: Python<'py>,
        array: &NDArray,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ptr = array.with_data(|d: &[T]| d.as_ptr()).map_err(crate::errors::to_py)?;
        let shape = IxDyn(array.shape());
        let owner = Bound::new(py, Owner { _array: array.clone() })?.into_any();
        // SAFETY: `ptr` points to the array's `size()` elements of `T` (its dtype),
        // row-major in `shape`; the memory belongs to the array, which `owner` (the
        // view's base) keeps alive, and a host array's buffer never moves. An empty
        // array's pointer is dangling but aligned, which ndarray allows.
        let elements = unsafe { ArrayViewD::from_shape_ptr(shape, ptr) };
        // SAFETY: as above: `owner` keeps the memory alive as long as the view.
        let view = unsafe { PyArray::borrow_from_array(&elements, owner) };
        if array.is_read_only() {
            // SAFETY: `view` is a live numpy array made just above; clearing its
            // writeable flag only narrows what Python may do with it.
            unsafe { (*view.as_array_ptr()).flags &= !npyffi::NPY_ARRAY_WRITEABLE };
        }
        Ok(view.into_any())
    }
    match array.dtype() {
        DType::F32 => typed::<f32>(py, array),
        DType::F64 => typed::<f64>(py, array),
        DType::F16 => typed::<f16>(py, array),
        DType::BF16 => {
            py.import("ml_dtypes").map_err(|_| {
                crate::errors::type_error(
                    "bfloat16 arrays need the ml_dtypes package: pip install 'kvstore[bfloat16]' (or pip install ml_dtypes)",
                )
            })?;
            typed::<bf16>(py, array)
        }
        DType::I32 => typed::<i32>(py, array),
        DType::I64 => typed::<i64>(py, array),
        DType::I8 => typed::<i8>(py, array),
        DType::U8 => typed::<u8>(py, array),
    }
}

/// The numpy arrays that blocking pushes and pulls were given, wrapped once and reused
/// by later calls (a training loop pushes and pulls the same arrays step after step),
/// by the address of their buffer (the map's key), in one map for the process. An
/// entry holds no reference to a Python object: it is used only by a call that holds
/// an object over its memory ([`CallArrays`]), with the same shape, dtype and
/// writability. Every wrapper of the same memory seen the same way is one store array
/// while one lives (`NDArray::from_foreign`): an entry, and a non-blocking call's
/// array, whose handles hold its object ([`NDArray::kept_alive_by`]); so calls through
/// views of one array (`s`, `s[:]`), blocking or not, from any thread, are ordered as
/// calls on one array. Entries wrap memory only, nothing of a store, so every store
/// shares them. Nothing else of Python sees a reused array: a Python updater gets views
/// of the store's own buffers, never of a pushed value
/// (`test_an_updater_sees_the_stores_memory_not_the_pushed_arrays`).
static REUSED: std::sync::LazyLock<Mutex<HashMap<usize, NDArray, foldhash::fast::RandomState>>> =
    std::sync::LazyLock::new(Default::default);

/// At most this many arrays are kept for reuse (about 300 bytes each, with no Python
/// memory): a full map is emptied.
const MOST_REUSED: usize = 1 << 14;

/// One blocking call's reused arrays: their objects, held until the call returns.
#[derive(Default)]
pub(crate) struct CallArrays<'py> {
    held: Vec<Bound<'py, PyAny>>,
}

impl<'py> CallArrays<'py> {
    /// The map, for wrapping one argument's arrays; `None` (wrap them anew) when
    /// another thread has it: that thread holds it only while it wraps, and may have
    /// let this one run meanwhile (when an iterable it reads runs Python code), so
    /// waiting could deadlock.
    pub(crate) fn reusing(&mut self) -> Option<Reusing<'_, 'py>> {
        let map = REUSED.try_lock()?;
        Some(Reusing { call: self, map })
    }
}

/// The reused arrays, locked while one argument of a call is wrapped.
pub(crate) struct Reusing<'c, 'py> {
    call: &'c mut CallArrays<'py>,
    map: MutexGuard<'static, HashMap<usize, NDArray, foldhash::fast::RandomState>>,
}

impl<'py> Reusing<'_, 'py> {
    /// The reused array over `obj`'s buffer (`ptr`, `shape`, `dtype`, `writable`), else
    /// one from `make` (the live array over that memory, or a new one), remembered;
    /// either way the call holds `obj` until it returns.
    fn wrapped(
        &mut self,
        obj: &Bound<'py, PyAny>,
        ptr: *mut u8,
        writable: bool,
        shape: &[usize],
        dtype: DType,
        make: impl FnOnce() -> PyResult<NDArray>,
    ) -> PyResult<NDArray> {
        let id = ptr as usize;
        let array = match self.map.get(&id) {
            // (Its length is that of the shape in the dtype.)
            Some(r) if r.is_read_only() != writable && r.dtype() == dtype && r.shape() == shape => r.clone(),
            _ => {
                let array = make()?;
                if self.map.len() >= MOST_REUSED {
                    self.map.clear();
                }
                self.map.insert(id, array.clone());
                array
            }
        };
        self.call.held.push(obj.clone());
        Ok(array)
    }
}
