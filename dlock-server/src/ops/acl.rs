//! Access control: who a request comes from (an access token, compared in
//! constant time, or a TLS client certificate's name) and what that
//! identity may do, by request type and key prefix.
//!
//! The `--token-file` holds the rules (format in docs/PROTOCOL.md, "Access
//! control"):
//!
//! ```text
//! # A bare token, as in the old one-token-per-line file: every right.
//! 1f0c2a9e7d
//! # A named token and its rules, indented under it.
//! token jobs 8c41d7f0b2
//!     lock jobs/*
//!     inspect *
//! # A client certificate whose subject CN or a DNS name is "ops".
//! identity ops
//!     admin
//! ```
//!
//! The rules are reloaded on SIGHUP ([`Access::reload`]); a file that does
//! not parse leaves the rules in force unchanged. Secrets never appear in a
//! log line, an error or `Debug` output.

use anyhow::{anyhow, bail, Context};
use dlock_proto::proto::{RequestLock, RequestType};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use subtle::{ConditionallySelectable, ConstantTimeEq};

/// A key pattern: a whole key, or a prefix written with a trailing `*`
/// (`*` alone matches every key).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Exact(String),
    Prefix(String),
}

impl Pattern {
    fn parse(s: &str) -> anyhow::Result<Pattern> {
        match s.strip_suffix('*') {
            Some(prefix) if !prefix.contains('*') => Ok(Pattern::Prefix(prefix.to_owned())),
            None if !s.contains('*') => Ok(Pattern::Exact(s.to_owned())),
            _ => bail!("{s:?}: '*' may only end a pattern"),
        }
    }

    fn matches(&self, key: &str) -> bool {
        match self {
            Pattern::Exact(k) => k == key,
            Pattern::Prefix(p) => key.starts_with(p.as_str()),
        }
    }
}

/// One identity's rights.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// The name it is known by in the file and in the log.
    pub name: String,
    /// Every right, and Unlock/Renew by fence of others' locks.
    admin: bool,
    /// Lock, Enqueue, Unlock, Renew and Proclaim on keys matching one of
    /// these.
    lock: Vec<Pattern>,
    /// Inspect and Watch of keys matching one of these; `inspect *` also
    /// allows the server-wide counts (Inspect naming no keys) and
    /// ClusterStatus.
    inspect: Vec<Pattern>,
}

impl Identity {
    /// Whether this identity has every right.
    pub fn is_admin(&self) -> bool {
        self.admin
    }

    fn may(rules: &[Pattern], key: &str) -> bool {
        rules.iter().any(|p| p.matches(key))
    }

    /// Checks a request against the rules; the error names the rule that
    /// is missing.
    ///
    /// # Errors
    /// The text for an `AccessDenied` response.
    pub fn permits(&self, kind: RequestType, body: &RequestLock) -> Result<(), String> {
        if self.admin {
            return Ok(());
        }
        let (verb, rules) = match kind {
            RequestType::Lock
            | RequestType::Enqueue
            | RequestType::Unlock
            | RequestType::Renew
            | RequestType::Proclaim => ("lock", &self.lock),
            RequestType::Inspect | RequestType::Watch => ("inspect", &self.inspect),
            RequestType::ClusterAdd | RequestType::ClusterRemove => {
                return Err(self.missing("admin", "to change the cluster's members"));
            }
            // Who the members are and how far each has got: server-wide, as
            // the counts are (and what `dlock top` shows beside them).
            RequestType::ClusterStatus => ("inspect", &self.inspect),
            // Ping, Hello, sessions and Wait (on a ticket its own session
            // got from an Enqueue the rules allowed) name no keys: being
            // known is enough.
            RequestType::Ping
            | RequestType::Hello
            | RequestType::OpenSession
            | RequestType::CloseSession
            | RequestType::Wait
            | RequestType::Invalid => return Ok(()),
        };
        let server_wide = kind == RequestType::ClusterStatus
            || (body.keys.is_empty() && kind == RequestType::Inspect);
        if server_wide {
            if !rules.contains(&Pattern::Prefix(String::new())) {
                return Err(self.missing(
                    "inspect *",
                    "to read the server-wide counts and the cluster's state",
                ));
            }
            return Ok(());
        }
        match body.keys.iter().find(|k| !Identity::may(rules, k)) {
            Some(key) => Err(self.missing(&format!("{verb} {key}"), "or a pattern covering it")),
            None => Ok(()),
        }
    }

