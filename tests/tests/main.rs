//! The workspace's one integration-test binary: conformance cases against the CPU
//! backend, the deliberate differences from MXNet, the error contract, golden cases
//! recorded from MXNet 1.9.1, property tests against a reference model, and
//! concurrency.

mod concurrency;
mod conformance_cpu;
mod differences;
mod dist;
mod errors;
mod golden;
mod optimizer_states;
mod optimizers;
mod properties;
