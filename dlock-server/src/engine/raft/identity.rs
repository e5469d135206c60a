//! Which node of which cluster a data directory belongs to: the file
//! `identity` in it, written at the node's first start and checked at
//! every later one, before the log is opened.
//!
//! Nothing else in a data directory says whose it is: the log and the vote
//! carry no node id. Started under another node's id, a directory makes a
//! second node of that id, with a vote of its own (Raft assumes one vote
//! per id, and terms climb as the two fight); started as a node of another
//! cluster (a single server's directory, for one), its log and commit
//! index are not that cluster's, and openraft stops on an assertion. So a
//! start whose flags say otherwise than the file is refused, with a message
//! that says what to do.
//!
//! The file records the node id, the cluster id (`--cluster-id`) and the
//! role: a single server (a cluster of one, started without a list of
//! other members) or a node of a cluster of several. The role is checked
//! only when the flags state one, since a restart needs no
//! `--initial-cluster`: the flags name other members, or say
//! `--initial-cluster-state existing`, so this is a cluster node. There is
//! no identity of the cluster itself (random, agreed at bootstrap): two
//! clusters started with the same flags look alike here.
//!
//! A node that bootstrapped a cluster (a fresh directory, `--initial-cluster`
//! and state `new`) also records the list it was given, in canonical form
//! (`initial_list`): its peers compare it with their own at every
//! connection. Later starts keep it whatever their flags say (the first
//! membership is in the log by then); a node that joined, or whose
//! directory predates the record, has none.
//!
//! A directory of an older version has no file: its first start on this
//! version writes one from the flags (there is nothing to check them
//! against), with the role only if the flags state one. A backup prepared
//! by `--restore-backup` keeps the file without its node id, since it is
//! copied to every node: each node's first start fills in its own.
//!
//! One JSON object, `format` first; a later format is refused rather than
//! misread. Written whole to `identity.tmp`, synced, renamed over
//! `identity`, and the directory synced: a crash leaves the old file or the
//! new one.

use super::storage::Storage;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The file's name in the data directory.
pub(crate) const FILE: &str = "identity";
/// Where the file is written before it is renamed into place.
const TEMP: &str = "identity.tmp";
/// The format this version writes and reads.
const FORMAT: u32 = 1;
/// A larger file is not one this version wrote: refused as damaged rather
/// than read whole.
/// Most of it is the initial list: 64 KiB is hundreds of members.
const MAX_BYTES: u64 = 64 << 10;

/// What a data directory was made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Role {
    /// A cluster of one, started without other members: `--data-dir` alone.
    SingleServer,
    /// A node of a cluster of several (`--initial-cluster` naming others,
    /// or added with `--initial-cluster-state existing`).
    ClusterNode,
}

/// The contents of the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Identity {
    format: u32,
    /// `None`: not known (a directory of an older version, stamped by a
    /// start whose flags stated none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    role: Option<Role>,
    /// `None`: a backup prepared by `--restore-backup`, not yet started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node_id: Option<u64>,
    cluster_id: String,
    /// The `--initial-cluster` list this node bootstrapped with, canonical
    /// (`initial_list::canonical`). `None`: it joined a running cluster,
    /// started without a list, or the directory predates the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    initial_cluster: Option<String>,
}

impl Identity {
    /// The `--initial-cluster` list this node bootstrapped with, if known.
    pub(crate) fn initial_cluster(&self) -> Option<&str> {
        self.initial_cluster.as_deref()
    }
}

/// Who this start's flags say the node is.
#[derive(Debug, Clone)]
pub(crate) struct Claim {
    /// `--node-id`.
    pub(crate) node_id: u64,
    /// `--cluster-id`.
    pub(crate) cluster_id: String,
    /// `Some(ClusterNode)` when the flags name other members or say the
    /// node joins; `None` otherwise (a restart needs no list, so they say
    /// nothing either way).
    pub(crate) role: Option<Role>,
    /// The list a fresh directory bootstraps with: `--initial-cluster` in
    /// canonical form with state `new`; `None` with `existing` or no list.
    pub(crate) initial_cluster: Option<String>,
}

