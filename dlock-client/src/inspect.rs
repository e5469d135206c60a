//! `dlock --inspect`: who holds and who waits for keys, or, without keys,
//! the server's counts.

use crate::cli::{Args, Output};
use crate::columns::columns;
use crate::exit::{self, Failure};
use dlock::{ClientOptions, Holder, KeyState};
use serde_json::{json, Value};

/// Prints a table of `keys`, or the server's counts when there are none.
///
/// # Errors
/// Connection failures and refusals, as exit codes.
pub async fn run(args: &Args, options: ClientOptions, keys: Vec<String>) -> Result<u8, Failure> {
    let client = crate::connect::connect(&args.server, options).await?;
    let failed = |e| exit::from_client_error(e, &args.server);
    // On a cluster, the leader that answered.
    let leader = client.session().map(|_| client.addr());
    if keys.is_empty() {
        let stats = client.stats().await.map_err(failed)?;
        if args.output == Output::Json {
            let mut out = json!({
                "connections": stats.connections,
                "held_keys": stats.held_keys,
                "waiting_requests": stats.waiting_requests,
            });
            out["leader"] = json!(leader);
            crate::stdout::print(format!("{out}\n"))?;
            return Ok(0);
        }
        let at = match client.session() {
            None => format!("server       {}", args.server),
            Some(_) => format!("leader       {}", client.addr()),
        };
        crate::stdout::print(format!(
            "{at}\nconnections  {}\nheld keys    {}\nwaiting      {}\n",
            stats.connections, stats.held_keys, stats.waiting_requests
        ))?;
        return Ok(0);
    }
    let infos = client.inspect(keys).await.map_err(failed)?;
    if args.output == Output::Json {
        let v = json!({ "leader": leader, "keys": key_states(&infos) });
        crate::stdout::print(format!("{v}\n"))?;
        return Ok(0);
    }
    let mut text = String::new();
    if client.session().is_some() {
        text = format!("leader {}\n", client.addr());
    }
    text.push_str(&table(&infos));
    crate::stdout::print(text)?;
    Ok(0)
}

/// The table, with columns as wide as their widest cell; keys are quoted so
/// that spaces and empty-looking keys are visible. A key held shared gets a
/// row per holder, each naming the key, so that `grep` finds them all; its
/// STATE says "shared", with the holder count and limit of a semaphore.
fn table(infos: &[KeyState]) -> String {
    let rows: Vec<[String; 7]> = infos
        .iter()
        .flat_map(|i| {
            let key = format!("{:?}", i.key);
            let waiters = i.waiters.to_string();
            if i.holders.is_empty() {
                return vec![row(key, "free".into(), None, waiters)];
            }
            let count = i.holders.len() + i.holders_omitted as usize;
            let state = match (i.shared, i.limit) {
                (false, _) => "held".to_string(),
                (true, 0) => "shared".to_string(),
                (true, n) => format!("shared {count}/{n}"),
            };
            let mut rows: Vec<_> = i
                .holders
                .iter()
                .map(|h| row(key.clone(), state.clone(), Some(h), waiters.clone()))
                .collect();
            if i.holders_omitted > 0 {
                // The server left them out between the oldest grants and
                // the latest, which is the last row.
                let mut gap = row(key.clone(), state.clone(), None, waiters.clone());
                gap[2] = format!("({} more not listed)", i.holders_omitted);
                rows.insert(rows.len().saturating_sub(1), gap);
            }
            rows
        })
        .collect();
    let header = [
        "KEY", "STATE", "HOLDER", "FENCE", "LEASE", "WAITERS", "VALUE",
    ]
    .map(String::from);
    // Lease and waiters are numbers, at the right.
    columns(&header, &rows, &[4, 5])
}

/// The keys' states as JSON: every holder with its fence, lease, address
/// and value (as text when it is UTF-8, and always in hex).
fn key_states(infos: &[KeyState]) -> Value {
    let holder = |h: &Holder| {
        json!({
            "fence": h.fence,
            "addr": h.holder_addr.map(|a| a.to_string()),
            "lease_remaining_seconds": h.lease_remaining.map(|l| l.as_secs_f64()),
            "held_seconds": h.held_for.as_secs_f64(),
            "held_by_caller": h.held_by_caller,
            "value": std::str::from_utf8(&h.value).ok(),
            "value_hex": h.value.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        })
    };
    infos
        .iter()
        .map(|i| {
            let state = match (i.holders.is_empty(), i.shared) {
                (true, _) => "free",
                (false, false) => "held",
                (false, true) => "shared",
            };
            json!({
                "key": i.key,
                "state": state,
                "limit": i.limit,
                "waiters": i.waiters,
                "holders": i.holders.iter().map(holder).collect::<Vec<_>>(),
                "holders_omitted": i.holders_omitted,
            })
        })
        .collect()
}

/// A lease's time left: tenths of a second under a minute, where they
/// matter, whole seconds in the largest units above ("2h 5m 3s", not
/// "7503.0s").
fn lease_left(left: std::time::Duration) -> String {
    if left < std::time::Duration::from_secs(60) {
        format!("{:.1}s", left.as_secs_f64())
    } else {
        humantime::format_duration(std::time::Duration::from_secs(left.as_secs())).to_string()
    }
}

