//! The table's input and output: one [`Command`] in, one [`Output`] out.
//!
//! Everything that changes the table is a command, including the decisions
//! the server takes on its own (releasing a grant nobody received, stopping),
//! so a log of `(command, time)` pairs replays to the same state and the
//! same outputs.

use super::{Key, OwnerId, ReqId, Sharing, WaitLimit};
use serde::{de::Error as _, Deserialize, Deserializer, Serialize};
use std::time::Duration;

/// A change to the lock table, applied by [`super::LockTable::apply`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Asks for all of `keys` at once for `owner`.
    ///
    /// Duplicate keys are folded. Keys the owner already holds count as
    /// available, and are re-granted under the new token and lease. Keys
    /// named in `sharing` are taken shared (see `mode`). `lease`
    /// of `None` means the keys are held until unlocked or until the owner
    /// disconnects. Answered with [`Reply::Lock`].
    Lock {
        /// Who asks.
        owner: OwnerId,
        /// The keys, in any order.
        keys: Vec<Key>,
        /// Which keys are taken shared, under which limit. Left out of the
        /// encoding when none is, so an exclusive Lock is encoded as before.
        #[serde(default, skip_serializing_if = "Sharing::is_exclusive")]
        sharing: Sharing,
        /// How long it may wait, from the command's time.
        wait: WaitLimit,
        /// How long the keys are held once granted, from the grant's time.
        lease: Option<Duration>,
        /// The value each hold gets (see `value`). Left out of the encoding
        /// when empty, so a Lock without one is encoded as before.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        value: Vec<u8>,
    },
    /// Replaces the value of the named keys held by `owner`, or, when
    /// `fence` is given, held under that token by any owner (see
    /// `value`). Answered with [`Reply::NotHeld`].
    Proclaim {
        /// Who asks (ignored when `fence` is given).
        owner: OwnerId,
        /// The keys whose value changes.
        keys: Vec<Key>,
        /// The token the keys must be held under, if any.
        fence: Option<u64>,
        /// The new value.
        value: Vec<u8>,
    },
    /// Releases the named keys held by `owner`, or, when `fence` is given,
    /// held under that token by any owner. Answered with [`Reply::NotHeld`].
    Unlock {
        /// Who asks.
        owner: OwnerId,
        /// The keys to release.
        keys: Vec<Key>,
        /// The token the keys must be held under, if any.
        fence: Option<u64>,
    },
    /// Sets the lease of the named held keys (see [`Command::Unlock`] for
    /// which count as held) to end `lease` after the command's time. A key
    /// held without a lease becomes a lease and so outlives its owner's
    /// connection. Answered with [`Reply::NotHeld`].
    Renew {
        /// Who asks.
        owner: OwnerId,
        /// The keys whose lease moves.
        keys: Vec<Key>,
        /// The token the keys must be held under, if any.
        fence: Option<u64>,
        /// The new lease, from the command's time.
        lease: Duration,
    },
    /// A waiting request was granted but its requester will never learn it
    /// (its connection went away first): the keys are released as by an
    /// Unlock with the grant's token, so no lease outlives a client that
    /// never knew it held one.
    Undelivered {
        /// The keys of the grant.
        keys: Vec<Key>,
        /// The grant's fencing token.
        fence: u64,
    },
    /// `owner`'s connection ended: its waiting requests are withdrawn (never
    /// granted) and its keys held without a lease are released. Leases stay
    /// until they expire.
    Disconnect {
        /// Whose connection ended.
        owner: OwnerId,
    },
    /// Opens a session that ends `ttl` after the command's time unless a
    /// command naming it comes first (a table with sessions only: see
    /// `sessions`). Answered with [`Reply::Session`].
    OpenSession {
        /// How long the session lives without a command naming it.
        ttl: Duration,
        /// Who opened it (an access-control identity; empty without
        /// access control): only the same identity may resume it.
        #[serde(default)]
        identity: String,
    },
    /// Resumes `owner`'s session for a client that reconnected: keeps it
    /// alive as [`Command::KeepAlive`] does, if `identity` is the one that
    /// opened it. Answered with [`Reply::Session`], or
    /// [`Reply::UnknownSession`] when it ended or belongs to another
    /// identity (which is not told apart, so ids reveal nothing).
    Resume {
        /// The session.
        owner: OwnerId,
        /// Who asks to resume it.
        identity: String,
    },
    /// Keeps `owner`'s session alive for another TTL from the command's
    /// time. Answered with [`Reply::Session`], or
    /// [`Reply::UnknownSession`] when it ended.
    KeepAlive {
        /// The session.
        owner: OwnerId,
    },
    /// `cmd`, a Lock, Unlock or Renew of an open session, numbered `seq` in
    /// that session (see `resend`). A number the session applied already
    /// is answered with the reply it had (a Lock that waited: its outcome
    /// as [`Reply::Waited`], or the same [`LockResult::Waiting`] while it
    /// still waits) and not acted on again; one whose reply is forgotten
    /// is answered [`Reply::Forgotten`]. The session forgets the replies
    /// numbered up to `done` first. `seq` 0 is no number: `cmd` runs as if
    /// sent bare. A table without sessions answers
    /// [`Reply::UnknownSession`]; any other `cmd` does nothing and is
    /// answered [`Reply::None`].
    Sequenced {
        /// The command's number in its session, from 1.
        seq: u64,
        /// The client has the replies numbered up to here.
        done: u64,
        /// The command.
        cmd: Box<Command>,
    },
    /// The server is stopping: every waiting request is withdrawn and every
    /// later Lock is answered [`LockResult::ShuttingDown`], so keys released
    /// from now on are handed to nobody. Unlock, Renew and time still work.
    Close,
    /// The table is a backup being restored as a whole cluster's state
    /// (`dlock-server --restore-backup`): the next fencing token, session id
    /// and request id (ticket) become at least `fence_floor`, above every
    /// one the old cluster may have issued after the backup, and every
    /// session ends as a disconnect ends
    /// it (its waits withdrawn, its keys without a lease released), so no
    /// client resumes into a table that forgot its later grants. Leases
    /// stay, under their old tokens.
    Restore {
        /// The least token the next grant gets.
        fence_floor: u64,
    },
    /// Time has reached the command's time: leases and wait limits due by
    /// then expire. The only command that expires anything: the others run
    /// at their time but leave what fell due before it for the next Advance,
    /// so expiry happens at the points the caller (or the log) chose.
    Advance,
}