impl Claim {
    /// The identity a fresh directory gets: started without other members,
    /// it bootstraps a cluster of one.
    pub(crate) fn for_fresh(&self) -> Identity {
        Identity {
            format: FORMAT,
            role: Some(self.role.unwrap_or(Role::SingleServer)),
            node_id: Some(self.node_id),
            cluster_id: self.cluster_id.clone(),
            initial_cluster: self.initial_cluster.clone(),
        }
    }

    /// The identity a directory of an older version gets at its first
    /// start on this one: the flags as they are, but no initial list (what
    /// it bootstrapped with is not known).
    pub(crate) fn for_unstamped(&self) -> Identity {
        Identity {
            format: FORMAT,
            role: self.role,
            node_id: Some(self.node_id),
            cluster_id: self.cluster_id.clone(),
            initial_cluster: None,
        }
    }
}

fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// Reads `dir`'s file; `None` if there is none.
///
/// # Errors
/// It cannot be read, does not decode, or has a later format: the message
/// names the file and says what to do.
pub(crate) fn read(dir: &Path) -> anyhow::Result<Option<Identity>> {
    let file = path(dir);
    let disk = Storage::Real;
    let f = match disk.open(&file) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot open {}", file.display())),
    };
    let len = f
        .len()
        .with_context(|| format!("cannot read {}", file.display()))?;
    if len > MAX_BYTES {
        return Err(damaged(
            &file,
            &format!("{len} bytes, more than it ever holds"),
        ));
    }
    let mut bytes = vec![0; usize::try_from(len).unwrap_or(0)];
    f.read_exact_at(&mut bytes, 0)
        .with_context(|| format!("cannot read {}", file.display()))?;
    decode(&file, &bytes).map(Some)
}

fn decode(file: &Path, bytes: &[u8]) -> anyhow::Result<Identity> {
    /// Only the format, read first so that a later one is named as such
    /// rather than as damage.
    #[derive(Deserialize)]
    struct Format {
        format: u32,
    }
    let Format { format } =
        serde_json::from_slice(bytes).map_err(|e| damaged(file, &e.to_string()))?;
    if format > FORMAT {
        anyhow::bail!(
            "{} has format {format}, written by a later version of dlock-server (this one reads \
             format {FORMAT}): run that version on this data directory",
            file.display()
        );
    }
    serde_json::from_slice(bytes).map_err(|e| damaged(file, &e.to_string()))
}

fn damaged(file: &Path, why: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{} is damaged ({why}): it records which node of which cluster this data directory \
         belongs to, and this node does not start without knowing. If you are sure the directory \
         is this node's, delete the file: the next start writes it again from the flags",
        file.display()
    )
}

/// Writes `identity` as `dir`'s file, atomically and durably.
///
/// # Errors
/// It cannot be written, synced or renamed into place.
pub(crate) fn write(dir: &Path, identity: &Identity) -> anyhow::Result<()> {
    let file = path(dir);
    let temp = dir.join(TEMP);
    let bytes = serde_json::to_vec(identity).context("cannot encode the identity")?;
    let disk = Storage::Real;
    let written = disk.create(&temp, false).and_then(|f| {
        f.write_all_at(&bytes, 0)?;
        f.sync_all()
    });
    written
        .and_then(|()| disk.rename(&temp, &file))
        .and_then(|()| disk.sync_dir(dir))
        .with_context(|| format!("cannot write {}", file.display()))
}

/// `found` as a prepared backup: without its node id, for every node's
/// first start to fill in.
pub(crate) fn for_restore(found: &Identity) -> Identity {
    Identity {
        node_id: None,
        ..found.clone()
    }
}

/// What a later start writes over `found`, if anything: a prepared backup
/// gets this node's id, a directory of unknown role the one the flags
/// state. The initial list is kept, unless the directory is still `fresh`
/// (nothing in its log: a start stopped before it bootstrapped), where it
/// is the list this start bootstraps with. Call after [`check`].
pub(crate) fn completed(found: &Identity, claim: &Claim, fresh: bool) -> Option<Identity> {
    let initial_cluster = match fresh {
        true => claim.initial_cluster.clone(),
        false => found.initial_cluster.clone(),
    };
    let done = Identity {
        node_id: Some(claim.node_id),
        role: found.role.or(claim.role),
        initial_cluster,
        ..found.clone()
    };
    (done != *found).then_some(done)
}

