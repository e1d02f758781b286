//! CUDA tensors through DLPack (`__dlpack__`/`__dlpack_device__`: PyTorch, CuPy, JAX
//! on a GPU) as `gpu(i)` arrays of kvstore-cuda over the tensor's own memory.
//!
//! The consumer's side of the DLPack protocol: the producer is asked for its tensor with
//! `__dlpack__(stream=1)` (the legacy default stream, the one kvstore-cuda queues its
//! work on: [`kvstore::cuda::DLPACK_STREAM`]), so its pending writes come before the
//! store's; the capsule's `DLManagedTensor` is taken (the capsule renamed
//! `used_dltensor`, as the protocol says) and its deleter called once the store's
//! last use of the memory is done. Host tensors do not come here: numpy reads them.
//! Built with the `cuda` feature only.

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;

use kvstore::{DType, NDArray};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyDict};

use crate::arrays::KDL_CUDA;

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// A `DLManagedTensor` taken from its capsule: the tensor's memory stays valid until
/// this is dropped, which calls the producer's deleter (with the GIL: some producers'
/// deleters release Python objects).
struct Managed(NonNull<DLManagedTensor>);

// SAFETY: the managed tensor is only read while it is parsed (under the GIL, on the
// thread that took it) and then only its deleter is called, once, in `drop`, with the
// GIL held; DLPack lets a consumer call the deleter from any thread.
unsafe impl Send for Managed {}
// SAFETY: as above: `&Managed` gives access to nothing.
unsafe impl Sync for Managed {}

impl Drop for Managed {
    fn drop(&mut self) {
        let ptr = self.0.as_ptr();
        // When the interpreter is exiting the tensor is left to it (never freed twice).
        crate::attach(|_| {
            // SAFETY: `ptr` is the live managed tensor this struct took from its capsule
            // (whose name says it is used, so the capsule will not delete it too); its
            // deleter is called exactly once, here.
            unsafe {
                if let Some(deleter) = (*ptr).deleter {
                    deleter(ptr);
                }
            }
        });
    }
}

/// The store dtype of a DLPack dtype (one lane).
fn dtype_of(d: &DLDataType) -> Option<DType> {
    Some(match (d.code, d.bits, d.lanes) {
        (2, 32, 1) => DType::F32,
        (2, 64, 1) => DType::F64,
        (2, 16, 1) => DType::F16,
        (4, 16, 1) => DType::BF16,
        (0, 32, 1) => DType::I32,
        (0, 64, 1) => DType::I64,
        (0, 8, 1) => DType::I8,
        (1, 8, 1) => DType::U8,
        _ => return None,
    })
}