    /// The refusal of an Unlock, Renew or Proclaim by the fencing token of
    /// a lock another identity took.
    pub fn not_your_fence(&self) -> String {
        self.missing(
            "admin",
            "to unlock, renew or proclaim by fence a lock another identity took",
        )
    }

    fn missing(&self, rule: &str, why: &str) -> String {
        format!(
            "access denied: identity {:?} has no rule \"{rule}\" ({why})",
            self.name
        )
    }
}

/// The parsed file: tokens and certificate names, each with its identity.
#[derive(Default)]
struct Acl {
    tokens: Vec<(Vec<u8>, Arc<Identity>)>,
    certs: HashMap<String, Arc<Identity>>,
}

impl std::fmt::Debug for Acl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secrets themselves.
        let names: Vec<&str> = self.tokens.iter().map(|(_, i)| i.name.as_str()).collect();
        f.debug_struct("Acl")
            .field("tokens", &names)
            .field("certificates", &self.certs.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Acl {
    fn parse(text: &str) -> anyhow::Result<Acl> {
        let mut acl = Acl::default();
        // The identity whose indented rules follow, and where it goes.
        let mut open: Option<(Identity, Option<Vec<u8>>)> = None;
        let mut names = std::collections::HashSet::new();
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let indented = raw.starts_with([' ', '\t']);
            if indented {
                if let Some((id, _)) = open.as_mut() {
                    add_rule(id, line).with_context(|| format!("line {n}"))?;
                    continue;
                }
                // Indented with no header above: the old format, which
                // trimmed every line, so still a bare token.
            }
            if let Some(done) = open.take() {
                acl.add(done)?;
            }
            let mut words = line.split_whitespace();
            match words.next() {
                Some("token") => {
                    let (Some(name), Some(secret), None) =
                        (words.next(), words.next(), words.next())
                    else {
                        bail!("line {n}: expected \"token NAME SECRET\"");
                    };
                    if !names.insert(name.to_owned()) {
                        bail!("line {n}: identity {name:?} is defined twice");
                    }
                    let id = Identity {
                        name: name.to_owned(),
                        ..Identity::default()
                    };
                    open = Some((id, Some(secret.as_bytes().to_vec())));
                }
                Some("identity") => {
                    let (Some(name), None) = (words.next(), words.next()) else {
                        bail!("line {n}: expected \"identity NAME\"");
                    };
                    if !names.insert(name.to_owned()) {
                        bail!("line {n}: identity {name:?} is defined twice");
                    }
                    let id = Identity {
                        name: name.to_owned(),
                        ..Identity::default()
                    };
                    open = Some((id, None));
                }
                Some(first) if is_rule(first) => bail!(
                    "line {n}: the rule {first:?} is under no \"token NAME SECRET\" or \
                     \"identity NAME\" line: indent it under one"
                ),
                // A mistyped header ("tokne jobs s3cret") would otherwise
                // become a token with every right. The line is not shown:
                // it may hold a secret.
                _ if line.contains(char::is_whitespace) => bail!(
                    "line {n}: expected \"token NAME SECRET\", \"identity NAME\" or a bare \
                     token (one word, no spaces)"
                ),
                _ => {
                    // A bare token: every right, as the old file meant.
                    let id = Identity {
                        name: format!("token on line {n}"),
                        admin: true,
                        ..Identity::default()
                    };
                    acl.add((id, Some(line.as_bytes().to_vec())))?;
                }
            }
        }
        if let Some(done) = open.take() {
            acl.add(done)?;
        }
        if acl.tokens.is_empty() && acl.certs.is_empty() {
            bail!("it holds no token and no identity");
        }
        Ok(acl)
    }

    fn add(&mut self, (id, secret): (Identity, Option<Vec<u8>>)) -> anyhow::Result<()> {
        let id = Arc::new(id);
        match secret {
            Some(secret) => {
                if self.tokens.iter().any(|(t, _)| *t == secret) {
                    // Named by identity, never by the secret itself.
                    bail!("the token of {:?} is used twice", id.name);
                }
                self.tokens.push((secret, id));
            }
            None => {
                self.certs.insert(id.name.clone(), id);
            }
        }
        Ok(())
    }

    /// The identity whose token is `given`. Every token is compared, in
    /// constant time, and the match is selected without a branch, so the
    /// answer's timing reveals neither which token matched nor how much of
    /// it.
    fn by_token(&self, given: &[u8]) -> Option<&Arc<Identity>> {
        let mut found = 0u64;
        for (i, (t, _)) in self.tokens.iter().enumerate() {
            found.conditional_assign(&(i as u64 + 1), t.as_slice().ct_eq(given));
        }
        let i = usize::try_from(found).ok()?.checked_sub(1)?;
        self.tokens.get(i).map(|(_, id)| id)
    }
}

