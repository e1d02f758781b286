//! Keys, and the forms of a call's keys and arrays. A key is a string; an integer key
//! is its decimal string, so `3` and `"3"` are the same key (MXNet kept int and string
//! keys apart and refused to mix them). A call takes one key or a list ([`Keys`]) and
//! one array, a list or a list per key ([`Values`]); `flatten` pairs them by MXNet's
//! rules.

use std::borrow::{Borrow, Cow};
use std::fmt;

use crate::error::{Error, Result};
use crate::ndarray::NDArray;

use smol_str::{SmolStr, ToSmolStr};

/// A key of the store: a cheaply clonable string. Keys of up to 23 bytes (nearly all
/// parameter names) are held inline: making one allocates nothing, and comparing one
/// reads no other memory, which is what a call with many keys spends its time on.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(SmolStr);

impl Key {
    /// The key as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Strings longer than this many bytes are shortened in messages.
const SHOWN_BYTES: usize = 128;

/// `s` for a message: whole when short, else its start, an ellipsis and its length
/// (`aaaa…(1048576 bytes)`), so that a megabyte key or name never fills a message.
pub fn shorten(s: &str) -> Cow<'_, str> {
    if s.len() <= SHOWN_BYTES {
        return Cow::Borrowed(s);
    }
    let mut end = SHOWN_BYTES / 2;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…({} bytes)", &s[..end], s.len()))
}

/// Shows the key as messages do: whole up to 128 bytes, else shortened (see
/// [`shorten`]). [`Key::as_str`] is the whole key.
impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&shorten(&self.0))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Borrow<str> for Key {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Key {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Self {
        // The inline form copied byte by byte: for short keys, a quarter of the time
        // `SmolStr::new` takes (which calls `memcpy` for them).
        match s.len() <= SmolStr::INLINE_CAP {
            true => Key(SmolStr::new_inline(s)),
            false => Key(SmolStr::new(s)),
        }
    }
}

impl From<&&str> for Key {
    fn from(s: &&str) -> Self {
        Key(SmolStr::new(s))
    }
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        Key(SmolStr::from(s))
    }
}

impl From<&String> for Key {
    fn from(s: &String) -> Self {
        Key::from(s.as_str())
    }
}

impl From<&Key> for Key {
    fn from(k: &Key) -> Self {
        k.clone()
    }
}

macro_rules! int_keys {
    ($($t:ty),*) => {$(
        impl From<$t> for Key {
            fn from(i: $t) -> Self {
                Key(i.to_smolstr())
            }
        }

        impl From<&$t> for Key {
            fn from(i: &$t) -> Self {
                Key(i.to_smolstr())
            }
        }
    )*};
}
int_keys!(i32, i64, u32, u64, usize);

/// One key or a list of keys, as the store's calls take them (see [`crate::KVStore`]).
#[derive(Debug, Clone)]
pub enum Keys {
    /// One key: every value of the call belongs to it.
    One(Key),
    /// A list of keys, parallel to the values (repeats allowed).
    Many(Vec<Key>),
}

impl<K: Into<Key>> From<K> for Keys {
    fn from(k: K) -> Self {
        Keys::One(k.into())
    }
}

// Lists are converted element by element from references: a list of `String`s is not
// cloned first.
impl<'k, K> From<&'k [K]> for Keys
where
    &'k K: Into<Key>,
{
    fn from(ks: &'k [K]) -> Self {
        Keys::Many(ks.iter().map(Into::into).collect())
    }
}

impl<'k, K, const N: usize> From<&'k [K; N]> for Keys
where
    &'k K: Into<Key>,
{
    fn from(ks: &'k [K; N]) -> Self {
        Keys::from(&ks[..])
    }
}

impl<K: Into<Key>> From<Vec<K>> for Keys {
    fn from(ks: Vec<K>) -> Self {
        Keys::Many(ks.into_iter().map(Into::into).collect())
    }
}

impl<'k, K> From<&'k Vec<K>> for Keys
where
    &'k K: Into<Key>,
{
    fn from(ks: &'k Vec<K>) -> Self {
        Keys::from(&ks[..])
    }
}

// ---- the forms of a call's values, paired with its keys ----

