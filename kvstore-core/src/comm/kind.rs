//! Store kinds: the names `KVStore::create` takes, and the `Comm` each kind gets. A new
//! way of moving data (NCCL) is a kind here and a `Comm` beside `CommCpu` and
//! `CommDevice`; the store itself does not change.

use super::{Comm, CommCpu, CommDevice};
use crate::error::{Error, Result};

/// A kind of store, by the name given to [`KVStore::create`](crate::KVStore::create):
/// it decides the store's [`Comm`] and whether the store spans processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreKind {
    /// `local`: reduce on the host.
    Local,
    /// `device`: reduce on the devices of the pushed values; on CPU contexts the same
    /// as `local`.
    Device,
    /// `dist_sync`: reduce locally, then sum across the workers of a [`Collective`](crate::backend::Collective).
    Dist,
    /// `dist_sync_device` (MXNet's other spelling `dist_device_sync`): as `dist_sync`, but
    /// each worker reduces its values on their devices first, as `device` does.
    DistDevice,
    /// `dist_async`: each key's owner applies every push as it arrives (`Remote`).
    DistAsync,
    /// `dist_async_device`: as `dist_async`, each worker summing its values on their
    /// devices first.
    DistAsyncDevice,
}

/// The kinds a store can be, as the README lists them (`dist_sync` with a worker
/// group); MXNet's other spellings of them are accepted too (see [`StoreKind::parse`]).
const SUPPORTED: [&str; 4] = ["local", "device", "dist_sync", "dist_async"];

impl StoreKind {
    /// The kind a name stands for (case-insensitive; MXNet's spellings too).
    pub(crate) fn parse(name: &str) -> Result<Self> {
        let lower = name.to_ascii_lowercase();
        match lower.as_str() {
            // MXNet's spellings of a local store.
            "local" | "local_update_cpu" | "local_allreduce_cpu" => Ok(StoreKind::Local),
            "device" | "local_allreduce_device" => Ok(StoreKind::Device),
            // MXNet's synchronous spellings; `_async` ones are not synchronous.
            "dist_sync" | "dist" => Ok(StoreKind::Dist),
            "dist_sync_device" | "dist_device_sync" => Ok(StoreKind::DistDevice),
            "dist_async" => Ok(StoreKind::DistAsync),
            "dist_async_device" | "dist_device_async" => Ok(StoreKind::DistAsyncDevice),
            _ if lower.contains("dist") || lower.contains("nccl") => Err(Error::Unsupported {
                what: format!("store kind \"{}\"", crate::key::shorten(&lower)),
                hint: format!(
                    "the supported kinds are {} (dist_sync and dist_async run over MPI with kvstore-mpi)",
                    SUPPORTED.join(", ")
                ),
            }),
            _ => {
                Err(Error::UnknownStoreKind { kind: crate::key::shorten(name).into_owned(), known: SUPPORTED.to_vec() })
            }
        }
    }

    /// Whether stores of this kind sum across the processes of a job (they need a
    /// worker group).
    pub(crate) fn spans_processes(self) -> bool {
        matches!(self, StoreKind::Dist | StoreKind::DistDevice)
    }

    /// Whether stores of this kind may keep each key's optimizer state on its owners
    /// (`dist_sync`; `dist_sync_device` keeps replicas on the devices).
    pub(crate) fn may_have_owners(self) -> bool {
        self == StoreKind::Dist
    }

    /// Whether stores of this kind apply pushes on each key's owner as they arrive
    /// (they need a `Remote`).
    pub(crate) fn is_async(self) -> bool {
        matches!(self, StoreKind::DistAsync | StoreKind::DistAsyncDevice)
    }

    /// The `Comm` of a store of this kind: `threads` 0 for the shared host pool.
    pub(crate) fn comm(self, threads: usize) -> Result<Box<dyn Comm>> {
        Ok(match self {
            StoreKind::Local => Box::new(CommCpu::new(threads)?),
            StoreKind::Device => Box::new(CommDevice::new(threads)?),
            // Workers sum their values where they are, then across the job.
            StoreKind::Dist => Box::new(CommCpu::new(threads)?.without_host_staging()),
            // Each worker sums its values on their devices, then across the job.
            StoreKind::DistDevice | StoreKind::DistAsyncDevice => Box::new(CommDevice::new(threads)?),
            StoreKind::DistAsync => Box::new(CommCpu::new(threads)?.without_host_staging()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_kinds_the_readme_lists_and_promise_nothing() {
        let unknown = StoreKind::parse("horovod").expect_err("unknown").to_string();
        assert!(unknown.ends_with("known kinds are local, device, dist_sync, dist_async"), "{unknown}");
        let unsupported = StoreKind::parse("nccl").expect_err("unsupported").to_string();
        assert!(unsupported.contains("the supported kinds are local, device, dist_sync, dist_async"), "{unsupported}");
        assert!(!unsupported.contains("will come"), "{unsupported}");
        for alias in ["local_update_cpu", "local_allreduce_cpu", "local_allreduce_device", "dist", "dist_device_sync"] {
            assert!(StoreKind::parse(alias).is_ok(), "{alias}");
        }
    }
}
