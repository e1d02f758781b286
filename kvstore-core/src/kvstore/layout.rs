//! `dist_sync` owners: which rank updates which elements of each key, as MXNet's
//! servers split the keys (reference §9). With [`Layout::Owners`], a key under the
//! big-array bound is owned whole by one rank, the one holding the fewest bytes when
//! the key is made (ties: the lowest rank), so that the bytes balance across the ranks
//! in the keys' order of `init`; a bigger key is split across every rank into MXNet's
//! contiguous parts. A push then sums each key's part on its owner only (a
//! reduce-scatter), the owner runs the optimizer on its part with its part of the
//! state, and every rank gets the new values (an all-gather of the parts). A pure
//! function of the keys' order, sizes, the number of ranks and the bound: every rank
//! computes the same owners, and a job restored at another number of ranks computes
//! its own.

use std::ops::Range;

use crate::error::{Error, Result};

/// How a `dist_sync` store lays out its keys' optimizer state across the ranks
/// ([`crate::KVStoreBuilder::layout`], `KVSTORE_LAYOUT`); every rank must choose the
/// same (a push's fingerprint holds it: ranks that differ fail their pushes, saying so).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// Every rank holds every key's optimizer state and runs every update.
    Replicated,
    /// Each key's optimizer state lives on its owners, which alone run its update
    /// (the values themselves stay on every rank): the default.
    #[default]
    Owners,
}

impl Layout {
    /// The layout named `name` (`owners`, `replicated`; any case).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the two.
    pub fn parse(name: &str) -> Result<Layout> {
        match name.trim().to_ascii_lowercase().as_str() {
            "owners" => Ok(Layout::Owners),
            "replicated" => Ok(Layout::Replicated),
            other => Err(Error::invalid_argument(format!(
                "layout \"{}\": expected owners or replicated",
                crate::key::shorten(other)
            ))),
        }
    }

    /// Its name, as [`Layout::parse`] takes it.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Replicated => "replicated",
            Layout::Owners => "owners",
        }
    }
}

/// A key's owners under [`Layout::Owners`], fixed when the key is made: the rank that
/// owns it whole (where it is updated whole: a small key, or a key whose update needs
/// all of it), whether it is split across every rank into MXNet's parts, and for a
/// row-sparse table whose rows live on their owners, the elements of a row (0 for
/// every other key, whose value every rank holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Owner {
    pub(super) whole: u32,
    pub(super) split: bool,
    pub(super) row_len: u32,
}

impl Owner {
    /// The owner of a store without owners: rank 0, whole.
    pub(super) const NONE: Owner = Owner { whole: 0, split: false, row_len: 0 };

    /// Whether the key is a row-sparse table whose rows live on their owners alone.
    pub(super) fn holds_rows(self) -> bool {
        self.row_len > 0
    }

    /// Each rank's elements of a key of `n` elements on `size` ranks (empty where it
    /// owns none): its part when the key is split and `in_parts` (the update may run in
    /// parts), else all of it on the whole owner. A table whose rows live on owners is
    /// split at rows, in parts or not (its values are).
    pub(super) fn ranges(self, n: usize, size: usize, in_parts: bool) -> Vec<Range<usize>> {
        if self.holds_rows() {
            let each = self.row_len as usize;
            return self.rows(n / each, size).into_iter().map(|r| r.start * each..r.end * each).collect();
        }
        if self.split && in_parts {
            return parts(n, size);
        }
        (0..size).map(|r| if r == self.whole as usize { 0..n } else { n..n }).collect()
    }

    /// Each rank's rows of a table of `rows` rows on `size` ranks: MXNet's contiguous
    /// parts of the rows when it is split, else all of them on the whole owner.
    pub(super) fn rows(self, rows: usize, size: usize) -> Vec<Range<usize>> {
        match self.split {
            true => parts(rows, size),
            false => (0..size).map(|r| if r == self.whole as usize { 0..rows } else { rows..rows }).collect(),
        }
    }
}

/// MXNet's parts of a big key of `n` elements on `size` servers: part `i` ends at
/// `round(n / size * (i + 1))`, computed in f64 as MXNet computes it
/// (`kvstore_dist.h`, `EncodeKey`).
pub(super) fn parts(n: usize, size: usize) -> Vec<Range<usize>> {
    let end = |i: usize| ((n as f64 / size as f64) * i as f64).round() as usize;
    (0..size).map(|i| end(i).min(n)..if i + 1 == size { n } else { end(i + 1).min(n) }).collect()
}

/// The bytes each rank owns so far, in the keys' order of `init`: where the next key
/// goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Balance {
    held: Vec<u64>,
}

impl Balance {
    /// The owner of the next key, of `n` elements of `bytes_each` bytes, on `size`
    /// ranks with big-array bound `bound`, and its bytes counted.
    pub(super) fn place(&mut self, n: usize, bytes_each: usize, size: usize, bound: usize) -> Owner {
        let size = size.max(1);
        self.held.resize(size.max(self.held.len()), 0);
        let held = &mut self.held[..size];
        // The first rank with the fewest bytes.
        let whole = (0..size).min_by_key(|&r| (held[r], r)).unwrap_or(0);
        let split = n >= bound && size > 1;
        if split {
            for (r, part) in parts(n, size).into_iter().enumerate() {
                held[r] += (part.len() * bytes_each) as u64;
            }
        } else {
            held[whole] += (n * bytes_each) as u64;
        }
        Owner { whole: whole as u32, split, row_len: 0 }
    }

