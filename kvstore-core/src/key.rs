//! Keys. A key is a string; an integer key is its decimal string, so `3` and `"3"` are
//! the same key (MXNet kept int and string keys apart and refused to mix them).

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

/// A key of the store: a cheaply clonable string.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Arc<str>);

impl Key {
    /// The key as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
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
        Key(Arc::from(s))
    }
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        Key(Arc::from(s))
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
                Key::from(i.to_string())
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

impl<K: Into<Key> + Clone> From<&[K]> for Keys {
    fn from(ks: &[K]) -> Self {
        Keys::Many(ks.iter().cloned().map(Into::into).collect())
    }
}

impl<K: Into<Key> + Clone, const N: usize> From<&[K; N]> for Keys {
    fn from(ks: &[K; N]) -> Self {
        Keys::from(&ks[..])
    }
}

impl<K: Into<Key>> From<Vec<K>> for Keys {
    fn from(ks: Vec<K>) -> Self {
        Keys::Many(ks.into_iter().map(Into::into).collect())
    }
}

impl<K: Into<Key> + Clone> From<&Vec<K>> for Keys {
    fn from(ks: &Vec<K>) -> Self {
        Keys::from(&ks[..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_integer_key_is_its_decimal_string() {
        assert_eq!(Key::from(3), Key::from("3"));
        assert_eq!(Key::from(-7i64).as_str(), "-7");
        assert_eq!(format!("{:?}", Key::from("w")), "\"w\"");
    }

    #[test]
    fn lists_of_strings_and_integers_become_many_keys() {
        match Keys::from(&["5", "7"]) {
            Keys::Many(ks) => assert_eq!(ks, vec![Key::from(5), Key::from(7)]),
            Keys::One(_) => panic!("expected a list"),
        }
        assert!(matches!(Keys::from(vec![1, 2, 3]), Keys::Many(ref v) if v.len() == 3));
        assert!(matches!(Keys::from("3"), Keys::One(_)));
    }
}