/// Refuses a start whose flags (`claim`) say another node, another cluster
/// or another role than `found`, the file of `dir`.
///
/// # Errors
/// The mismatch, with what to do.
pub(crate) fn check(dir: &Path, found: &Identity, claim: &Claim) -> anyhow::Result<()> {
    let file = path(dir);
    let what = match (found.role, found.node_id) {
        (Some(Role::SingleServer), Some(id)) => format!("a single server (node {id})"),
        (Some(Role::ClusterNode), Some(id)) => format!("node {id}"),
        (None, Some(id)) => format!("node {id}"),
        (_, None) => "a backup prepared for every node".to_owned(),
    };
    if let Some(id) = found.node_id.filter(|&id| id != claim.node_id) {
        let default = if claim.node_id == 1 {
            " (without --node-id a server is node 1)"
        } else {
            ""
        };
        anyhow::bail!(
            "the data directory {} belongs to {what} of cluster '{}', and this server was started \
             as node {}{default}. A node must only ever start on its own data directory: two \
             processes under one node id would each keep a vote, and Raft's safety rests on one \
             vote per node. Give this node its own data directory (--data-dir; an empty one for a \
             new node), or, if this directory is the right one, start it with --node-id {id}. \
             A copy of another node's directory (a backup) must first be prepared with \
             --restore-backup. ({} records whose directory it is; see docs/CLUSTER.md, \"Whose \
             a data directory is\".)",
            dir.display(),
            found.cluster_id,
            claim.node_id,
            file.display()
        );
    }
    if found.cluster_id != claim.cluster_id {
        anyhow::bail!(
            "the data directory {} belongs to {what} of cluster '{}', and this server was started \
             with --cluster-id '{}'. Start it with --cluster-id '{}', or give this node a data \
             directory of its own cluster (an empty one for a new node). ({} records whose the \
             directory is.)",
            dir.display(),
            found.cluster_id,
            claim.cluster_id,
            found.cluster_id,
            file.display()
        );
    }
    if found.role == Some(Role::SingleServer) && claim.role == Some(Role::ClusterNode) {
        anyhow::bail!(
            "the data directory {} belongs to {what}, started without other members, and this \
             server was started as a node of a cluster of several (--initial-cluster naming \
             other nodes, or --initial-cluster-state existing): its log and vote are not that \
             cluster's. Give this node its own data directory (an empty one for a new node). If \
             this single server was since grown into a cluster (dlock cluster add), start it \
             without --initial-cluster and --initial-cluster-state: a node reads its membership \
             from its data directory. ({} records whose directory it is.)",
            dir.display(),
            file.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(node_id: u64, role: Option<Role>) -> Claim {
        Claim {
            node_id,
            cluster_id: "dlock".into(),
            role,
            initial_cluster: None,
        }
    }

    /// A node of the list `list` started with state `new`.
    fn bootstrapping(node_id: u64, list: &str) -> Claim {
        Claim {
            initial_cluster: Some(list.into()),
            ..claim(node_id, Some(Role::ClusterNode))
        }
    }

    #[test]
    fn a_written_identity_reads_back_and_matches_its_own_flags() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        assert_eq!(read(dir.path()).expect("read"), None);
        let c = claim(2, Some(Role::ClusterNode));
        write(dir.path(), &c.for_fresh()).expect("write");
        let found = read(dir.path()).expect("read").expect("written");
        assert_eq!(found, c.for_fresh());
        check(dir.path(), &found, &c).expect("its own flags");
        // A restart needs no list: no role stated is no mismatch.
        check(dir.path(), &found, &claim(2, None)).expect("a restart without a list");
        assert_eq!(completed(&found, &c, false), None);
        assert!(!dir.path().join(TEMP).exists());
    }

    #[test]
    fn another_node_cluster_or_role_is_refused() {
        let dir = Path::new("/d");
        let node2 = claim(2, Some(Role::ClusterNode)).for_fresh();
        let err = check(dir, &node2, &claim(1, None)).expect_err("another node");
        let err = err.to_string();
        assert!(err.contains("belongs to node 2"), "{err}");
        assert!(err.contains("--node-id 2"), "{err}");
        assert!(err.contains("/d/identity"), "{err}");
        let other = Claim {
            cluster_id: "other".into(),
            ..claim(2, None)
        };
        let err = check(dir, &node2, &other).expect_err("another cluster");
        assert!(err.to_string().contains("--cluster-id 'dlock'"), "{err}");
        let single = claim(1, None).for_fresh();
        let err = check(dir, &single, &claim(1, Some(Role::ClusterNode)))
            .expect_err("a single server's directory as a cluster node's");
        assert!(err.to_string().contains("a single server"), "{err}");
    }

    #[test]
    fn a_restored_backup_takes_each_nodes_id_at_its_first_start() {
        let dir = Path::new("/d");
        let backup = for_restore(&claim(2, Some(Role::ClusterNode)).for_fresh());
        let node3 = claim(3, None);
        check(dir, &backup, &node3).expect("any node of the cluster");
        let done = completed(&backup, &node3, false).expect("its id filled in");
        assert_eq!(done.node_id, Some(3));
        assert_eq!(done.role, Some(Role::ClusterNode));
    }

    #[test]
    fn a_file_without_the_initial_list_decodes_as_not_known() {
        let file = Path::new("/d/identity");
        let old = br#"{"format":1,"role":"cluster_node","node_id":2,"cluster_id":"dlock"}"#;
        let found = decode(file, old).expect("a file of an older version");
        assert_eq!(found.initial_cluster(), None);
        assert_eq!(found, claim(2, Some(Role::ClusterNode)).for_unstamped());
        // Still format 1, and without the field when there is no list: an
        // older version reads what this one writes.
        let written = serde_json::to_vec(&found).expect("encode");
        assert_eq!(&written[..], &old[..]);
    }

    #[test]
    fn the_initial_list_is_recorded_at_a_bootstrap_and_kept_after() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let list = "1=a@b,2=c@d";
        write(dir.path(), &bootstrapping(2, list).for_fresh()).expect("write");
        let found = read(dir.path()).expect("read").expect("written");
        assert_eq!(found.initial_cluster(), Some(list));
        assert_eq!(found.format, 1);
        // A later start's flags say another list, or none: the record stays.
        check(dir.path(), &found, &bootstrapping(2, "1=a@b,2=c@e")).expect("a restart");
        assert_eq!(completed(&found, &bootstrapping(2, "1=x@y"), false), None);
        assert_eq!(completed(&found, &claim(2, None), false), None);
        // A backup keeps it, for every node it is restored on.
        let backup = for_restore(&found);
        let done = completed(&backup, &claim(3, None), false).expect("its id filled in");
        assert_eq!(done.initial_cluster(), Some(list));
        // A start stopped before it bootstrapped: the next one's list goes in.
        let again = completed(&found, &bootstrapping(2, "1=a@b,2=c@e"), true).expect("rewritten");
        assert_eq!(again.initial_cluster(), Some("1=a@b,2=c@e"));
    }

    #[test]
    fn a_node_that_joins_or_starts_without_a_list_records_none() {
        // start.rs says no list for `existing`; a cluster of one has none.
        let joining = claim(4, Some(Role::ClusterNode));
        assert_eq!(joining.for_fresh().initial_cluster(), None);
        assert_eq!(claim(1, None).for_fresh().initial_cluster(), None);
        let encoded = serde_json::to_string(&joining.for_fresh()).expect("encode");
        assert!(!encoded.contains("initial_cluster"), "{encoded}");
    }

    #[test]
    fn a_damaged_or_later_file_is_refused_naming_it() {
        let file = Path::new("/d/identity");
        for bytes in [&b""[..], b"{\"format\":1", b"\0\0\0", b"{\"format\":1}"] {
            let err = decode(file, bytes).expect_err("damaged").to_string();
            assert!(err.contains("/d/identity is damaged"), "{err}");
        }
        let err = decode(file, br#"{"format":2,"anything":true}"#).expect_err("later");
        assert!(err.to_string().contains("later version"), "{err}");
    }
}
