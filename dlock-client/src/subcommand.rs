//! Which form of `dlock` a command line is: the lock form (`dlock [OPTIONS]
//! -k KEY -- COMMAND`), or a subcommand (`cluster`, `elect`, `leader`, `top`)
//! after any number of the options every form shares.
//!
//! The lock form's COMMAND is free text, so a word is a subcommand only
//! where no lock could be meant: first on the line, or after shared
//! options alone (`dlock -s host:7436 cluster status`). Once any other
//! option has appeared (`-k`, `-c`, `--inspect`), or after `--`, every word
//! belongs to the lock form, so every command line that ran a command
//! before still runs it (`dlock -k job top` runs top). The shared options
//! move after the subcommand's name, where its own parser reads them.

use std::ffi::{OsStr, OsString};

/// The subcommands, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sub {
    /// `dlock cluster status|add|remove`.
    Cluster,
    /// `dlock elect`.
    Elect,
    /// `dlock leader`.
    Leader,
    /// `dlock top`.
    Top,
}

/// Options every form takes that need a value.
const WITH_VALUE: [&str; 9] = [
    "-s",
    "--server",
    "--token-file",
    "--tls-ca",
    "--tls-cert",
    "--tls-key",
    "-o",
    "--output",
    "--connect-timeout",
];

/// Options every form takes that stand alone.
const ALONE: [&str; 2] = ["-v", "--verbose"];

/// Splits `argv` (the program name first): the subcommand it names, if
/// any, and the arguments for that form's parser, its name first (for a
/// subcommand, "dlock NAME" and then the shared options and the rest).
pub fn split(argv: Vec<OsString>) -> (Option<Sub>, Vec<OsString>) {
    let mut shared = Vec::new();
    let mut i = 1;
    while i < argv.len() {
        let a = argv[i].as_os_str();
        if let Some(sub) = name(a) {
            let mut out = vec![OsString::from(format!("dlock {}", a.to_string_lossy()))];
            out.extend(shared);
            out.extend(argv[i + 1..].iter().cloned());
            return (Some(sub), out);
        }
        let Some(s) = a.to_str() else { break };
        if ALONE.contains(&s) || WITH_VALUE.iter().any(|o| joined(s, o)) {
            shared.push(argv[i].clone());
            i += 1;
        } else if WITH_VALUE.contains(&s) && i + 1 < argv.len() {
            shared.extend(argv[i..i + 2].iter().cloned());
            i += 2;
        } else {
            break;
        }
    }
    (None, argv)
}

/// `s` is option `o` with its value attached: `--server=h:1`, `-sh:1`.
fn joined(s: &str, o: &str) -> bool {
    match o.strip_prefix("--") {
        Some(_) => s.strip_prefix(o).is_some_and(|v| v.starts_with('=')),
        None => s.len() > o.len() && s.starts_with(o),
    }
}

/// Whether `word` names a subcommand: for the hint when one came after a
/// lock-form option and so was read as COMMAND.
pub fn is_name(word: &str) -> bool {
    name(OsStr::new(word)).is_some()
}

fn name(a: &OsStr) -> Option<Sub> {
    match a.to_str()? {
        "cluster" => Some(Sub::Cluster),
        "elect" => Some(Sub::Elect),
        "leader" => Some(Sub::Leader),
        "top" => Some(Sub::Top),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    fn words(v: &[OsString]) -> String {
        let w: Vec<String> = v.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        w.join(" ")
    }

    #[test]
    fn a_subcommand_is_found_first_or_after_shared_options_only() {
        let (sub, rest) = split(argv("dlock cluster status"));
        assert_eq!(sub, Some(Sub::Cluster));
        assert_eq!(words(&rest), "dlock cluster status");
        let (sub, rest) = split(argv(
            "dlock -s h:1 -v --token-file t cluster status -o json",
        ));
        assert_eq!(sub, Some(Sub::Cluster));
        assert_eq!(
            words(&rest),
            "dlock cluster -s h:1 -v --token-file t status -o json"
        );
        let (sub, rest) = split(argv("dlock -s h:1 top -k a"));
        assert_eq!(sub, Some(Sub::Top));
        assert_eq!(words(&rest), "dlock top -s h:1 -k a");
        let (sub, rest) = split(argv("dlock --server=h:1 -oh leader -k svc"));
        assert_eq!(sub, Some(Sub::Leader));
        assert_eq!(words(&rest), "dlock leader --server=h:1 -oh -k svc");
    }

    #[test]
    fn every_lock_form_line_stays_one() {
        for line in [
            "dlock -k job top",
            "dlock -s h:1 -k job cluster",
            "dlock -s h:1 -- leader",
            "dlock -n -k backup -- elect",
            "dlock --inspect -k leader",
            "dlock -s",
            "dlock",
        ] {
            let (sub, rest) = split(argv(line));
            assert_eq!(sub, None, "{line}");
            assert_eq!(words(&rest), line);
        }
    }
}