impl Command {
    /// The owner the command acts for, when it names one that must be an
    /// open session in a table with sessions.
    pub fn owner(&self) -> Option<OwnerId> {
        match self {
            Command::Lock { owner, .. }
            | Command::Unlock { owner, .. }
            | Command::Renew { owner, .. }
            | Command::Proclaim {
                owner, fence: None, ..
            } => Some(*owner),
            Command::Sequenced { cmd, .. } => match **cmd {
                Command::Sequenced { .. } => None,
                ref inner => inner.owner(),
            },
            Command::Undelivered { .. }
            | Command::Proclaim { fence: Some(_), .. }
            | Command::Disconnect { .. }
            | Command::OpenSession { .. }
            | Command::Resume { .. }
            | Command::KeepAlive { .. }
            | Command::Close
            | Command::Restore { .. }
            | Command::Advance => None,
        }
    }
}

/// What a command did, for the caller to deliver.
///
/// Serialisable so that a replicated log's apply step can hand it back as
/// the answer to the command it came from.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    /// The answer to the command itself.
    pub reply: Reply,
    /// Waiting requests that finished as a consequence, in the order they
    /// were decided: fencing tokens of grants increase along it.
    pub woken: Vec<Woken>,
    /// Waiting requests withdrawn without an outcome (Disconnect of their
    /// owner, Close), in request order.
    pub withdrawn: Vec<ReqId>,
    /// Keys whose lease ran out (Advance).
    pub expired_leases: usize,
    /// Sessions whose TTL ran out (Advance), ended as by Disconnect.
    pub ended_sessions: Vec<OwnerId>,
}

/// The part of an [`Output`] that answers the command itself.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// The command has no answer of its own: Undelivered, Disconnect, Close,
    /// Advance.
    #[default]
    None,
    /// What became of a Lock.
    Lock(LockResult),
    /// Unlock, Renew and Proclaim: the named keys that were not held, sorted; all
    /// others were acted on.
    NotHeld(Vec<Key>),
    /// OpenSession and KeepAlive: the session and its TTL.
    Session {
        /// The session's id, its owner id in every later command.
        id: OwnerId,
        /// How long it lives without a command naming it.
        ttl: Duration,
    },
    /// A table with sessions: the command named an owner that is not an
    /// open session (or it was OpenSession or Sequenced on a table without
    /// sessions). Nothing changed.
    UnknownSession,
    /// Sequenced, a Lock sent again that had waited: the outcome of its
    /// wait, as [`Woken`] delivered it the first time.
    Waited {
        /// The request, as [`LockResult::Waiting`] named it.
        req: ReqId,
        /// What happened to it.
        outcome: WaitOutcome,
    },
    /// Sequenced: the number was applied, but its reply is forgotten (the
    /// client said it had it, or the session's memory was full). Nothing
    /// changed.
    Forgotten,
}

