//! The cluster requests: a node's view of the cluster, adding and removing
//! members. A single server has no cluster and says so.

use super::reply::{self, Refusal};
use super::{Answer, Service};
use crate::engine::raft::{ClusterStatus, Member};
use dlock_proto::proto::{ClusterInfo, ClusterMember, Request, RequestType, ResponseStatus};

impl Service {
    /// ClusterStatus, ClusterAdd or ClusterRemove (`kind`).
    pub(super) async fn admin(&self, req: Request, kind: RequestType) -> Result<Answer, Refusal> {
        let Some(cluster) = self.engine.cluster() else {
            return Err(reply::not_a_cluster_node());
        };
        let id = req.id;
        if kind != RequestType::ClusterStatus {
            let args = req.cluster.unwrap_or_default();
            if args.node_id == 0 {
                return Err(reply::node_id_missing());
            }
            if kind == RequestType::ClusterAdd {
                if args.client_addr.is_empty() || args.peer_addr.is_empty() {
                    return Err(reply::add_needs_addresses());
                }
                for addr in [&args.client_addr, &args.peer_addr] {
                    if !is_host_and_port(addr) {
                        return Err(reply::not_an_address(addr));
                    }
                }
                // A typo that names a member's address would make the new
                // voter that member, counted twice in every majority.
                let taken = cluster.status().members.into_iter().find(|m| {
                    m.id != args.node_id
                        && [&m.client_addr, &m.peer_addr]
                            .iter()
                            .any(|a| **a == args.client_addr || **a == args.peer_addr)
                });
                if let Some(m) = taken {
                    return Err(reply::address_taken(m.id));
                }
                let member = Member {
                    client_addr: args.client_addr,
                    peer_addr: args.peer_addr,
                };
                cluster.add_node(args.node_id, member).await?;
            } else {
                let members = cluster.status().members;
                if !members.iter().any(|m| m.id == args.node_id) {
                    return Err(reply::not_a_member(args.node_id));
                }
                cluster.remove_node(args.node_id).await?;
            }
        }
        let mut r = reply::response(id, ResponseStatus::Ok);
        r.cluster = Some(Box::new(cluster_info(&cluster.status())));
        Ok(Answer::Now(r))
    }
}

/// Whether `addr` is `HOST:PORT` (a name or an address, `[v6]:PORT`
/// included) with a port from 1 to 65535: what a node dials.
fn is_host_and_port(addr: &str) -> bool {
    addr.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && !host.chars().any(char::is_whitespace)
            && port.parse::<u16>().is_ok_and(|p| p != 0)
    })
}

/// The wire form of a node's view of the cluster.
fn cluster_info(s: &ClusterStatus) -> ClusterInfo {
    ClusterInfo {
        node_id: s.node_id,
        role: format!("{:?}", s.role),
        term: s.term,
        leader_id: s.leader.unwrap_or(0),
        last_log_index: s.last_log_index.unwrap_or(0),
        committed_index: s.committed_index.unwrap_or(0),
        last_applied_index: s.last_applied_index.unwrap_or(0),
        members: s
            .members
            .iter()
            .map(|m| ClusterMember {
                node_id: m.id,
                client_addr: m.client_addr.clone(),
                peer_addr: m.peer_addr.clone(),
                voter: m.voter,
                matched_index: m.matched_index.unwrap_or(0),
                lag: m.lag.unwrap_or(0),
                replication_known: m.lag.is_some(),
                unreachable_micro: m.unreachable_for.map_or(0, |d| {
                    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
                }),
            })
            .collect(),
        version: crate::VERSION.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_added_node_needs_a_host_and_a_port() {
        for good in ["127.0.0.1:7436", "db1.example:7437", "[::1]:7437"] {
            assert!(super::is_host_and_port(good), "{good}");
        }
        for bad in ["foo", "foo:", ":7437", "h:0", "h:70000", "h:x", "a b:1", ""] {
            assert!(!super::is_host_and_port(bad), "{bad}");
        }
    }
}