/// Whether `word` starts a rule. Such a line with no identity above it
/// is a misplaced rule, never a bare token: read as one, an indented
/// `admin` would become the secret "admin" with every right.
fn is_rule(word: &str) -> bool {
    matches!(word, "admin" | "lock" | "inspect")
}

fn add_rule(id: &mut Identity, line: &str) -> anyhow::Result<()> {
    let mut words = line.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("admin"), None, None) => id.admin = true,
        (Some("lock"), Some(p), None) => id.lock.push(Pattern::parse(p)?),
        (Some("inspect"), Some(p), None) => id.inspect.push(Pattern::parse(p)?),
        (Some(rule @ ("lock" | "inspect")), None, None) => bail!(
            "rule \"{rule}\" needs the keys it covers: \"{rule} PATTERN\", as in \"{rule} jobs/*\" \
             (\"{rule} *\" for every key)"
        ),
        (Some(rule @ ("lock" | "inspect")), Some(_), Some(_)) => bail!(
            "rule {line:?} names more than one pattern: give each its own line, \"{rule} PATTERN\""
        ),
        (Some("admin"), Some(_), _) => bail!("rule {line:?}: \"admin\" takes no pattern"),
        _ => bail!(
            "unknown rule {line:?}; rules are \"lock PATTERN\", \"inspect PATTERN\" and \"admin\""
        ),
    }
    Ok(())
}

/// The server's access control: off (no `--token-file`), or the rules of
/// the file, swapped whole on reload.
#[derive(Debug, Default)]
pub struct Access {
    file: Option<(PathBuf, RwLock<Arc<Acl>>)>,
}

/// Why a request cannot be attributed to anyone.
pub const UNKNOWN: &str = "access token missing or not accepted";

impl Access {
    /// Reads the rules of `path`.
    ///
    /// # Errors
    /// The file cannot be read, does not parse, or holds no identity.
    pub fn from_file(path: &Path) -> anyhow::Result<Access> {
        let acl = read(path)?;
        Ok(Access {
            file: Some((path.to_owned(), RwLock::new(Arc::new(acl)))),
        })
    }

    /// Whether access control is on.
    pub fn enabled(&self) -> bool {
        self.file.is_some()
    }

    /// Re-reads the file; the rules in force stay unchanged if it cannot be
    /// used. Connections keep going either way.
    ///
    /// # Errors
    /// The file cannot be read or does not parse.
    pub fn reload(&self) -> anyhow::Result<()> {
        let Some((path, current)) = &self.file else {
            return Ok(());
        };
        let acl = read(path)?;
        *current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(acl);
        Ok(())
    }

    /// Who sends a request: the identity of its access token, or without a
    /// token the identity named by the connection's client certificate.
    /// `Ok(None)` when access control is off.
    ///
    /// # Errors
    /// [`UNKNOWN`]: no token and no known certificate, or a token that is
    /// not in the file.
    pub fn identify(
        &self,
        token: &str,
        cert_names: &[String],
    ) -> Result<Option<Arc<Identity>>, &'static str> {
        let Some((_, acl)) = &self.file else {
            return Ok(None);
        };
        // Cloned out so no guard is held past this line.
        let acl = acl.read().unwrap_or_else(|p| p.into_inner()).clone();
        let found = if token.is_empty() {
            cert_names.iter().find_map(|n| acl.certs.get(n))
        } else {
            acl.by_token(token.as_bytes())
        };
        found.cloned().map(Some).ok_or(UNKNOWN)
    }
}

fn read(path: &Path) -> anyhow::Result<Acl> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read token file {}", path.display()))?;
    let acl = Acl::parse(&text).map_err(|e| anyhow!("token file {}: {e:#}", path.display()))?;
    if let Some(why) = std::fs::metadata(path).ok().and_then(|m| exposed(&m)) {
        tracing::warn!(file = %path.display(), "the token file {why}: anyone on this machine who can log in can take any identity in it; make it mode 0600 (or 0640 with the server's group)");
    }
    Ok(acl)
}

