//! A request's arguments checked against the server's limits, before
//! anything reaches the table: every bad input gets a status that names
//! what is wrong, and has no effect.

use super::reply::Refusal;
use crate::ops::config::Config;
use crate::table::{Command, Key, OwnerId, Sharing, WaitLimit, MAX_VALUE_LEN};
use dlock_proto::proto::{RequestLock, ResponseStatus};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Longest a Watch waits before it is answered with the key as it is; also
/// the wait of a Watch that names none (wait_micro 0). A client re-arms it.
pub const MAX_WATCH_WAIT: Duration = Duration::from_secs(600);

/// Most busiest keys an Inspect may ask for: a screenful, and a bound on
/// the answer's size (each key's `KeyInfo` lists every holder).
pub const MAX_BUSIEST: u32 = 100;

/// How many busiest keys an Inspect naming no keys asks for (its `limit`).
pub fn busiest_wanted(body: &RequestLock) -> Result<usize, Refusal> {
    if body.limit > MAX_BUSIEST {
        return Err(Refusal::new(
            ResponseStatus::InvalidArgument,
            format!(
                "Inspect lists at most {MAX_BUSIEST} busiest keys; {} were asked for",
                body.limit
            ),
        ));
    }
    Ok(body.limit as usize)
}

/// A Lock's arguments, checked.
#[derive(Debug)]
pub struct LockArgs {
    pub keys: Vec<Key>,
    pub sharing: Sharing,
    pub wait: WaitLimit,
    pub lease: Option<Duration>,
    pub value: Vec<u8>,
}

impl LockArgs {
    /// The table command that asks for these keys for `owner`: a Lock's,
    /// and an Enqueue's, which the table treats as a Lock.
    pub fn into_command(self, owner: OwnerId) -> Command {
        Command::Lock {
            owner,
            keys: self.keys,
            sharing: self.sharing,
            wait: self.wait,
            lease: self.lease,
            value: self.value,
        }
    }
}

/// A Lock's arguments, checked: its keys, which of them are shared, how long
/// it may wait, its lease.
pub fn lock_args(config: &Config, body: RequestLock) -> Result<LockArgs, Refusal> {
    if body.fence != 0 {
        return Err(Refusal::new(
            ResponseStatus::InvalidArgument,
            "fence names an existing lock; it applies to Unlock and Renew only",
        ));
    }
    if body.ticket != 0 {
        return Err(Refusal::new(
            ResponseStatus::InvalidArgument,
            "ticket names a queued Enqueue; it applies to Wait only",
        ));
    }
    if body.try_lock && body.wait_micro != 0 {
        return Err(Refusal::new(
            ResponseStatus::InvalidArgument,
            "try_lock and wait_micro exclude each other",
        ));
    }
    let lease = match body.release_micro {
        0 => None,
        micros => Some(lease_of(config, micros)?),
    };
    let wait = if body.try_lock {
        WaitLimit::No
    } else if body.wait_micro == 0 {
        WaitLimit::Forever
    } else {
        // Relative to the command's time, which the lock state reads once.
        WaitLimit::For(Duration::from_micros(body.wait_micro))
    };
    if body.limit != 0 && body.shared_keys.is_empty() {
        return Err(Refusal::new(
            ResponseStatus::InvalidArgument,
            "limit applies to shared keys; name them in shared_keys",
        ));
    }
    // The keys are checked against their limits first, and the shared keys
    // counted against the same limit, so that they are looked up among a
    // bounded list.
    validate_keys(config, &body.keys)?;
    if body.shared_keys.len() > config.max_keys {
        return Err(Refusal::new(
            ResponseStatus::TooManyKeys,
            format!(
                "{} shared keys in one request; the limit is {}",
                body.shared_keys.len(),
                config.max_keys
            ),
        ));
    }
    // Most Locks share nothing: no set to build for them.
    let named: HashSet<&str> = match body.shared_keys.is_empty() {
        true => HashSet::new(),
        false => body.keys.iter().map(String::as_str).collect(),
    };
    if let Some(k) = body
        .shared_keys
        .iter()
        .find(|k| !named.contains(k.as_str()))
    {
        return Err(Refusal::new(
            ResponseStatus::InvalidArgument,
            format!("shared key {k:?} is not among the request's keys"),
        ));
    }
    let sharing = Sharing {
        keys: body.shared_keys.into_iter().map(Key::from).collect(),
        limit: body.limit,
    };
    check_value(&body.value)?;
    Ok(LockArgs {
        keys: body.keys.into_iter().map(Key::from).collect(),
        sharing,
        wait,
        lease,
        value: body.value,
    })
}

/// A Renew's lease, checked.
pub fn renew_lease(config: &Config, micros: u64) -> Result<Duration, Refusal> {
    if micros == 0 {
        return Err(Refusal::new(
            ResponseStatus::InvalidArgument,
            "Renew needs release_micro > 0",
        ));
    }
    lease_of(config, micros)
}

pub fn fence_of(body: &RequestLock) -> Option<u64> {
    (body.fence != 0).then_some(body.fence)
}

fn lease_of(config: &Config, micros: u64) -> Result<Duration, Refusal> {
    let lease = Duration::from_micros(micros);
    if lease > config.max_lease {
        return Err(Refusal::new(
            ResponseStatus::InvalidArgument,
            format!(
                "release_micro {micros} exceeds the server's --max-lease of {}",
                humantime::format_duration(config.max_lease)
            ),
        ));
    }
    Ok(lease)
}

