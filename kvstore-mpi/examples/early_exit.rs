//! A worker that dies mid-job: rank 1 exits while rank 0 waits in a push for its sum.
//! MPI is fail-stop: `mpirun` must end the whole job within seconds, never hang.
//! `scripts/test-mpi.sh` runs it with `mpirun -np 2` and checks both.

use kvstore_core::NDArray;

fn main() -> kvstore_core::Result<()> {
    let kv = kvstore_mpi::create("dist_sync")?;
    kv.init("w", &NDArray::zeros(&[4])?)?;
    if kv.rank() == 1 {
        eprintln!("rank 1: exiting without pushing");
        std::process::exit(3);
    }
    kv.push("w", &NDArray::ones(&[4])?, 0)?;
    eprintln!("rank {}: the push returned although a peer had died", kv.rank());
    kvstore_mpi::finalize()
}
