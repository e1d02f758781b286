//! Waiting in a loop for another thread, as crossbeam's `Backoff::snooze` does, in a
//! few lines instead of a dependency.

/// A wait loop's pause: the first `spins` calls of [`Backoff::snooze`] spin once
/// (`std::hint::spin_loop`), later ones yield the core (`std::thread::yield_now`).
/// Unlike crossbeam's, the spins do not grow: a loop waits as it did by hand.
pub(crate) struct Backoff {
    /// Spins left before the pauses yield.
    spins: u32,
}

impl Backoff {
    /// Spins `spins` times, then yields.
    pub(crate) const fn new(spins: u32) -> Self {
        Backoff { spins }
    }

    /// Yields every time: for waits on threads that may need this core.
    pub(crate) const fn yielding() -> Self {
        Self::new(0)
    }

    /// One pause of the loop.
    pub(crate) fn snooze(&mut self) {
        if self.spins > 0 {
            self.spins -= 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Backoff;

    #[test]
    fn a_backoff_spins_as_many_times_as_asked_then_yields() {
        let mut b = Backoff::new(3);
        for left in (1..=3).rev() {
            assert_eq!(b.spins, left);
            b.snooze();
        }
        for _ in 0..3 {
            b.snooze();
            assert_eq!(b.spins, 0, "yields from then on");
        }
        assert_eq!(Backoff::yielding().spins, 0);
    }
}