/// One row: the holder's address, fence, lease and value, if held. A value
/// is shown as text when it is printable UTF-8, else in hex.
fn row(key: String, state: String, holder: Option<&Holder>, waiters: String) -> [String; 7] {
    let none = || "-".to_string();
    let Some(h) = holder else {
        return [key, state, none(), none(), none(), waiters, none()];
    };
    let addr = h
        .holder_addr
        .map_or_else(|| "(disconnected)".to_string(), |a| a.to_string());
    let lease = h.lease_remaining.map_or_else(none, lease_left);
    let value = match h.value.as_slice() {
        [] => none(),
        v => crate::leader::printable(v),
    };
    [key, state, addr, h.fence.to_string(), lease, waiters, value]
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock::proto::KeyInfo;
    use std::time::UNIX_EPOCH;

    fn states(infos: impl IntoIterator<Item = KeyInfo>) -> Vec<KeyState> {
        infos
            .into_iter()
            .map(|i| KeyState::from_proto(i, UNIX_EPOCH))
            .collect()
    }

    #[test]
    fn long_keys_widen_their_column_and_keys_are_quoted() {
        let long = "k".repeat(40);
        let infos = [
            KeyInfo {
                key: long.clone(),
                fence: 7,
                holder_addr: "127.0.0.1:5".into(),
                ..KeyInfo::default()
            },
            KeyInfo {
                key: "a b".into(),
                ..KeyInfo::default()
            },
        ];
        let t = table(&states(infos));
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[1].starts_with(&format!("\"{long}\"  held")), "{t}");
        assert!(lines[2].starts_with("\"a b\""), "{t}");
        // Every STATE cell starts in the same column.
        let col = lines[0].find("STATE").unwrap();
        assert_eq!(&lines[1][col..col + 4], "held");
        assert_eq!(&lines[2][col..col + 4], "free");
    }

    #[test]
    fn json_names_every_holder_with_its_value_as_text_and_hex() {
        let infos = [
            KeyInfo {
                key: "job".into(),
                fence: 7,
                holder_addr: "127.0.0.1:5".into(),
                value: b"web-1".to_vec(),
                waiters: 2,
                ..KeyInfo::default()
            },
            KeyInfo {
                key: "idle".into(),
                ..KeyInfo::default()
            },
        ];
        let v = key_states(&states(infos));
        assert_eq!(v[0]["key"], "job");
        assert_eq!(v[0]["state"], "held");
        assert_eq!(v[0]["waiters"], 2);
        let h = &v[0]["holders"][0];
        assert_eq!(h["fence"], 7);
        assert_eq!(h["addr"], "127.0.0.1:5");
        assert_eq!(h["value"], "web-1");
        assert_eq!(h["value_hex"], "7765622d31");
        assert!(h["lease_remaining_seconds"].is_null());
        assert_eq!(v[1]["state"], "free");
        assert_eq!(v[1]["holders"].as_array().map(Vec::len), Some(0));
    }

    #[test]
    fn every_holder_of_a_shared_key_or_semaphore_gets_a_row() {
        let holder = |fence, addr: &str| dlock::proto::KeyHolder {
            fence,
            holder_addr: addr.into(),
            lease_remaining_micro: 2_500_000,
            ..Default::default()
        };
        let infos = [KeyInfo {
            key: "pool".into(),
            fence: 9,
            shared: true,
            limit: 3,
            waiters: 1,
            holders: vec![holder(4, "127.0.0.2:5"), holder(9, "")],
            ..KeyInfo::default()
        }];
        let t = table(&states(infos));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(
            lines[1].contains("shared 2/3") && lines[1].contains("127.0.0.2:5"),
            "{t}"
        );
        assert!(
            lines[2].contains("(disconnected)") && lines[2].contains(" 9 "),
            "{t}"
        );
        assert!(lines
            .iter()
            .skip(1)
            .all(|l| l.starts_with("\"pool\"") && l.contains("2.5s")));
    }

    #[test]
    fn a_long_lease_is_shown_in_large_units() {
        use std::time::Duration;
        assert_eq!(lease_left(Duration::from_millis(2_540)), "2.5s");
        assert_eq!(lease_left(Duration::from_secs(7_200)), "2h");
        assert_eq!(lease_left(Duration::from_millis(7_503_900)), "2h 5m 3s");
        assert_eq!(lease_left(Duration::from_secs(2_592_000)), "30days");
    }

    #[test]
    fn holders_the_server_left_out_are_counted_between_the_oldest_and_the_latest() {
        let holder = |fence| dlock::proto::KeyHolder {
            fence,
            ..Default::default()
        };
        let infos = [KeyInfo {
            key: "pool".into(),
            fence: 90,
            shared: true,
            limit: 5000,
            holders: vec![holder(3), holder(4), holder(90)],
            holders_omitted: 4000,
            ..KeyInfo::default()
        }];
        let t = table(&states(infos.clone()));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5, "{t}");
        assert!(lines[1].contains("shared 4003/5000"), "{t}");
        assert!(lines[3].contains("(4000 more not listed)"), "{t}");
        assert!(lines[4].contains(" 90 "), "the latest grant last: {t}");
        let v = key_states(&states(infos));
        assert_eq!(v[0]["holders_omitted"], 4000);
        assert_eq!(v[0]["holders"].as_array().map(Vec::len), Some(3));
    }
}
