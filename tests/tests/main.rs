//! The workspace's one integration-test binary: conformance cases against the CPU
//! backend, the deliberate differences from MXNet, the error contract, golden cases
//! recorded from MXNet 1.9.1, property tests against a reference model, and
//! concurrency.

mod checkpoint;
mod compression;
mod concurrency;
mod differences;
mod dist;
mod dist_async;
mod errors;
mod foreign;
mod fusion;
mod golden;
mod hostile;
mod nonblocking;
mod optimizer_states;
mod optimizers;
mod owners;
mod row_sparse;
mod seam;
mod shared_arrays;
mod structure;
mod tables;

// The shared conformance cases of the reference (§10) and the property tests against the
// reference model, on `cpu(i)` contexts: one test per shared function, by its name
// (`cpu::case_01_init_then_pull`, `cpu::random_call_sequences_agree_with_the_model`, ...).
kvstore_tests::backend_tests!(cpu = kvstore_tests::Cpu; cases, properties);
