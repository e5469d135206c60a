//! Exit codes of `dlock`, and the error type that carries them.
//!
//! [`TABLE`] is the one list of them: `--help` prints it (see `cli.rs`) and a
//! test checks that README.md's table names the same codes, so the three
//! cannot drift apart.

/// Every exit code `dlock` documents, as (code, meaning), in the order
/// `--help` prints them. A code that is not a number names where it comes
/// from.
pub const TABLE: &[(&str, &str)] = &[
    ("N", "the command ran and exited with N"),
    (
        "128+N",
        "the command died of signal N, or dlock was interrupted by signal N while waiting (130 = SIGINT, 143 = SIGTERM)",
    ),
    ("1", "lock busy (-n) or wait timed out (-w); change with -E"),
    ("64", "usage error"),
    (
        "69",
        "cannot reach the server, or the connection was lost before the lock was taken",
    ),
    (
        "70",
        "the server refused the request (invalid key, a limit, shutting down) or broke the protocol",
    ),
    ("75", "the lock was lost while the command ran"),
    ("77", "access denied: token missing or not accepted"),
    ("124", "--max-time exceeded; the command was stopped"),
    ("126", "the command could not be executed"),
    ("127", "the command was not found"),
];

/// The "Exit codes" part of `--help`, made from [`TABLE`].
pub fn help_text() -> String {
    let width = TABLE.iter().map(|(code, _)| code.len()).max().unwrap_or(0);
    let mut text = String::from("Exit codes:");
    for (code, meaning) in TABLE {
        text.push_str(&format!("\n  {code:<width$}  {meaning}"));
    }
    text
}

/// Bad command line.
pub const USAGE: u8 = 64;
/// Server unreachable.
pub const UNAVAILABLE: u8 = 69;
/// Server refused or protocol broken.
pub const SOFTWARE: u8 = 70;
/// Lock lost while the command ran.
pub const LOCK_LOST: u8 = 75;
/// Access denied.
pub const NO_PERMISSION: u8 = 77;
/// `--max-time` exceeded.
pub const MAX_TIME: u8 = 124;
/// Command found but not executable.
pub const CANNOT_EXECUTE: u8 = 126;
/// Command not found.
pub const NOT_FOUND: u8 = 127;

/// An error that ends dlock: a message for stderr and the exit code.
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: u8,
    /// One line naming the problem and, where there is one, the fix. Empty
    /// when nothing should be printed (a busy lock without `-v`).
    pub message: String,
    /// Whether the server could not be reached or was lost (nothing
    /// listens, no answer, no cluster leader, the connection ended, the
    /// server is stopping): the same request may succeed later as it is.
    /// `dlock elect` and `dlock leader --watch` wait and try again; every
    /// other failure needs the user (a flag, a token, a key) and ends them.
    pub transient: bool,
}

impl Failure {
    /// A failure with `code` and `message`.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
            transient: false,
        }
    }
}

/// Maps a library error to an exit code and a one-line explanation.
pub fn from_client_error(e: dlock::Error, server: &str) -> Failure {
    let transient = is_transient(&e);
    Failure {
        transient,
        ..failure_of(e, server)
    }
}

/// Whether `e` says the server is away for now rather than that something
/// must change: see [`Failure::transient`]. A TLS or access error is not,
/// even where it breaks a connection: trying again would find it again.
fn is_transient(e: &dlock::Error) -> bool {
    use dlock::proto::ResponseStatus;
    use dlock::{Disconnect, Error};
    match e {
        // Anything but what the user must change: a TLS handshake that
        // fails (InvalidData), an address that cannot be one, a
        // permission. A name that does not resolve is an outage of the
        // name service (a restarted pod's name is gone for a moment), and
        // the same name did resolve before.
        Error::Connect { source, .. } => {
            use std::io::ErrorKind::{InvalidData, InvalidInput, PermissionDenied, Unsupported};
            !matches!(
                source.kind(),
                InvalidData | InvalidInput | PermissionDenied | Unsupported
            )
        }
        // On a cluster: every node down, or none knows a leader yet. A TLS
        // setup that does not fit the first node answers at once, as its
        // own error, not as one of these.
        Error::ConnectTimeout { .. } | Error::Unreachable { .. } => true,
        // A server that broke the protocol would break it again.
        Error::ConnectionLost(lost) => !matches!(
            lost,
            Disconnect::FrameTooLarge { .. }
                | Disconnect::Undecodable(_)
                | Disconnect::UnexpectedAnswer { .. }
        ),
        // LimitReached: a server at --max-connections turns new
        // connections away, as a fleet reconnecting after a restart finds.
        Error::Server { status, .. } => matches!(
            status,
            ResponseStatus::ShuttingDown
                | ResponseStatus::Unavailable
                | ResponseStatus::NotLeader
                | ResponseStatus::LimitReached
        ),
        _ => false,
    }
}

