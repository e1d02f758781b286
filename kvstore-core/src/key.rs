//! Keys. A key is a string; an integer key is its decimal string, so `3` and `"3"` are
//! the same key (MXNet kept int and string keys apart and refused to mix them). A call
//! takes one key or a list ([`Keys`]); `kvstore/forms.rs` pairs them with its arrays.

use std::borrow::{Borrow, Cow};
use std::fmt;

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
