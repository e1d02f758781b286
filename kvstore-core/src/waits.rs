//! Waits of an engine's own threads for other engines' calls, kept free of cycles.
//!
//! An array's queued reads and writes may belong to another store's engine than the
//! call or the user code (an updater, an `on_done` callback) that touches it on an
//! engine's thread; that thread then waits for the other engine's calls. Each such wait
//! is an edge "engine A waits for engine B" here, and a wait that would close a cycle
//! (B, or an engine B waits for, waits for A; or A waits for itself) fails instead:
//! each engine's calls would otherwise wait for threads that wait for them. Threads
//! that are no engine's workers (the callers' threads) wait freely: no engine waits
//! for them.

use parking_lot::Mutex;

use crate::engine;
use crate::error::{Error, Result};

/// The waits under way, as (waiting engine, engine waited for), one per waiting thread.
static EDGES: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// A wait of this thread for engine `on`'s calls, registered until dropped.
pub(crate) struct Waiting {
    edge: Option<(usize, usize)>,
}

/// Registers that the current thread is about to wait for calls of engine `on`.
///
/// # Errors
/// [`Error::InvalidArgument`], saying `what` waits, when the thread is a worker of an
/// engine that `on` waits for (directly or through other engines), or of `on` itself:
/// the wait could never end.
pub(crate) fn wait_for(on: usize, what: impl FnOnce() -> String) -> Result<Waiting> {
    let me = engine::current_worker();
    if me == 0 {
        return Ok(Waiting { edge: None });
    }
    let mut edges = EDGES.lock();
    let mut seen = Vec::new();
    let mut next = vec![on];
    while let Some(e) = next.pop() {
        if e == me {
            return Err(Error::invalid_argument(format!(
                "{}: it waits for calls of a store's engine that waits for this thread's own engine (or is it), \
                 from one of that engine's threads (an updater or an on_done callback), and would wait for ever; \
                 wait for those calls on another thread first",
                what()
            )));
        }
        if !seen.contains(&e) {
            seen.push(e);
            next.extend(edges.iter().filter(|(from, _)| *from == e).map(|&(_, to)| to));
        }
    }
    edges.push((me, on));
    Ok(Waiting { edge: Some((me, on)) })
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(edge) = self.edge {
            let mut edges = EDGES.lock();
            if let Some(i) = edges.iter().position(|e| *e == edge) {
                edges.swap_remove(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_that_closes_a_cycle_of_engines_fails_and_others_go_on() {
        // Other threads wait freely.
        assert!(wait_for(7, String::new).unwrap().edge.is_none());
        let (a, b, c) = (1001, 1002, 1003);
        let on = |me: usize, on: usize| {
            engine::set_current_worker(me);
            let w = wait_for(on, || "the test's read".into());
            engine::set_current_worker(0);
            w
        };
        let ab = on(a, b).unwrap();
        let bc = on(b, c).unwrap();
        let err = on(c, a).err().expect("c -> a closes a -> b -> c");
        assert!(err.to_string().contains("the test's read"), "{err}");
        assert!(on(a, a).is_err(), "an engine's thread waiting for its own engine");
        // b waits on c once more from a second thread: fine, and c -> a stays refused
        // until both of b's waits end.
        let bc2 = on(b, c).unwrap();
        drop(ab);
        assert!(on(c, a).is_ok());
        drop((bc, bc2));
        assert!(EDGES.lock().iter().all(|&(from, _)| ![a, b, c].contains(&from)));
    }
}