/// What became of a Lock request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockResult {
    /// All keys are now held under this fencing token.
    Granted {
        /// The fencing token of the grant.
        fence: u64,
    },
    /// The request waits; its outcome comes later as a [`Woken`].
    Waiting(ReqId),
    /// `WaitLimit::No` and these keys were not available.
    Busy(Vec<Key>),
    /// The named limit would be exceeded; nothing changed.
    LimitReached(#[serde(deserialize_with = "limit_name")] LimitName),
    /// The table was closed ([`Command::Close`]); nothing changed.
    ShuttingDown,
    /// The owner holds or waits for these keys in the other mode (shared
    /// against exclusive: an upgrade or a downgrade); nothing changed.
    ModeConflict(Vec<Key>),
    /// These keys are held or waited for shared under another limit than
    /// the request's; nothing changed.
    LimitMismatch(Vec<Key>),
}

/// The outcome of a request that had to wait.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitOutcome {
    /// The request holds its keys under this fencing token.
    Granted {
        /// The fencing token of the grant.
        fence: u64,
    },
    /// The wait limit passed; these keys were still unavailable.
    TimedOut(Vec<Key>),
    /// Granting it would have exceeded the held-keys limit; it was withdrawn.
    LimitReached,
}

/// A waiting request that finished, for the caller to answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Woken {
    /// The request, as returned in [`LockResult::Waiting`].
    pub req: ReqId,
    /// Its owner.
    pub owner: OwnerId,
    /// The keys it asked for, sorted, without duplicates.
    pub keys: Vec<Key>,
    /// What happened to it.
    pub wake: WaitOutcome,
}

/// The name of a limit in [`LockResult::LimitReached`]. An alias, so that
/// serde's derive does not take the field for a string borrowed from the
/// input (it does so for a literal `&str`), which would keep outputs from
/// being decoded into owned values; `limit_name` decodes it instead.
pub type LimitName = &'static str;

/// Every name [`LockResult::LimitReached`] carries (see `LockTable::lock`).
/// A `&'static str` cannot be borrowed from the bytes being decoded, so a
/// decoded name is matched back to one of these.
const LIMIT_NAMES: [&str; 2] = ["held keys", "waiters"];

fn limit_name<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    let name = String::deserialize(d)?;
    LIMIT_NAMES
        .into_iter()
        .find(|n| *n == name)
        .ok_or_else(|| D::Error::custom(format!("unknown limit {name:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{LockTable, TableLimits};

    #[test]
    fn every_limit_the_table_names_survives_a_serde_round_trip() {
        // One of each limit, straight from the table, so a new limit name
        // that LIMIT_NAMES does not know fails here.
        let mut table = LockTable::new(
            TableLimits {
                max_waiters: 0,
                max_held_keys: 1,
            },
            1,
        );
        let lock = |owner, key: &str| Command::Lock {
            owner,
            keys: vec![key.into()],
            sharing: Sharing::exclusive(),
            wait: super::super::WaitLimit::Forever,
            lease: None,
            value: Vec::new(),
        };
        let at = crate::table::Time::ZERO;
        table.apply(lock(1, "a"), at);
        let outputs = [table.apply(lock(2, "b"), at), table.apply(lock(2, "a"), at)];
        for out in outputs {
            assert!(matches!(
                out.reply,
                Reply::Lock(LockResult::LimitReached(_))
            ));
            let json = serde_json::to_string(&out).expect("encodes");
            let back: Output = serde_json::from_str(&json).expect("decodes");
            assert_eq!(back, out);
        }
        let bad = r#"{"reply":{"Lock":{"LimitReached":"gremlins"}},"woken":[],"withdrawn":[],"expired_leases":0}"#;
        assert!(serde_json::from_str::<Output>(bad).is_err());
    }
}
