//! kvstore-commit's settings: the environment variables the commits read, each where the
//! thing it sets starts (a store's folder, when the store is made). The table of
//! `docs/configuration.md` lists them, and which ranks must agree on each.

use std::path::PathBuf;

use kvstore_core::{Error, Result};

/// The environment variable that names a job (its restarts share it).
pub const JOB_VAR: &str = "KVSTORE_JOB";
/// The environment variable that names the folder of the jobs' commits (default
/// `/dev/shm`).
pub const COMMIT_DIR_VAR: &str = "KVSTORE_COMMIT_DIR";

/// The job's name, when `KVSTORE_JOB` gives one (see [`crate::job_folder`]).
pub(crate) fn job() -> Result<Option<String>> {
    let Some(name) = std::env::var_os(JOB_VAR).filter(|n| !n.is_empty()) else { return Ok(None) };
    let name = name.to_string_lossy().into_owned();
    check_job(&name)?;
    Ok(Some(name))
}

/// A job's name is a folder's: 1 to 64 letters, digits, `.`, `_` and `-`, not first `.`.
pub(crate) fn check_job(name: &str) -> Result<()> {
    let fits = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !name.starts_with('.');
    match fits {
        true => Ok(()),
        false => Err(Error::invalid_argument(format!(
            "{JOB_VAR}={name:?}: a job's name is 1 to 64 letters, digits, '.', '_' or '-' (not first '.')"
        ))),
    }
}

/// The folder the jobs' folders live in (`KVSTORE_COMMIT_DIR`, default `/dev/shm`).
pub(crate) fn commit_dir() -> PathBuf {
    std::env::var_os(COMMIT_DIR_VAR).filter(|d| !d.is_empty()).map_or_else(|| PathBuf::from("/dev/shm"), PathBuf::from)
}

/// This process's rank as its launcher gives it (Open MPI, PMIx, PMI, Slurm), 0 without.
pub(crate) fn launcher_rank() -> u64 {
    ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
        .unwrap_or(0)
}
