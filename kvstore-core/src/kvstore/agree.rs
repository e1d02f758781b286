//! Agreement across the ranks. Wherever every rank of a job must decide alike (is it
//! the same call, did the updater fail somewhere, did every rank read the same
//! checkpoint, did rank 0 reach the keys' owners), each rank says a small record and
//! reads every rank's, in rank order ([`Said`]); every rank then finds the same ranks
//! in the same groups and builds the same message ([`ranks`], [`by_value`]). What a
//! record holds is its caller's; how records are said, read and compared is here.

use crate::backend::Collective;
use crate::error::Result;

/// Every rank's record at one point of agreement, in rank order.
pub struct Said(Vec<Vec<u8>>);

impl Said {
    /// Every rank's record at `step` (`mine` on this rank), by one exchange of `group`:
    /// a rank that never arrives is named by the group after its timeout.
    pub fn exchange(group: &dyn Collective, step: &str, mine: &[u8]) -> Result<Said> {
        group.exchange(step, mine).map(Said)
    }

    /// The records another transport exchanged (a `dist_async` store's owners).
    pub fn of(records: Vec<Vec<u8>>) -> Said {
        Said(records)
    }

    /// The number of ranks.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no rank said anything (a group of none).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every rank's record, in rank order.
    pub fn records(&self) -> impl Iterator<Item = &[u8]> {
        self.0.iter().map(Vec::as_slice)
    }

    /// The little-endian word at byte `at` of rank `r`'s record (0 where it is short).
    pub fn word(&self, r: usize, at: usize) -> u64 {
        word(&self.0[r], at)
    }

    /// The byte at `at` of rank `r`'s record (0 where it is short).
    pub fn byte(&self, r: usize, at: usize) -> u8 {
        self.0[r].get(at).copied().unwrap_or(0)
    }

    /// The text from byte `at` of rank `r`'s record to its first NUL (as `padded`
    /// wrote it).
    pub fn text(&self, r: usize, at: usize) -> String {
        let t = self.0[r].get(at..).unwrap_or_default();
        String::from_utf8_lossy(&t[..t.iter().position(|&b| b == 0).unwrap_or(t.len())]).into_owned()
    }

    /// The ranks whose records `f` holds for.
    pub fn ranks_where(&self, f: impl Fn(&[u8]) -> bool) -> Vec<usize> {
        (0..self.0.len()).filter(|&r| f(&self.0[r])).collect()
    }

    /// The ranks whose word at byte `at` has `bit` set.
    pub fn with_bit(&self, at: usize, bit: u64) -> Vec<usize> {
        self.ranks_where(|r| word(r, at) & bit != 0)
    }
}

/// The little-endian word at byte `at` of `record` (0 where it is short).
pub fn word(record: &[u8], at: usize) -> u64 {
    record.get(at..at + 8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes)
}

/// `text` as a record's part of `len` bytes: NUL-padded (cut where longer).
pub fn padded(text: &str, len: usize) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    bytes.resize(len, 0);
    bytes
}

/// `rank 2`, or `ranks 0, 3`: how a message names ranks.
pub fn ranks(list: &[usize]) -> String {
    let names: Vec<String> = list.iter().map(usize::to_string).collect();
    format!("{} {}", if list.len() == 1 { "rank" } else { "ranks" }, names.join(", "))
}

/// The distinct values of `items`, in order of first appearance, each with the
/// positions (ranks) that hold it.
pub fn by_value<T: PartialEq>(items: impl IntoIterator<Item = T>) -> Vec<(T, Vec<usize>)> {
    let mut groups: Vec<(T, Vec<usize>)> = Vec::new();
    for (r, item) in items.into_iter().enumerate() {
        match groups.iter_mut().find(|(g, _)| *g == item) {
            Some((_, list)) => list.push(r),
            None => groups.push((item, vec![r])),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_as_they_were_said() {
        let mut a = 5u64.to_le_bytes().to_vec();
        a.extend(padded("rank 0's", 12));
        let b = 2u64.to_le_bytes().to_vec();
        let said = Said::of(vec![a, b, vec![]]);
        assert_eq!((said.word(0, 0), said.word(1, 0), said.word(2, 0)), (5, 2, 0));
        assert_eq!((said.text(0, 8), said.text(1, 8)), ("rank 0's".to_string(), String::new()));
        assert_eq!(said.with_bit(0, 1), [0]);
        assert_eq!(said.with_bit(0, 2), [1]);
        assert_eq!((said.byte(0, 8), said.byte(2, 3)), (b'r', 0));
        assert_eq!(padded("abc", 2), b"ab");
        assert_eq!(ranks(&[2]), "rank 2");
        assert_eq!(ranks(&[0, 3]), "ranks 0, 3");
        assert_eq!(by_value([7, 8, 7]), vec![(7, vec![0, 2]), (8, vec![1])]);
    }
}