/// [`from_client_error`]'s code and message.
fn failure_of(e: dlock::Error, server: &str) -> Failure {
    use dlock::proto::ResponseStatus;
    use dlock::Error;
    match e {
        // The hint only where it can be the cause: nothing listens there.
        Error::Connect { source, .. } if nobody_listens(&source) => Failure::new(
            UNAVAILABLE,
            format!("cannot connect to {server}: {source} (is dlock-server running? set DLOCK_SERVER or --server)"),
        ),
        Error::Connect { source, .. } => Failure::new(
            UNAVAILABLE,
            format!("cannot connect to {server}: {}", with_cause(&source, &source)),
        ),
        // The server is there and says what to change: the user's TLS flags.
        e @ Error::ServerSpeaksTls => Failure::new(UNAVAILABLE, format!("cannot use {server}: {e}")),
        e @ (Error::ServerSpeaksNoTls { .. }
        | Error::CaUsedAsServerCertificate { .. }
        | Error::ClientCertificateRequired { .. }
        | Error::ClientCertificateRefused { .. }
        | Error::NotAClientPort { .. }) => {
            Failure::new(UNAVAILABLE, e.to_string())
        }
        Error::ConnectTimeout { timeout, .. } => Failure::new(
            UNAVAILABLE,
            format!("cannot connect to {server}: no answer within {:.1}s (check the address and the network)", timeout.as_secs_f64()),
        ),
        ref e @ Error::Unreachable { ref attempts } => {
            // Nodes that answered without knowing a leader run: asking
            // whether they do would send the operator the wrong way.
            let hint = if e.only_leaderless_nodes_answered() {
                "the nodes answer, but none knows a leader: a cluster elects one only while a \
                 majority of its nodes run and reach each other (dlock cluster status shows which \
                 do not)"
            } else {
                "are the dlock-server nodes running?"
            };
            Failure::new(
                UNAVAILABLE,
                format!(
                    "cannot reach any of {server}: {} ({hint})",
                    attempts
                        .iter()
                        .map(|(a, why)| format!("{a}: {why}"))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            )
        }
        // A list of servers that is no cluster: the user's to correct.
        e @ Error::NotOneCluster { .. } => Failure::new(USAGE, e.to_string()),
        Error::ConnectionLost(lost) => Failure::new(UNAVAILABLE, format!("connection to {server} lost: {}", with_cause(lost.reason(), &lost))),
        Error::AccessDenied(text) => Failure::new(NO_PERMISSION, access_denied(server, &text)),
        // Refused by the client library before sending: the keys given
        // make a request larger than the server takes.
        Error::Server {
            status: ResponseStatus::FrameTooLarge,
            text,
        } => Failure::new(USAGE, format!("too large for {server}: {text}")),
        // What the user typed, refused by the server (a key dlock's own
        // check did not see, as in --inspect): a usage error, as when that
        // check refuses it.
        Error::Server {
            status:
                status @ (ResponseStatus::TooManyKeys
                | ResponseStatus::InvalidKey
                | ResponseStatus::NoKeys
                | ResponseStatus::InvalidArgument),
            text,
        } => Failure::new(USAGE, format!("{server} refused it ({status:?}): {text}")),
        other => Failure::new(SOFTWARE, other.to_string()),
    }
}

/// Whether a failed connect means no server listens there (or the address
/// leads nowhere), the one case where "is dlock-server running?" helps.
fn nobody_listens(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{
        AddrNotAvailable, ConnectionRefused, HostUnreachable, NetworkUnreachable,
    };
    matches!(
        e.kind(),
        ConnectionRefused | HostUnreachable | NetworkUnreachable | AddrNotAvailable
    )
}

/// The server's reason for a refusal, and what to do when the token is
/// the problem; an identity that lacks a rule needs a change on the
/// server, not another token.
fn access_denied(server: &str, text: &str) -> String {
    let why = text.strip_prefix("access denied: ").unwrap_or(text).trim();
    let hint = "set DLOCK_TOKEN or --token-file to a token the server accepts";
    match why {
        "" => format!("access denied by {server} ({hint})"),
        w if w.starts_with("identity ") => format!("access denied by {server}: {w}"),
        w => format!("access denied by {server}: {w} ({hint})"),
    }
}

/// `what`, then the text of each underlying error of `e`: "read failed:
/// Connection reset by peer".
fn with_cause(what: impl std::fmt::Display, e: &dyn std::error::Error) -> String {
    let mut text = what.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers in a code column: "126 / 127" gives both, "128+N" gives
    /// 128, "COMMAND's code" none.
    fn numbers(code: &str) -> Vec<u32> {
        code.split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect()
    }

    #[test]
    fn nodes_that_answer_without_a_leader_are_not_said_to_be_down() {
        let unreachable = |why: &str| dlock::Error::Unreachable {
            attempts: vec![("h:1".into(), why.into()), ("h:2".into(), why.into())],
        };
        let f = from_client_error(
            unreachable("not the leader, and no leader is known yet"),
            "h:1,h:2",
        );
        assert!(f.message.contains("none knows a leader"), "{}", f.message);
        assert!(!f.message.contains("running?"), "{}", f.message);
        let f = from_client_error(unreachable("Connection refused (os error 111)"), "h:1,h:2");
        assert!(
            f.message.contains("are the dlock-server nodes running?"),
            "{}",
            f.message
        );
    }

    #[test]
    fn only_a_server_away_is_worth_waiting_for() {
        use dlock::proto::ResponseStatus;
        use dlock::{Disconnect, Error};
        use std::io::{Error as Io, ErrorKind};
        let connect = |kind| Error::Connect {
            addr: "h:1".into(),
            source: Io::new(kind, "x"),
        };
        let server = |status| Error::Server {
            status,
            text: String::new(),
        };
        let away = [
            connect(ErrorKind::ConnectionRefused),
            connect(ErrorKind::ConnectionReset),
            Error::ConnectTimeout {
                addr: "h:1".into(),
                timeout: std::time::Duration::from_secs(5),
            },
            Error::Unreachable {
                attempts: vec![(
                    "h:1".into(),
                    "not the leader, and no leader is known yet".into(),
                )],
            },
            Error::ConnectionLost(Disconnect::Closed),
            Error::ConnectionLost(Disconnect::TurnedAway("shutting down".into())),
            server(ResponseStatus::ShuttingDown),
            // At --max-connections; a name that does not resolve for now.
            server(ResponseStatus::LimitReached),
            connect(ErrorKind::Other),
        ];
        for e in away {
            let text = e.to_string();
            assert!(from_client_error(e, "h:1").transient, "{text}");
        }
        let refused = [
            Error::AccessDenied("access token missing or not accepted".into()),
            server(ResponseStatus::InvalidKey),
            server(ResponseStatus::InvalidArgument),
            Error::ServerSpeaksTls,
            // A TLS handshake that fails (an untrusted certificate).
            connect(ErrorKind::InvalidData),
            Error::ConnectionLost(Disconnect::UnexpectedAnswer { request_id: 3 }),
            connect(ErrorKind::InvalidInput),
            Error::NotOneCluster { addr: "h:1".into() },
            server(ResponseStatus::FrameTooLarge),
        ];
        for e in refused {
            let text = e.to_string();
            let f = from_client_error(e, "h:1");
            assert!(!f.transient, "{text}");
        }
    }

    #[test]
    fn a_refusal_names_the_missing_rule_or_says_to_fix_the_token() {
        assert_eq!(
            access_denied(
                "h:1",
                "access denied: identity \"jobs\" has no rule \"lock web/home\" (or a pattern covering it)"
            ),
            "access denied by h:1: identity \"jobs\" has no rule \"lock web/home\" (or a pattern covering it)"
        );
        assert_eq!(
            access_denied("h:1", "access token missing or not accepted"),
            "access denied by h:1: access token missing or not accepted (set DLOCK_TOKEN or --token-file to a token the server accepts)"
        );
        assert!(access_denied("h:1", "")
            .ends_with("(set DLOCK_TOKEN or --token-file to a token the server accepts)"));
    }

    #[test]
    fn every_exit_code_constant_is_in_the_table() {
        let listed: Vec<u32> = TABLE.iter().flat_map(|(c, _)| numbers(c)).collect();
        for code in [
            USAGE,
            UNAVAILABLE,
            SOFTWARE,
            LOCK_LOST,
            NO_PERMISSION,
            MAX_TIME,
            CANNOT_EXECUTE,
            NOT_FOUND,
        ] {
            assert!(listed.contains(&u32::from(code)), "{code} missing");
        }
    }

    #[test]
    fn readme_lists_the_same_exit_codes_as_the_table() {
        let readme = include_str!("../../README.md");
        let section = readme
            .split("### Exit codes")
            .nth(1)
            .expect("README.md has an Exit codes section");
        let mut in_readme: Vec<u32> = section
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .filter_map(|l| l.split('|').nth(1))
            .flat_map(numbers)
            .collect();
        let mut in_table: Vec<u32> = TABLE.iter().flat_map(|(c, _)| numbers(c)).collect();
        in_readme.sort_unstable();
        in_table.sort_unstable();
        assert_eq!(in_readme, in_table);
    }

    #[test]
    fn help_text_lists_every_code_of_the_table() {
        let help = help_text();
        for (code, meaning) in TABLE {
            assert!(help.contains(code) && help.contains(meaning), "{code}");
        }
    }
}
