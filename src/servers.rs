//! [`Servers`]: where a client may find the server, or a cluster's nodes.

/// The addresses a [`crate::Client`] connects to: one server's, or several
/// nodes of a cluster, tried in order until one answers (and, on a cluster,
/// the leader named by a node that is not one).
///
/// Built from one address, a comma-separated list (`"a:7436,b:7436"`, as
/// `dlock -s` and `DLOCK_SERVER` take it) or a list of addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Servers(Vec<String>);

impl Servers {
    /// The addresses, in the order they are tried.
    pub fn addrs(&self) -> &[String] {
        &self.0
    }

    /// Addresses from a comma-separated list; blanks around commas and
    /// empty entries are ignored.
    pub fn parse(list: &str) -> Servers {
        Servers(
            list.split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(str::to_owned)
                .collect(),
        )
    }
}

impl std::fmt::Display for Servers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

impl From<&str> for Servers {
    fn from(list: &str) -> Self {
        Servers::parse(list)
    }
}

impl From<&String> for Servers {
    fn from(list: &String) -> Self {
        Servers::parse(list)
    }
}

impl From<String> for Servers {
    fn from(list: String) -> Self {
        Servers::parse(&list)
    }
}

impl From<Vec<String>> for Servers {
    fn from(addrs: Vec<String>) -> Self {
        Servers(addrs)
    }
}

impl From<&[&str]> for Servers {
    fn from(addrs: &[&str]) -> Self {
        Servers(addrs.iter().map(|a| (*a).to_owned()).collect())
    }
}

impl<const N: usize> From<[&str; N]> for Servers {
    fn from(addrs: [&str; N]) -> Self {
        Servers(addrs.iter().map(|a| (*a).to_owned()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::Servers;

    #[test]
    fn a_list_splits_on_commas_and_ignores_blanks() {
        let s = Servers::from(" 127.0.0.1:1, 127.0.0.2:2,,");
        assert_eq!(s.addrs(), ["127.0.0.1:1", "127.0.0.2:2"]);
        assert_eq!(s.to_string(), "127.0.0.1:1,127.0.0.2:2");
        assert_eq!(Servers::from("[::1]:7436").addrs(), ["[::1]:7436"]);
        assert_eq!(Servers::from(["a:1", "b:2"]).addrs(), ["a:1", "b:2"]);
    }
}
