//! Updaters for tests: updaters that log their calls ([`CallLog`]), and gates that
//! hold an updater, and so the calls queued behind it, until a test opens them ([`Gate`]).

use std::sync::{Arc, Mutex};

use kvstore_core::{KVStore, Key, NDArray, Result};

/// A log of updater calls: (key, index, first element of the merged value).
pub type CallLog = Arc<Mutex<Vec<(String, usize, f64)>>>;

/// Installs an updater that logs each call's key, index and the first element of the
/// merged value, then merges with `merge(merged, stored)`.
fn install_logging(kv: &KVStore, merge: fn(&NDArray, &NDArray) -> Result<()>) -> CallLog {
    let log: CallLog = Arc::default();
    let l = Arc::clone(&log);
    kv.set_updater(move |key: &Key, index: usize, merged: &NDArray, stored: &NDArray| -> Result<()> {
        let first = merged.to_f64_vec()?.first().copied().unwrap_or(0.0);
        l.lock().expect("log").push((key.to_string(), index, first));
        merge(merged, stored)
    })
    .expect("install the updater");
    log
}

/// A gate that calls can be held at until a test opens it.
pub type Gate = Arc<(Mutex<bool>, std::sync::Condvar)>;

/// Waits (at most 10 s) until `gate` is opened.
pub fn wait_at(gate: &Gate) {
    let open = gate.0.lock().expect("gate");
    drop(gate.1.wait_timeout_while(open, std::time::Duration::from_secs(10), |open| !*open).expect("gate"));
}

/// Opens `gate`.
pub fn open(gate: &Gate) {
    *gate.0.lock().expect("gate") = true;
    gate.1.notify_all();
}

/// Opens `gate` from another thread after `ms` milliseconds.
pub fn open_later(gate: &Gate, ms: u64) -> std::thread::JoinHandle<()> {
    let gate = Arc::clone(gate);
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(ms));
        open(&gate);
    })
}

/// Installs an assigning updater that waits (at most 10 s) until the returned gate is
/// opened ([`open`]): keeps calls queued for as long as a test needs.
pub fn gated_assign(kv: &KVStore) -> Gate {
    let gate: Gate = Arc::default();
    let g = Arc::clone(&gate);
    kv.set_updater(move |_: &Key, _, merged: &NDArray, stored: &NDArray| {
        wait_at(&g);
        stored.copy_from(merged)
    })
    .expect("install the updater");
    gate
}

/// Installs the tutorial's updater `stored += 2 * input`, logging each call.
pub fn install_add_twice(kv: &KVStore) -> CallLog {
    install_logging(kv, |merged, stored| stored.add_assign(&merged.mul(2.0)?))
}

/// Installs an updater that logs each call and assigns (MXNet's default behaviour).
pub fn install_logging_assign(kv: &KVStore) -> CallLog {
    install_logging(kv, |merged, stored| stored.copy_from(merged))
}
