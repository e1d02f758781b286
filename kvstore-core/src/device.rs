//! Device contexts other than the host. Core names no GPU API: a GPU backend
//! (`kvstore-cuda`) plugs in through this module. Until one does, every array or store
//! operation on a `gpu(i)` context is a typed [`Error::DeviceUnavailable`] that names
//! the context and the reason, never a panic (the `DeviceUnavailable` path of candle's
//! dummy CUDA backend, here as a runtime answer).

use crate::context::Context;
use crate::error::Error;

/// The error for a context that no registered backend serves.
pub(crate) fn unavailable(ctx: Context) -> Error {
    Error::DeviceUnavailable {
        context: ctx.to_string(),
        reason: "no GPU backend is registered in this build (GPU arrays come with \
                 kvstore-cuda); use cpu(i) contexts"
            .to_string(),
    }
}
