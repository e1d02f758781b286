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
mod hostile;
mod optimizer_states;
mod optimizers;
mod properties;

/// The property tests run on `cpu(i)` contexts here.
fn property_devices() -> Option<u32> {
    Some(0)
}
