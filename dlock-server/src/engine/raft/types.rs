//! The types openraft is instantiated with: what a log entry carries, the
//! type config, and the aliases the other files use. Who a member is and
//! the ids that name log positions are in `ids.rs`, which the snapshot file
//! uses too (the type config names the snapshot file's type).

pub use super::ids::{LogId, Member, NodeId, SnapshotMeta, StoredMembership, Vote};
use crate::table::{Command, Output, Time};
use serde::{Deserialize, Serialize};

/// A log entry's payload: table commands and the cluster time the leader
/// stamped them with. Every node applies `cmds`, in order, each at `at`,
/// so every node's table takes the same steps (see the table's determinism
/// contract). Proposals that queue up behind each other share one entry
/// (see `batcher`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "StampedRepr", into = "StampedRepr")]
pub struct Stamped {
    /// When, on the cluster's timeline.
    pub at: Time,
    /// What, in order; never empty.
    pub cmds: Vec<Command>,
}

/// How a [`Stamped`] is encoded. One command is `cmd`, exactly as every
/// entry was encoded before entries carried several, so old logs read as
/// they are and a one-command entry reads on any version. Several are
/// `cmds` and no `cmd`: a node that predates them fails to decode the
/// entry (a missing field) instead of applying only part of it.
#[derive(Serialize, Deserialize)]
struct StampedRepr {
    at: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cmd: Option<Command>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    cmds: Vec<Command>,
}

impl From<Stamped> for StampedRepr {
    fn from(s: Stamped) -> StampedRepr {
        let mut cmds = s.cmds;
        let cmd = if cmds.len() == 1 { cmds.pop() } else { None };
        StampedRepr {
            at: s.at,
            cmd,
            cmds,
        }
    }
}

impl TryFrom<StampedRepr> for Stamped {
    type Error = &'static str;

    fn try_from(r: StampedRepr) -> Result<Stamped, Self::Error> {
        let cmds = match (r.cmd, r.cmds) {
            (Some(cmd), more) if more.is_empty() => vec![cmd],
            (None, cmds) if cmds.len() > 1 => cmds,
            (Some(_), _) => return Err("an entry with both `cmd` and `cmds`"),
            (None, _) => return Err("an entry with `cmds` of fewer than two commands"),
        };
        Ok(Stamped { at: r.at, cmds })
    }
}

/// What applying one entry returned: one [`Output`] per command, in order
/// (none for an entry without commands: a blank or a membership change).
pub type Outputs = Vec<Output>;

openraft::declare_raft_types!(
    /// openraft's view of dlock: node ids are `u64`, nodes are [`Member`]s,
    /// entries carry [`Stamped`] commands and return their [`Outputs`].
    pub TypeConfig:
        D = Stamped,
        R = Outputs,
        NodeId = u64,
        Node = Member,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = super::snapshot_file::SnapshotData,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A log entry.
pub type Entry = openraft::Entry<TypeConfig>;
/// The Raft handle.
pub type Raft = openraft::Raft<TypeConfig>;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stamped(cmds: Vec<Command>) -> Stamped {
        Stamped {
            at: Time::from_micros(7),
            cmds,
        }
    }

    #[test]
    fn one_command_is_encoded_as_entries_were_before_batches() {
        let one = stamped(vec![Command::Advance]);
        let encoded = serde_json::to_value(&one).unwrap();
        assert_eq!(encoded, json!({"at": 7, "cmd": "Advance"}));
        // An entry a node wrote before batches reads back as one command.
        let old: Stamped = serde_json::from_value(json!({"at": 7, "cmd": "Advance"})).unwrap();
        assert_eq!(old, one);
    }

    #[test]
    fn several_commands_have_no_cmd_field_so_older_nodes_refuse_them() {
        let two = stamped(vec![Command::Advance, Command::Disconnect { owner: 3 }]);
        let encoded = serde_json::to_value(&two).unwrap();
        assert!(encoded.get("cmd").is_none(), "{encoded}");
        assert_eq!(serde_json::from_value::<Stamped>(encoded).unwrap(), two);
    }

    #[test]
    fn malformed_entries_are_refused() {
        for bad in [
            json!({"at": 7}),
            json!({"at": 7, "cmds": ["Advance"]}),
            json!({"at": 7, "cmd": "Advance", "cmds": ["Advance", "Advance"]}),
        ] {
            assert!(
                serde_json::from_value::<Stamped>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }
}