    /// The owners of the next row-sparse table whose rows live on owners: `rows` rows of
    /// `row_len` elements (at least one, below 2^32) of `bytes_each` bytes. A table under
    /// the bound goes whole to the rank with the fewest bytes (MXNet: one server); a
    /// bigger one is split at rows into MXNet's parts, each rank counted for its rows.
    pub(super) fn place_rows(
        &mut self,
        rows: usize,
        row_len: u32,
        bytes_each: usize,
        size: usize,
        bound: usize,
    ) -> Owner {
        let size = size.max(1);
        self.held.resize(size.max(self.held.len()), 0);
        let held = &mut self.held[..size];
        let whole = (0..size).min_by_key(|&r| (held[r], r)).unwrap_or(0);
        let row_bytes = row_len as usize * bytes_each;
        let owner = Owner { whole: whole as u32, split: rows * row_len as usize >= bound && size > 1, row_len };
        for (r, part) in owner.rows(rows, size).into_iter().enumerate() {
            held[r] += (part.len() * row_bytes) as u64;
        }
        owner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MXNet's formula, as its servers split a key (reference §9).
    fn mxnet_part(n: usize, s: usize, i: usize) -> usize {
        let r = |i: usize| (n as f64 / s as f64 * i as f64).round() as usize;
        r(i + 1) - r(i)
    }

    #[test]
    fn big_keys_split_as_mxnets_servers_split_them() {
        for n in [1_000_000, 1_000_001, 1_440_000, 7_777_777, 10_000_019] {
            for s in 1..=9 {
                let p = parts(n, s);
                assert_eq!(p.len(), s);
                assert_eq!((p[0].start, p[s - 1].end), (0, n), "{n} on {s}");
                for (i, r) in p.iter().enumerate() {
                    assert_eq!(r.len(), mxnet_part(n, s, i), "{n} on {s}, part {i}");
                    if i > 0 {
                        assert_eq!(r.start, p[i - 1].end, "contiguous");
                    }
                }
            }
        }
        // A part at an odd place: 1001 on 3 is 334, 333, 334.
        assert_eq!(parts(1001, 3), vec![0..334, 334..667, 667..1001]);
    }

    #[test]
    fn small_keys_go_to_the_rank_with_the_fewest_bytes_in_init_order() {
        let mut b = Balance::default();
        let placed: Vec<u32> = [10, 10, 10, 5, 30, 1].iter().map(|&n| b.place(n, 4, 3, 100).whole).collect();
        // 10 -> 0, 10 -> 1, 10 -> 2, 5 -> 0 (ties: lowest), 30 -> 1 (0 holds 60 bytes),
        // 1 -> 2.
        assert_eq!(placed, vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(b.held, vec![60, 160, 44]);
        // A big key is split, every rank counted for its part.
        let big = b.place(300, 4, 3, 100);
        assert_eq!(big, Owner { whole: 2, split: true, row_len: 0 });
        assert_eq!(b.held, vec![460, 560, 444]);
        // One rank: whole, never split.
        assert_eq!(Balance::default().place(10_000_000, 4, 1, 100), Owner::NONE);
    }

    #[test]
    fn ranges_say_each_ranks_elements() {
        let split = Owner { whole: 1, split: true, row_len: 0 };
        assert_eq!(split.ranges(10, 3, true), vec![0..3, 3..7, 7..10]);
        assert_eq!(split.ranges(10, 3, false), vec![10..10, 0..10, 10..10]);
        assert_eq!(Owner { whole: 2, split: false, row_len: 0 }.ranges(4, 3, true), vec![4..4, 4..4, 0..4]);
        // A table of 10 rows of 3 whose rows live on owners: split at rows, in parts
        // or not; whole on its owner under the bound.
        let rows = Owner { whole: 0, split: true, row_len: 3 };
        assert_eq!(rows.rows(10, 3), vec![0..3, 3..7, 7..10]);
        assert_eq!(rows.ranges(30, 3, false), vec![0..9, 9..21, 21..30]);
        let whole = Owner { whole: 1, split: false, row_len: 3 };
        assert_eq!(whole.ranges(30, 3, true), vec![30..30, 0..30, 30..30]);
    }

    #[test]
    fn tables_are_placed_by_rows() {
        let mut b = Balance::default();
        // 100 rows of 4 f32 at bound 1000: whole, on rank 0.
        assert_eq!(b.place_rows(100, 4, 4, 3, 1000), Owner { whole: 0, split: false, row_len: 4 });
        // 1000 rows of 4: split 333, 334, 333 rows (MXNet's parts of the rows).
        assert_eq!(b.place_rows(1000, 4, 4, 3, 1000), Owner { whole: 1, split: true, row_len: 4 });
        assert_eq!(b.held, vec![1600 + 333 * 16, 334 * 16, 333 * 16]);
    }

    #[test]
    fn layouts_parse_by_name() {
        assert_eq!(Layout::parse(" Owners ").ok(), Some(Layout::Owners));
        assert_eq!(Layout::parse("replicated").ok(), Some(Layout::Replicated));
        let e = Layout::parse("sharded").unwrap_err();
        assert!(e.to_string().contains("expected owners or replicated"), "{e}");
    }
}
