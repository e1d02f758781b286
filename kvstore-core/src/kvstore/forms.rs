//! The forms a call's keys and arrays come in (MXNet's: one key or a list; one array,
//! a list, or a list per key), paired into runs: one key of the call with its arrays,
//! as the caller gave them. Every call of a store starts here.

use crate::error::{Error, Result};
use crate::key::{Key, Keys};
use crate::ndarray::{NDArray, RowSparse};

/// Values or outs of a call: one array, a list, or a list of lists (one list per key);
/// or the reason its caller could not give them.
#[derive(Clone, Copy)]
pub enum Values<'a> {
    /// One array.
    One(&'a NDArray),
    /// A list of arrays: all for the one key, or one per key.
    Many(&'a [NDArray]),
    /// One list of arrays per key: `push([k1, k2], [[a, b], [c]])`.
    Nested(&'a [Vec<NDArray>]),
    /// No arrays: the caller refused its own arguments (a binding given an argument it
    /// could not turn into arrays: a closed Java array, a Python object that is no
    /// array). The call fails with this error as it fails for arguments it refuses
    /// itself: under `dist_sync` a push, pushpull, init or broadcast still takes its
    /// step, as this worker's refusal, so every worker fails it, changes nothing, and
    /// the workers' next calls stay matched (made on one worker only, the others' next
    /// call would meet it). The keys are not read.
    Refused(&'a Error),
}

impl Values<'_> {
    /// Whether these are no arrays at all (an empty list, or only empty lists): pushed,
    /// they push nothing (a pushpull of them is a pull).
    pub(crate) fn are_none(self) -> bool {
        match self {
            Values::Many(vs) => vs.is_empty(),
            Values::Nested(vss) => vss.iter().all(Vec::is_empty),
            Values::One(_) | Values::Refused(_) => false,
        }
    }
}

impl<'a> From<&'a Result<Vec<NDArray>>> for Values<'a> {
    /// A list of arrays, or why the caller has none ([`Values::Refused`]).
    fn from(arrays: &'a Result<Vec<NDArray>>) -> Self {
        match arrays {
            Ok(a) => Values::Many(a),
            Err(e) => Values::Refused(e),
        }
    }
}

impl<'a> From<&'a NDArray> for Values<'a> {
    fn from(a: &'a NDArray) -> Self {
        Values::One(a)
    }
}

impl<'a> From<&'a [NDArray]> for Values<'a> {
    fn from(a: &'a [NDArray]) -> Self {
        Values::Many(a)
    }
}

impl<'a, const N: usize> From<&'a [NDArray; N]> for Values<'a> {
    fn from(a: &'a [NDArray; N]) -> Self {
        Values::Many(a)
    }
}

impl<'a> From<&'a Vec<NDArray>> for Values<'a> {
    fn from(a: &'a Vec<NDArray>) -> Self {
        Values::Many(a)
    }
}

impl<'a> From<&'a [Vec<NDArray>]> for Values<'a> {
    fn from(a: &'a [Vec<NDArray>]) -> Self {
        Values::Nested(a)
    }
}

impl<'a, const N: usize> From<&'a [Vec<NDArray>; N]> for Values<'a> {
    fn from(a: &'a [Vec<NDArray>; N]) -> Self {
        Values::Nested(a)
    }
}

impl<'a> From<&'a Vec<Vec<NDArray>>> for Values<'a> {
    fn from(a: &'a Vec<Vec<NDArray>>) -> Self {
        Values::Nested(a)
    }
}

/// The values of a row-sparse push ([`crate::KVStore::push_row_sparse_many`]): each key
/// with its row-sparse values; or, as [`Values::Refused`], the reason its caller could
/// not give them (the call fails with it, on every worker under `dist_sync`).
#[derive(Clone, Copy)]
pub enum RowSparsePushes<'a> {
    /// Each key with its values (a key given twice has its values summed).
    Given(&'a [(Key, Vec<RowSparse>)]),
    /// No values: the caller refused its own arguments.
    Refused(&'a Error),
}

impl<'a> From<&'a [(Key, Vec<RowSparse>)]> for RowSparsePushes<'a> {
    fn from(pushes: &'a [(Key, Vec<RowSparse>)]) -> Self {
        RowSparsePushes::Given(pushes)
    }
}

impl<'a, const N: usize> From<&'a [(Key, Vec<RowSparse>); N]> for RowSparsePushes<'a> {
    fn from(pushes: &'a [(Key, Vec<RowSparse>); N]) -> Self {
        RowSparsePushes::Given(pushes)
    }
}

impl<'a> From<&'a Vec<(Key, Vec<RowSparse>)>> for RowSparsePushes<'a> {
    fn from(pushes: &'a Vec<(Key, Vec<RowSparse>)>) -> Self {
        RowSparsePushes::Given(pushes)
    }
}

impl<'a> From<&'a Result<Vec<(Key, Vec<RowSparse>)>>> for RowSparsePushes<'a> {
    /// The pushes, or why the caller has none ([`RowSparsePushes::Refused`]).
    fn from(pushes: &'a Result<Vec<(Key, Vec<RowSparse>)>>) -> Self {
        match pushes {
            Ok(p) => RowSparsePushes::Given(p),
            Err(e) => RowSparsePushes::Refused(e),
        }
    }
}

/// One key of a call with its arrays in call order, as the caller's slice (one array,
/// a list, or a key's list of a list of lists): pairing a call's keys with their
/// arrays copies no array handle, only slices.
pub(crate) type Run<'a> = (Key, &'a [NDArray]);

