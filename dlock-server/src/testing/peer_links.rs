//! A [`FreezableProxy`] on every directed peer link of a cluster of node
//! processes: node `a` dials node `b` through a proxy of its own, so a test
//! can cut one link, one direction, or every link of a node.

use super::nodes::NodeProcesses;
use super::proxy::FreezableProxy;

/// The proxies; `link(a, b)` carries what node `a` sends to node `b` (and
/// `b`'s answers on those connections).
#[derive(Debug)]
pub struct PeerLinks {
    proxies: Vec<Vec<Option<FreezableProxy>>>,
}

impl PeerLinks {
    /// Puts a proxy on every link of `nodes`, which must not run yet: the
    /// routes take effect from each node's next start.
    pub async fn install(nodes: &mut NodeProcesses) -> PeerLinks {
        let n = nodes.len();
        let mut proxies = Vec::with_capacity(n);
        for from in 0..n {
            let mut row = Vec::with_capacity(n);
            for to in 0..n {
                if from == to {
                    row.push(None);
                    continue;
                }
                let p = FreezableProxy::start(nodes.peer_addr(to)).await;
                nodes.route(from, to, p.addr);
                row.push(Some(p));
            }
            proxies.push(row);
        }
        PeerLinks { proxies }
    }

    /// The proxy of the link `from → to`; `None` for a node to itself or
    /// an index out of range.
    pub fn link(&self, from: usize, to: usize) -> Option<&FreezableProxy> {
        self.proxies.get(from)?.get(to)?.as_ref()
    }

    /// Freezes (`cut`) or thaws every link to and from node `i`: it is cut
    /// off from every other node, and still reachable by clients.
    pub fn isolate(&self, i: usize, cut: bool) {
        for (from, row) in self.proxies.iter().enumerate() {
            for (to, p) in row.iter().enumerate() {
                match p {
                    Some(p) if from == i || to == i => {
                        if cut {
                            p.freeze()
                        } else {
                            p.thaw()
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}
