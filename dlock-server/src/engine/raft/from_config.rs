//! The raft engine: the lock table replicated on openraft (`crate::engine::raft`),
//! started from the server's flags.

use super::{ApplySink, Cluster, ClusterConfig, Member};
use crate::ops::config::{Config, InitialClusterState};
use anyhow::{bail, Context};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The first fencing token of every cluster's table.
pub const CLUSTER_FIRST_FENCE: u64 = 1;

/// The largest request the key flags allow, in key bytes, that a log
/// entry may have to carry: one request is one command, and an entry of a
/// command alone is not split. Well under the log's largest record (64
/// MiB) and the peer transport's largest frame, so a leader never meets an
/// entry it cannot write or send (which openraft takes for a storage
/// failure, stopping the node).
const MAX_REQUEST_KEY_BYTES: usize = 16 << 20;

fn check_request_fits_a_record(config: &Config) -> anyhow::Result<()> {
    // A key costs its bytes and a few of framing (the batcher's `weight`);
    // and no request is larger than its frame.
    let most = config
        .max_keys
        .saturating_mul(config.max_key_len.saturating_add(8))
        .min(config.max_frame);
    if most > MAX_REQUEST_KEY_BYTES {
        bail!(
            "--max-keys {} x --max-key-len {} within --max-frame {} allows requests of {most} key \
             bytes; a cluster node logs each request as one record, and takes at most \
             {MAX_REQUEST_KEY_BYTES}: lower them",
            config.max_keys,
            config.max_key_len,
            config.max_frame
        );
    }
    Ok(())
}

/// Starts this server's cluster node from `config` (`--data-dir` and the
/// cluster flags); clients reach this server at `client_addr`.
///
/// # Errors
/// The flags do not describe a node (a cluster of several without
/// `--peer-listen`, this node missing from `--initial-cluster`), the peer
/// port cannot be bound, or the node cannot start (see [`Cluster::start`]).
pub async fn start(
    config: &Config,
    client_addr: SocketAddr,
    stop: CancellationToken,
    sink: ApplySink,
) -> anyhow::Result<Cluster> {
    let data_dir = config
        .data_dir
        .clone()
        .context("a cluster node needs --data-dir")?;
    check_request_fits_a_record(config)?;
    // Said in the flags' own words: openraft's check names its fields.
    if config.heartbeat >= config.election_timeout {
        bail!(
            "--heartbeat ({}) must be shorter than --election-timeout ({}): a follower that hears \
             no heartbeat within its timeout stands for election (the defaults are 100ms and \
             200ms)",
            humantime::format_duration(config.heartbeat),
            humantime::format_duration(config.election_timeout)
        );
    }
    #[cfg(feature = "testing")]
    if let Some(seed) = config.test_volatile_disk {
        let lies = super::storage::use_volatile_disk(seed);
        tracing::warn!(
            seed,
            lies,
            "--test-volatile-disk: the raft log's unsynced writes live in memory; a SIGKILL is a power cut"
        );
    }
    let members: BTreeMap<u64, Member> = config
        .initial_cluster
        .iter()
        .flat_map(|m| &m.0)
        .map(|(id, client, peer)| {
            let member = Member {
                client_addr: client.clone(),
                peer_addr: peer.clone(),
            };
            (*id, member)
        })
        .collect();
    let peer_listen = match config.peer_listen {
        Some(a) => a,
        // A node that joins is dialled by the others at the address its
        // add names: one the kernel chose would change at its next start.
        None if config.initial_cluster_state == InitialClusterState::Existing => bail!(
            "a node that joins a running cluster (--initial-cluster-state existing) needs \
             --peer-listen: the other nodes reach it at that address, which `dlock cluster add` \
             names"
        ),
        None if members.len() <= 1 => SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        None => bail!("a cluster of several nodes needs --peer-listen"),
    };
    let peers = TcpListener::bind(peer_listen)
        .await
        .with_context(|| format!("cannot listen for peers on {peer_listen}"))?;
    let peer_addr = match &config.advertise_peer {
        Some(a) => a.clone(),
        None => peers.local_addr()?.to_string(),
    };
    let client = config
        .advertise_client
        .clone()
        .unwrap_or_else(|| client_addr.to_string());
    let cfg = ClusterConfig {
        node_id: config.node_id,
        cluster_id: config.cluster_id.clone(),
        data_dir,
        client_addr: client,
        peer_addr,
        ephemeral_peer_port: config.peer_listen.is_none(),
        initial_members: members,
        join_existing: config.initial_cluster_state == InitialClusterState::Existing,
        heartbeat: config.heartbeat,
        election_timeout: (
            config.election_timeout,
            config.election_timeout.saturating_mul(2),
        ),
        limits: config.table_limits(),
        // Part of the table's initial state, from which every node (and
        // every start, until the first snapshot) replays the log: it must
        // be the same everywhere, so not the clock-derived one a single
        // server starts from. Fences then increase through the log.
        first_fence: CLUSTER_FIRST_FENCE,
        sessions: true,
        peer_tls: match (
            &config.peer_tls_cert,
            &config.peer_tls_key,
            &config.peer_tls_ca,
        ) {
            (Some(cert), Some(key), Some(ca)) => Some(super::PeerTls::from_files(cert, key, ca)?),
            _ => None,
        },
        peer_routes: config.peer_route.iter().cloned().collect(),
        clock_rate: config.test_clock_rate,
        snapshot_every: config.snapshot_every,
        snapshot_write_rate: config.snapshot_write_rate << 20,
    };
    Cluster::start(cfg, peers, sink, stop).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn key_flags_that_allow_a_request_over_a_log_record_are_refused() {
        let parse = |args: &[&str]| Config::parse_from([&["s"], args].concat());
        assert!(check_request_fits_a_record(&parse(&[])).is_ok());
        // Within the default frame, any key limits are fine.
        let many = parse(&["--max-keys", "100000", "--max-key-len", "1024"]);
        assert!(check_request_fits_a_record(&many).is_ok());
        let big = parse(&[
            "--max-keys",
            "100000",
            "--max-key-len",
            "1024",
            "--max-frame",
            "67108864",
        ]);
        let err = check_request_fits_a_record(&big).expect_err("refused");
        assert!(err.to_string().contains("lower them"), "{err}");
    }
}
