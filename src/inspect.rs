//! What [`Client::inspect`](crate::Client::inspect) reports, as Rust types:
//! a [`KeyState`] per key with every [`Holder`], instead of the wire's
//! `KeyInfo`, whose zeros and empty strings stand for "none" and whose
//! exclusive holder sits in other fields than the shared ones.

use crate::proto::{KeyHolder, KeyInfo, ServerStats};
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One key as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyState {
    /// The key.
    pub key: String,
    /// Every holder, lowest fencing token first: the first has held the
    /// key longest. Empty when the key is free; one holder when it is held
    /// exclusively. Of a key with thousands of shared holders, the server
    /// may list only the oldest, the caller's own and the latest (see
    /// `holders_omitted`).
    pub holders: Vec<Holder>,
    /// Holders the server left out (none of them the caller's), to
    /// keep its answer within the 4 MiB response frame; 0 when `holders`
    /// lists every one.
    pub holders_omitted: u32,
    /// Requests waiting for the key.
    pub waiters: u32,
    /// The key is held shared.
    pub shared: bool,
    /// The limit its shared holders agreed on (a semaphore); 0 is none.
    pub limit: u32,
    /// How long the first of its waiters has waited (zero when none
    /// waits, or the server is older than this field).
    pub waited_for: Duration,
}

/// One holder of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The fencing token of its grant.
    pub fence: u64,
    /// Time left on its lease; `None` when held without a lease (until
    /// unlocked or its connection or session ends).
    pub lease_remaining: Option<Duration>,
    /// Held by the connection (or session) that asked.
    pub held_by_caller: bool,
    /// Address of the holder's connection, when it is connected to the
    /// server that answered (a cluster node never knows it).
    pub holder_addr: Option<SocketAddr>,
    /// The value the holder set with its Lock or a later Proclaim; empty
    /// when none. An election's leader puts its identity here.
    pub value: Vec<u8>,
    /// How long it has held the key, as the server counts.
    pub held_for: Duration,
    /// When it was granted, by the server's clock: the answer's time
    /// less `held_for`.
    pub since: SystemTime,
}

/// The server's counts and its busiest keys, as
/// [`Client::overview`](crate::Client::overview) reports them.
#[derive(Debug, Clone, PartialEq)]
pub struct Overview {
    /// Connections, held keys, waiting requests, sessions, and the grant
    /// and hand-off counters (`busiest` is moved to the field below).
    pub stats: ServerStats,
    /// The busiest keys: the most waiters first, then held longest.
    pub busiest: Vec<KeyState>,
    /// The server's clock when it answered.
    pub server_time: SystemTime,
}

impl KeyState {
    /// From the wire's `KeyInfo`, answered at `server_time` (the
    /// response's `server_unix_time`).
    pub fn from_proto(info: KeyInfo, server_time: SystemTime) -> KeyState {
        let mut holders: Vec<Holder> = if info.holders.is_empty() {
            if info.fence == 0 {
                Vec::new()
            } else {
                vec![Holder::new(
                    KeyHolder {
                        fence: info.fence,
                        lease_remaining_micro: info.lease_remaining_micro,
                        held_by_caller: info.held_by_caller,
                        holder_addr: info.holder_addr,
                        value: info.value,
                        held_micro: info.held_micro,
                    },
                    server_time,
                )]
            }
        } else {
            info.holders
                .into_iter()
                .map(|h| Holder::new(h, server_time))
                .collect()
        };
        holders.sort_by_key(|h| h.fence);
        KeyState {
            key: info.key,
            holders,
            holders_omitted: info.holders_omitted,
            waiters: info.waiters,
            shared: info.shared,
            limit: info.limit,
            waited_for: Duration::from_micros(info.waited_micro),
        }
    }

    /// Nobody holds the key.
    pub fn is_free(&self) -> bool {
        self.holders.is_empty()
    }

    /// The holder that has held the key longest (lowest token): the only
    /// one of a key held exclusively, such as an election's leader.
    pub fn first(&self) -> Option<&Holder> {
        self.holders.first()
    }

    /// The latest grant's fencing token (the highest), if held: what a
    /// key's fence means to a fenced resource.
    pub fn fence(&self) -> Option<u64> {
        self.holders.last().map(|h| h.fence)
    }

    /// Whether the caller holds the key.
    pub fn held_by_caller(&self) -> bool {
        self.holders.iter().any(|h| h.held_by_caller)
    }
}

impl Holder {
    fn new(h: KeyHolder, server_time: SystemTime) -> Holder {
        let held_for = Duration::from_micros(h.held_micro);
        Holder {
            fence: h.fence,
            lease_remaining: (h.lease_remaining_micro != 0)
                .then(|| Duration::from_micros(h.lease_remaining_micro)),
            held_by_caller: h.held_by_caller,
            // Empty when not connected; anything else that does not parse
            // is not an address a caller could use either.
            holder_addr: h.holder_addr.parse().ok(),
            value: h.value,
            held_for,
            since: server_time.checked_sub(held_for).unwrap_or(UNIX_EPOCH),
        }
    }
}

/// The time a response names in `server_unix_time` (nanoseconds since
/// the epoch); the epoch for a server that sent none.
pub(crate) fn server_time(unix_nanos: i64) -> SystemTime {
    let nanos = u64::try_from(unix_nanos).unwrap_or(0);
    UNIX_EPOCH + Duration::from_nanos(nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exclusive_holder_comes_from_the_top_level_fields() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000);
        let info = KeyInfo {
            key: "k".into(),
            fence: 7,
            holder_addr: "127.0.0.1:5".into(),
            value: b"me".to_vec(),
            held_micro: 2_000_000,
            ..KeyInfo::default()
        };
        let s = KeyState::from_proto(info, now);
        let h = s.first().expect("held");
        assert_eq!(
            (h.fence, h.lease_remaining, h.value.as_slice()),
            (7, None, &b"me"[..])
        );
        assert_eq!(h.holder_addr, Some("127.0.0.1:5".parse().unwrap()));
        assert_eq!(h.since, UNIX_EPOCH + Duration::from_secs(998));
        assert!(KeyState::from_proto(KeyInfo::default(), now).is_free());
    }

    #[test]
    fn shared_holders_are_listed_lowest_token_first() {
        let holder = |fence| KeyHolder {
            fence,
            lease_remaining_micro: 5,
            ..KeyHolder::default()
        };
        let info = KeyInfo {
            key: "pool".into(),
            fence: 9,
            shared: true,
            holders: vec![holder(9), holder(4)],
            ..KeyInfo::default()
        };
        let s = KeyState::from_proto(info, UNIX_EPOCH);
        let fences: Vec<u64> = s.holders.iter().map(|h| h.fence).collect();
        assert_eq!(fences, [4, 9]);
        assert_eq!(s.fence(), Some(9));
        assert_eq!(s.holders[0].holder_addr, None);
        assert_eq!(s.holders[0].lease_remaining, Some(Duration::from_micros(5)));
    }
}