/// Pairs each key with its values, following MXNet's flattening rules: a run per key
/// as given (a key given twice has two runs; a key with an empty list, none).
pub(crate) fn runs<'a>(op: &'static str, keys: Keys, values: Values<'a>, what: &'static str) -> Result<Vec<Run<'a>>> {
    let mismatch = |expected: usize, got: usize| Error::LengthMismatch {
        context: format!("{op}: {expected} keys"),
        what,
        expected,
        got,
    };
    let one = std::slice::from_ref;
    match (keys, values) {
        (_, Values::Refused(e)) => Err(e.clone()),
        (Keys::One(k), Values::One(v)) => Ok(vec![(k, one(v))]),
        (Keys::One(_), Values::Many([])) => Ok(Vec::new()),
        (Keys::One(k), Values::Many(vs)) => Ok(vec![(k, vs)]),
        (Keys::One(k), Values::Nested(_)) => Err(Error::invalid_argument(format!(
            "{op}: key \"{k}\" takes one array or a list of arrays, not a list of lists"
        ))),
        (Keys::Many(ks), Values::One(v)) if ks.len() == 1 => Ok(ks.into_iter().map(|k| (k, one(v))).collect()),
        (Keys::Many(ks), Values::One(_)) => Err(mismatch(ks.len(), 1)),
        (Keys::Many(ks), Values::Many(vs)) if ks.len() == vs.len() => Ok(paired(&ks, vs.iter().map(one))),
        (Keys::Many(ks), Values::Many(vs)) => Err(mismatch(ks.len(), vs.len())),
        (Keys::Many(ks), Values::Nested(vss)) if ks.len() == vss.len() => match vss.iter().all(|vs| !vs.is_empty()) {
            true => Ok(paired(&ks, vss.iter().map(|vs| &vs[..]))),
            false => {
                Ok(ks.iter().zip(vss).filter(|(_, vs)| !vs.is_empty()).map(|(k, vs)| (k.clone(), &vs[..])).collect())
            }
        },
        (Keys::Many(ks), Values::Nested(vss)) => Err(mismatch(ks.len(), vss.len())),
    }
}

/// Each key with its arrays, in one pass of a known length. A short key's clone is a
/// copy: 2 µs for 1000 keys, where moving them out of their list (`into_iter`) took
/// 11 µs, and a filter in the pass (a length not known) 16 µs.
fn paired<'a>(keys: &[Key], arrays: impl ExactSizeIterator<Item = &'a [NDArray]>) -> Vec<Run<'a>> {
    keys.iter().cloned().zip(arrays).collect()
}

/// [`runs`] as one pair per array.
pub(crate) fn flatten<'a>(
    op: &'static str,
    keys: Keys,
    values: Values<'a>,
    what: &'static str,
) -> Result<Vec<(Key, &'a NDArray)>> {
    Ok(pairs_of(runs(op, keys, values, what)?))
}

/// One pair per array of `runs`.
pub(crate) fn pairs_of(runs: Vec<Run<'_>>) -> Vec<(Key, &NDArray)> {
    runs.into_iter().flat_map(|(k, vs)| vs.iter().map(move |v| (k.clone(), v))).collect()
}

/// The value runs and the out runs of a flat call (`*_pairs`).
pub(crate) type FlatRuns<'a> = (Vec<Run<'a>>, Vec<Run<'a>>);

pub(crate) fn flat_runs<'a>(
    op: &'static str,
    keys: &[Key],
    values: Values<'a>,
    out_keys: &[Key],
    outs: Values<'a>,
) -> Result<FlatRuns<'a>> {
    Ok((runs(op, Keys::Many(keys.to_vec()), values, "values")?, runs(op, Keys::Many(out_keys.to_vec()), outs, "outs")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_keep_each_key_with_its_arrays_in_call_order() {
        let a: Vec<NDArray> = (0..4).map(|i| NDArray::full(&[1], i as f64).unwrap()).collect();
        let shape = |rs: &[Run<'_>]| -> Vec<(String, Vec<f32>)> {
            rs.iter()
                .map(|(k, vs)| (k.to_string(), vs.iter().map(|v| v.to_vec::<f32>().unwrap()[0]).collect()))
                .collect()
        };
        let one = runs("push", Keys::from("w"), Values::Many(&a[..3]), "values").unwrap();
        assert_eq!(shape(&one), [("w".into(), vec![0.0, 1.0, 2.0])]);
        let nested = [vec![a[0].clone(), a[1].clone()], vec![], vec![a[3].clone()]];
        let rs = runs("push", Keys::from(&["x", "y", "x"]), Values::Nested(&nested), "values").unwrap();
        assert_eq!(shape(&rs), [("x".into(), vec![0.0, 1.0]), ("x".into(), vec![3.0])]);
        let flat = flatten("push", Keys::from(&["x", "y", "x"]), Values::Nested(&nested), "values").unwrap();
        assert_eq!(flat.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["x", "x", "x"]);
        assert!(runs("push", Keys::from("w"), Values::Many(&[]), "values").unwrap().is_empty());
        let e = runs("push", Keys::from(&["x", "y"]), Values::Many(&a[..3]), "values").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::LengthMismatch);
        let refusal = Error::Disposed { what: "NDArray" };
        let e = runs("push", Keys::from(&["x", "y"]), Values::Refused(&refusal), "values").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Disposed);
        let given: Result<Vec<NDArray>> = Err(refusal.clone());
        assert!(matches!(Values::from(&given), Values::Refused(Error::Disposed { .. })));
    }
}