/// Checks the key list against the limits and converts it for the table.
pub fn checked_keys(config: &Config, keys: Vec<String>) -> Result<Vec<Key>, Refusal> {
    validate_keys(config, &keys)?;
    Ok(keys.into_iter().map(Key::from).collect())
}

/// Checks the key list against the limits.
pub fn validate_keys(config: &Config, keys: &[String]) -> Result<(), Refusal> {
    if keys.is_empty() {
        return Err(Refusal::new(
            ResponseStatus::NoKeys,
            "request names no keys",
        ));
    }
    if keys.len() > config.max_keys {
        return Err(Refusal::new(
            ResponseStatus::TooManyKeys,
            format!(
                "{} keys in one request; the limit is {}",
                keys.len(),
                config.max_keys
            ),
        ));
    }
    if let Some(i) = keys.iter().position(|k| k.is_empty()) {
        return Err(Refusal::new(
            ResponseStatus::InvalidKey,
            // Counted from 1, as a person counts the keys they gave.
            format!("key {} of {} is empty", i + 1, keys.len()),
        ));
    }
    if let Some(i) = keys.iter().position(|k| k.len() > config.max_key_len) {
        return Err(Refusal::new(
            ResponseStatus::InvalidKey,
            format!(
                "key {} of {} is {} bytes long; the limit is {}",
                i + 1,
                keys.len(),
                keys[i].len(),
                config.max_key_len
            ),
        ));
    }
    Ok(())
}

/// The server-wide bound on parked Watches.
#[derive(Debug, Clone)]
pub struct WatchPermits {
    permits: Arc<Semaphore>,
    max: usize,
}

impl WatchPermits {
    /// At most `max` Watches at once.
    pub fn new(max: usize) -> WatchPermits {
        WatchPermits {
            permits: Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS))),
            max,
        }
    }

    /// A place for one more Watch.
    ///
    /// # Errors
    /// WatchLimit when every place is taken.
    pub fn take(&self) -> Result<OwnedSemaphorePermit, Refusal> {
        self.permits.clone().try_acquire_owned().map_err(|_| {
            Refusal::new(
                ResponseStatus::WatchLimit,
                format!(
                    "the server's --max-watchers {} Watches are parked; try again later",
                    self.max
                ),
            )
        })
    }
}

/// A Watch's arguments, checked.
#[derive(Debug)]
pub struct WatchArgs {
    /// The key watched.
    pub key: Key,
    /// The first holder's token the caller knows; 0: it knows the key free.
    pub fence: u64,
    /// The first holder's value the caller knows.
    pub value: Vec<u8>,
    /// When to answer anyway.
    pub deadline: Instant,
}

/// Checks a Watch request: exactly one valid key, a value within bounds.
///
/// # Errors
/// The refusal to answer with.
pub fn watch_args(config: &Config, body: RequestLock) -> Result<WatchArgs, Refusal> {
    let mut keys = checked_keys(config, body.keys)?;
    if keys.len() != 1 {
        return Err(Refusal::new(
            ResponseStatus::InvalidArgument,
            "Watch names exactly one key",
        ));
    }
    check_value(&body.value)?;
    let wait = match body.wait_micro {
        0 => MAX_WATCH_WAIT,
        micros => Duration::from_micros(micros).min(MAX_WATCH_WAIT),
    };
    Ok(WatchArgs {
        key: keys.remove(0),
        fence: body.fence,
        value: body.value,
        deadline: Instant::now() + wait,
    })
}

/// Refuses a value longer than [`MAX_VALUE_LEN`].
///
/// # Errors
/// ValueTooLarge.
pub fn check_value(value: &[u8]) -> Result<(), Refusal> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Refusal::new(
            ResponseStatus::ValueTooLarge,
            format!(
                "value is {} bytes long; the limit is {MAX_VALUE_LEN}",
                value.len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn body(keys: usize, shared: usize) -> RequestLock {
        RequestLock {
            keys: (0..keys).map(|i| format!("k{i}")).collect(),
            shared_keys: (0..shared).map(|i| format!("k{i}")).collect(),
            ..RequestLock::default()
        }
    }

    #[test]
    fn keys_are_bounded_before_shared_keys_are_looked_up_among_them() {
        let config = Config::parse_from(["s"]);
        // Too many keys: refused by count, before any lookup.
        let many = config.max_keys + 1;
        let r = lock_args(&config, body(many, many))
            .map(|_| ())
            .unwrap_err();
        assert_eq!(r.status, ResponseStatus::TooManyKeys);
        // Shared keys are counted against the same limit.
        let mut shared = body(2, 0);
        shared.shared_keys = vec!["k0".into(); config.max_keys + 1];
        let r = lock_args(&config, shared).map(|_| ()).unwrap_err();
        assert_eq!(r.status, ResponseStatus::TooManyKeys);
        // A shared key named twice is still among the keys.
        let mut twice = body(1, 0);
        twice.shared_keys = vec!["k0".into(), "k0".into()];
        assert!(lock_args(&config, twice).is_ok());
        let mut stray = body(2, 1);
        stray.shared_keys = vec!["elsewhere".into()];
        let r = lock_args(&config, stray).map(|_| ()).unwrap_err();
        assert!(r.text.contains("\"elsewhere\""), "{}", r.text);
        assert!(lock_args(&config, body(3, 2)).is_ok());
    }
}