/// How the token file's mode exposes its tokens, if it does: readable or
/// writable by every user, or writable by its group. Group-readable is
/// what the packaged unit uses (0640, group dlock).
fn exposed(meta: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode() & 0o777;
    let what = match (mode & 0o004 != 0, mode & 0o022 != 0) {
        (false, false) => return None,
        (true, false) => "is readable by every user",
        (false, true) => "can be changed by other users",
        (true, true) => "is readable and can be changed by other users",
    };
    Some(format!("{what} (mode {mode:04o})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(keys: &[&str]) -> RequestLock {
        RequestLock {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            ..RequestLock::default()
        }
    }

    const FILE: &str = "# ops\n  alpha  \n\nbeta\ntoken jobs s3cret\n    lock jobs/*\n\tinspect *\nidentity build.example\n    lock ci/one\n";

    #[test]
    fn a_token_file_others_can_read_or_change_is_named_as_such() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, FILE).unwrap();
        let with_mode = |mode| {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            exposed(&std::fs::metadata(&path).unwrap())
        };
        assert_eq!(with_mode(0o600), None);
        assert_eq!(with_mode(0o640), None, "the packaged unit's mode");
        let why = with_mode(0o644).expect("world-readable");
        assert!(
            why.contains("readable by every user") && why.contains("0644"),
            "{why}"
        );
        assert!(with_mode(0o660)
            .expect("group-writable")
            .contains("changed"));
    }

    #[test]
    fn bare_tokens_have_every_right_and_named_ones_their_rules() {
        let acl = Acl::parse(FILE).unwrap();
        for bare in ["alpha", "beta"] {
            let id = acl.by_token(bare.as_bytes()).unwrap();
            assert!(id.is_admin());
        }
        assert!(acl.by_token(b"alph").is_none() && acl.by_token(b"# ops").is_none());
        assert!(acl.by_token(b"").is_none());
        let jobs = acl.by_token(b"s3cret").unwrap();
        assert_eq!(jobs.name, "jobs");
        assert!(jobs
            .permits(RequestType::Lock, &body(&["jobs/a", "jobs/b"]))
            .is_ok());
        let denied = jobs
            .permits(RequestType::Unlock, &body(&["jobs/a", "payroll"]))
            .unwrap_err();
        assert!(denied.contains("\"lock payroll\""), "{denied}");
        assert!(jobs.permits(RequestType::Inspect, &body(&[])).is_ok());
        assert!(jobs.permits(RequestType::Ping, &body(&[])).is_ok());
        let ci = &acl.certs["build.example"];
        assert!(ci.permits(RequestType::Lock, &body(&["ci/one"])).is_ok());
        assert!(ci.permits(RequestType::Lock, &body(&["ci/one/x"])).is_err());
        let stats = ci.permits(RequestType::Inspect, &body(&[])).unwrap_err();
        assert!(stats.contains("\"inspect *\""), "{stats}");
    }

    #[test]
    fn secrets_stay_out_of_debug_output_and_errors() {
        let acl = Acl::parse(FILE).unwrap();
        let shown = format!("{acl:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("alpha"),
            "{shown}"
        );
        let twice = Acl::parse("token a s3cret\ntoken b s3cret\n").unwrap_err();
        assert!(!format!("{twice:#}").contains("s3cret"), "{twice:#}");
    }

    #[test]
    fn mistakes_are_refused_with_their_line() {
        for (text, want) in [
            ("# nothing\n", "no token"),
            ("token jobs\n", "line 1"),
            ("token a x\n    lock j*bs/*\n", "line 2"),
            ("token a x\n    delete *\n", "unknown rule"),
            ("token a x\n    lock\n", "\"lock PATTERN\", as in"),
            ("token a x\n    inspect a/* b/*\n", "more than one pattern"),
            ("token a x\n    admin *\n", "takes no pattern"),
            ("identity a\nidentity a\n", "twice"),
            // A rule under a bare token, or under a mistyped header, is no
            // token of its own with every right.
            (
                "1f0c2a9e\n    admin\n",
                "line 2: the rule \"admin\" is under no",
            ),
            ("tokne jobs s3cret\n    lock jobs/*\n", "line 1: expected"),
            ("admin\n", "line 1"),
        ] {
            let e = format!("{:#}", Acl::parse(text).unwrap_err());
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains("s3cret"), "{e}");
        }
        // The old format, indented or not, still reads.
        let old = Acl::parse("alpha\n  beta\n").unwrap();
        assert!(old.by_token(b"beta").is_some_and(|id| id.is_admin()));
    }

    #[test]
    fn unusable_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Access::from_file(&dir.path().join("missing")).is_err());
        let path = dir.path().join("tokens");
        std::fs::write(&path, "alpha\n").unwrap();
        let access = Access::from_file(&path).unwrap();
        std::fs::write(&path, "token broken\n").unwrap();
        assert!(access.reload().is_err());
        // The rules in force are kept.
        assert!(access.identify("alpha", &[]).is_ok());
    }
}
