//! Access tokens: loaded from a file, compared in constant time.

use anyhow::{bail, Context};
use std::path::Path;
use subtle::ConstantTimeEq;

/// The tokens a server accepts. Empty means access control is off.
#[derive(Default)]
pub struct Tokens {
    tokens: Vec<Vec<u8>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secrets themselves.
        write!(f, "Tokens({} configured)", self.tokens.len())
    }
}

impl Tokens {
    /// Reads the tokens of a token file ([`dlock::token_file`]).
    ///
    /// # Errors
    /// The file cannot be read or holds no token.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read token file {}", path.display()))?;
        let tokens: Vec<Vec<u8>> = dlock::token_file::tokens(&text)
            .map(|l| l.as_bytes().to_vec())
            .collect();
        if tokens.is_empty() {
            bail!("token file {} holds no token", path.display());
        }
        Ok(Tokens { tokens })
    }

    /// Whether access control is on.
    pub fn enabled(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// Whether `given` is acceptable. Every configured token is compared, in
    /// constant time, so the answer's timing does not reveal which one
    /// matched or how much of it.
    pub fn allows(&self, given: &str) -> bool {
        if self.tokens.is_empty() {
            return true;
        }
        let mut ok = subtle::Choice::from(0);
        for t in &self.tokens {
            ok |= t.as_slice().ct_eq(given.as_bytes());
        }
        ok.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_tokens_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, "# ops\n  alpha  \n\nbeta\n").unwrap();
        let t = Tokens::from_file(&path).unwrap();
        assert!(t.enabled());
        assert!(t.allows("alpha") && t.allows("beta"));
        assert!(!t.allows("") && !t.allows("alph") && !t.allows("# ops"));
        assert!(!format!("{t:?}").contains("alpha"));
    }

    #[test]
    fn empty_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, "# nothing\n").unwrap();
        assert!(Tokens::from_file(&path).is_err());
        assert!(Tokens::from_file(&dir.path().join("missing")).is_err());
    }
}
