//! The access-token file format, shared by the server (`--token-file`, the
//! tokens it accepts) and the clients (`--token-file`, the token they send):
//! one token per line; blank lines and lines starting with `#` are skipped,
//! white space around a token is ignored.

/// The tokens in `text`, in file order.
pub fn tokens(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

#[cfg(test)]
mod tests {
    #[test]
    fn comments_and_blank_lines_are_skipped() {
        let text = "# ops team\n\n  s3cret  \n#old\nother\n";
        assert_eq!(super::tokens(text).collect::<Vec<_>>(), ["s3cret", "other"]);
    }
}