/// `obj`, a tensor on the CUDA device `device` (its `__dlpack_device__`), as a
/// `gpu(device)` array over its memory, for `what` ("value", "out").
pub(crate) fn wrap_cuda(obj: &Bound<'_, PyAny>, device: i32, what: &str) -> PyResult<NDArray> {
    let py = obj.py();
    let id = u32::try_from(device).map_err(|_| {
        crate::errors::value_error(format!("{what}: __dlpack_device__ gave a negative device id {device}"))
    })?;
    let context = kvstore::gpu(id).map_err(crate::errors::to_py)?;
    // PyTorch refuses to export a tensor that requires grad: its data is what is meant.
    let obj = if obj.hasattr("requires_grad")? && obj.getattr("requires_grad")?.is_truthy()? {
        obj.call_method0("detach")?
    } else {
        obj.clone()
    };
    let kwargs = PyDict::new(py);
    kwargs.set_item("stream", kvstore::cuda::DLPACK_STREAM)?;
    let capsule = obj.call_method("__dlpack__", (), Some(&kwargs))?;
    let capsule = capsule
        .cast_into::<PyCapsule>()
        .map_err(|_| crate::errors::type_error(format!("{what}: __dlpack__ did not return a DLPack capsule")))?;
    const NAME: &CStr = c"dltensor";
    const USED: &CStr = c"used_dltensor";
    let ptr = capsule.pointer_checked(Some(NAME))?.cast::<DLManagedTensor>();
    // SAFETY: the capsule is live and named "dltensor", so (by the DLPack protocol) its
    // pointer is a DLManagedTensor that nobody has taken; renaming it "used_dltensor"
    // makes this the tensor's only consumer (the capsule's destructor then leaves it).
    if unsafe { pyo3::ffi::PyCapsule_SetName(capsule.as_ptr(), USED.as_ptr()) } != 0 {
        return Err(PyErr::fetch(py));
    }
    let managed = Managed(ptr);
    // SAFETY: `ptr` is the managed tensor taken above, valid until its deleter runs
    // (when `managed` is dropped); it is only read here.
    let t = unsafe { &ptr.as_ref().dl_tensor };
    if t.device.device_type != KDL_CUDA || t.device.device_id != device {
        return Err(crate::errors::value_error(format!(
            "{what}: the tensor's DLPack device ({}, {}) is not the one __dlpack_device__ gave ({KDL_CUDA}, {device})",
            t.device.device_type, t.device.device_id
        )));
    }
    let dtype = dtype_of(&t.dtype).ok_or_else(|| {
        crate::errors::type_error(format!(
            "{what}: DLPack dtype (code {}, {} bits, {} lanes) is not supported: use float32, float64, float16, \
             bfloat16, int32, int64, int8 or uint8",
            t.dtype.code, t.dtype.bits, t.dtype.lanes
        ))
    })?;
    let ndim = usize::try_from(t.ndim).map_err(|_| crate::errors::value_error(format!("{what}: ndim {}", t.ndim)))?;
    let (shape, strides): (Vec<i64>, Option<Vec<i64>>) = if ndim == 0 {
        (Vec::new(), None)
    } else {
        // SAFETY: DLPack's shape (and strides, when not null) hold `ndim` elements,
        // valid while the managed tensor is.
        unsafe {
            (
                std::slice::from_raw_parts(t.shape, ndim).to_vec(),
                (!t.strides.is_null()).then(|| std::slice::from_raw_parts(t.strides, ndim).to_vec()),
            )
        }
    };
    if shape.iter().any(|&d| d < 0) {
        return Err(crate::errors::value_error(format!("{what}: negative dimension in {shape:?}")));
    }
    let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    if let Some(strides) = &strides {
        // Row-major and compact; a dimension of one may have any stride.
        let mut expected = 1i64;
        for (&d, &s) in shape.iter().zip(strides).rev() {
            if d != 1 && s != expected {
                return Err(crate::errors::value_error(format!(
                    "{what} must be C-contiguous (it is read and written in place): strides {strides:?} for \
                     shape {shape:?}; pass tensor.contiguous()"
                )));
            }
            expected = expected.saturating_mul(d as i64);
        }
    }
    let size: usize = shape.iter().product();
    let len = size * dtype.size();
    let addr = (t.data as u64).wrapping_add(t.byte_offset);
    if len > 0 && !addr.is_multiple_of(dtype.size() as u64) {
        return Err(crate::errors::value_error(format!("{what} is not aligned for its dtype (address {addr:#x})")));
    }
    let device = device as usize;
    let owner = Box::new((managed, obj.unbind()));
    {
        // SAFETY: `addr` is the tensor's `len` bytes on `device` (its producer's memory
        // in the device's primary context), valid while the managed tensor is, which
        // `owner` keeps until the buffer is dropped; the producer ordered its writes
        // before the legacy default stream, as `__dlpack__(stream=1)` asked.
        let buf =
            unsafe { kvstore::cuda::wrap_device_memory(device, addr, len, owner) }.map_err(crate::errors::to_py)?;
        NDArray::from_device_buffer(&shape, dtype, context, buf, true).map_err(crate::errors::to_py)
    }
}