/// Values or outs of a call: one array, a list, or a list of lists (one list per key).
#[derive(Clone, Copy)]
pub enum Values<'a> {
    /// One array.
    One(&'a NDArray),
    /// A list of arrays: all for the one key, or one per key.
    Many(&'a [NDArray]),
    /// One list of arrays per key: `push([k1, k2], [[a, b], [c]])`.
    Nested(&'a [Vec<NDArray>]),
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
        (Keys::One(k), Values::One(v)) => Ok(vec![(k, one(v))]),
        (Keys::One(_), Values::Many([])) => Ok(Vec::new()),
        (Keys::One(k), Values::Many(vs)) => Ok(vec![(k, vs)]),
        (Keys::One(k), Values::Nested(_)) => Err(Error::invalid_argument(format!(
            "{op}: key \"{k}\" takes one array or a list of arrays, not a list of lists"
        ))),
        (Keys::Many(ks), Values::One(v)) if ks.len() == 1 => Ok(ks.into_iter().map(|k| (k, one(v))).collect()),
        (Keys::Many(ks), Values::One(_)) => Err(mismatch(ks.len(), 1)),
        (Keys::Many(ks), Values::Many(vs)) if ks.len() == vs.len() => {
            Ok(ks.into_iter().zip(vs).map(|(k, v)| (k, one(v))).collect())
        }
        (Keys::Many(ks), Values::Many(vs)) => Err(mismatch(ks.len(), vs.len())),
        (Keys::Many(ks), Values::Nested(vss)) if ks.len() == vss.len() => {
            // Sized for every key at once: keys with an empty list are few.
            let mut runs = Vec::with_capacity(ks.len());
            runs.extend(ks.into_iter().zip(vss).filter(|(_, vs)| !vs.is_empty()).map(|(k, vs)| (k, &vs[..])));
            Ok(runs)
        }
        (Keys::Many(ks), Values::Nested(vss)) => Err(mismatch(ks.len(), vss.len())),
    }
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
    values: &'a [NDArray],
    out_keys: &[Key],
    outs: &'a [NDArray],
) -> Result<FlatRuns<'a>> {
    Ok((
        runs(op, Keys::Many(keys.to_vec()), Values::Many(values), "values")?,
        runs(op, Keys::Many(out_keys.to_vec()), Values::Many(outs), "outs")?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_any_length_keep_their_text() {
        for n in [0, 1, 22, 23, 24, 200] {
            let text: String = "é".repeat(n / 2) + &"k".repeat(n % 2);
            let key = Key::from(text.as_str());
            assert_eq!(key.as_str(), text);
            assert_eq!(key, Key::from(text.clone()));
        }
    }

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
    }

    #[test]
    fn an_integer_key_is_its_decimal_string() {
        assert_eq!(Key::from(3), Key::from("3"));
        assert_eq!(Key::from(-7i64).as_str(), "-7");
        assert_eq!(format!("{:?}", Key::from("w")), "\"w\"");
    }

    #[test]
    fn long_keys_are_shortened_in_messages_with_their_length() {
        let long = "é".repeat(500_000);
        let shown = Key::from(long.as_str()).to_string();
        assert!(shown.len() < 100, "{}", shown.len());
        assert!(shown.ends_with("…(1000000 bytes)"), "{shown}");
        assert_eq!(Key::from("w").to_string(), "w");
        assert_eq!(shorten(&"k".repeat(128)), "k".repeat(128));
    }

    #[test]
    fn lists_of_strings_and_integers_become_many_keys() {
        match Keys::from(&["5", "7"]) {
            Keys::Many(ks) => assert_eq!(ks, vec![Key::from(5), Key::from(7)]),
            Keys::One(_) => panic!("expected a list"),
        }
        assert!(matches!(Keys::from(vec![1, 2, 3]), Keys::Many(ref v) if v.len() == 3));
        let names: Vec<String> = vec!["fc1.weight".into(), "x".repeat(40)];
        match Keys::from(&names) {
            Keys::Many(ks) => assert_eq!(ks.iter().map(Key::as_str).collect::<Vec<_>>(), names),
            Keys::One(_) => panic!("expected a list"),
        }
        assert!(matches!(Keys::from(&[7i64, -1][..]), Keys::Many(ref v) if v[1].as_str() == "-1"));
        assert!(matches!(Keys::from("3"), Keys::One(_)));
    }
}
