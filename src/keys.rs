//! [`IntoKeys`]: what every call that names keys takes.

/// The keys of a request: one key (`"deploy/web"`, a `String`) or several
/// (an array, a `Vec` or a slice of them). Any other iterator of keys is
/// collected into [`Keys`] first: `iter.collect::<Keys>()`.
///
/// A trait of its own rather than `IntoIterator`, because a `&str` is not
/// an iterator of keys, and Rust's coherence rules forbid one blanket
/// implementation covering both.
pub trait IntoKeys {
    /// The keys, in the order given.
    fn into_keys(self) -> Vec<String>;
}

/// Keys collected from any iterator of things that convert into strings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keys(pub Vec<String>);

impl<K: Into<String>> FromIterator<K> for Keys {
    fn from_iter<I: IntoIterator<Item = K>>(iter: I) -> Self {
        Keys(iter.into_iter().map(Into::into).collect())
    }
}

impl IntoKeys for Keys {
    fn into_keys(self) -> Vec<String> {
        self.0
    }
}

impl IntoKeys for &str {
    fn into_keys(self) -> Vec<String> {
        vec![self.to_owned()]
    }
}

impl IntoKeys for String {
    fn into_keys(self) -> Vec<String> {
        vec![self]
    }
}

impl IntoKeys for &String {
    fn into_keys(self) -> Vec<String> {
        vec![self.clone()]
    }
}

impl<K: Into<String>, const N: usize> IntoKeys for [K; N] {
    fn into_keys(self) -> Vec<String> {
        self.into_iter().map(Into::into).collect()
    }
}

impl<K: Into<String> + Clone, const N: usize> IntoKeys for &[K; N] {
    fn into_keys(self) -> Vec<String> {
        self.iter().cloned().map(Into::into).collect()
    }
}

impl<K: Into<String>> IntoKeys for Vec<K> {
    fn into_keys(self) -> Vec<String> {
        self.into_iter().map(Into::into).collect()
    }
}

impl<K: Into<String> + Clone> IntoKeys for &Vec<K> {
    fn into_keys(self) -> Vec<String> {
        self.iter().cloned().map(Into::into).collect()
    }
}

impl<K: Into<String> + Clone> IntoKeys for &[K] {
    fn into_keys(self) -> Vec<String> {
        self.iter().cloned().map(Into::into).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{IntoKeys, Keys};

    #[test]
    fn one_key_or_many_in_every_usual_form() {
        let owned = String::from("b");
        assert_eq!("a".into_keys(), ["a"]);
        assert_eq!(owned.clone().into_keys(), ["b"]);
        assert_eq!((&owned).into_keys(), ["b"]);
        assert_eq!(["a", "b"].into_keys(), ["a", "b"]);
        assert_eq!((&["a", "b"]).into_keys(), ["a", "b"]);
        assert_eq!(vec![owned.clone()].into_keys(), ["b"]);
        assert_eq!((&vec!["a"]).into_keys(), ["a"]);
        assert_eq!((&["a", "b"][..1]).into_keys(), ["a"]);
        let collected: Keys = (1..=2).map(|i| format!("k{i}")).collect();
        assert_eq!(collected.into_keys(), ["k1", "k2"]);
    }
}
