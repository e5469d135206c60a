//! `dlock --inspect`: who holds and who waits for keys, or, without keys,
//! the server's counts.

use crate::cli::Args;
use crate::exit::{self, Failure};
use crate::keeper;
use dlock::proto::KeyInfo;
use dlock::ClientOptions;

/// Prints a table of `keys`, or the server's counts when there are none.
///
/// # Errors
/// Connection failures and refusals, as exit codes.
pub async fn run(args: &Args, options: ClientOptions, keys: Vec<String>) -> Result<u8, Failure> {
    let client = keeper::connect(&args.server, options).await?;
    let failed = |e| exit::from_client_error(e, &args.server);
    if keys.is_empty() {
        let stats = client.stats().await.map_err(failed)?;
        match client.session() {
            None => println!("server       {}", args.server),
            Some(_) => println!("leader       {}", client.addr()),
        }
        println!("connections  {}", stats.connections);
        println!("held keys    {}", stats.held_keys);
        println!("waiting      {}", stats.waiting_requests);
        return Ok(0);
    }
    let infos = client.inspect(keys).await.map_err(failed)?;
    if client.session().is_some() {
        println!("leader {}", client.addr());
    }
    print!("{}", table(&infos));
    Ok(0)
}

/// The table, with columns as wide as their widest cell; keys are quoted so
/// that spaces and empty-looking keys are visible.
fn table(infos: &[KeyInfo]) -> String {
    let rows: Vec<[String; 6]> = infos
        .iter()
        .map(|i| {
            let held = i.fence != 0;
            [
                format!("{:?}", i.key),
                if held { "held" } else { "free" }.to_string(),
                match (held, i.holder_addr.as_str()) {
                    (false, _) => "-".into(),
                    (true, "") => "(disconnected)".into(),
                    (true, addr) => addr.to_string(),
                },
                if held {
                    i.fence.to_string()
                } else {
                    "-".into()
                },
                if i.lease_remaining_micro == 0 {
                    "-".into()
                } else {
                    format!("{:.1}s", i.lease_remaining_micro as f64 / 1e6)
                },
                i.waiters.to_string(),
            ]
        })
        .collect();
    let header = ["KEY", "STATE", "HOLDER", "FENCE", "LEASE", "WAITERS"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .enumerate()
            // Numbers at the right, text at the left.
            .map(|(col, (cell, w))| match col {
                4 | 5 => format!("{cell:>w$}"),
                _ => format!("{cell:<w$}"),
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let t = table(&infos);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[1].starts_with(&format!("\"{long}\"  held")), "{t}");
        assert!(lines[2].starts_with("\"a b\""), "{t}");
        // Every STATE cell starts in the same column.
        let col = lines[0].find("STATE").unwrap();
        assert_eq!(&lines[1][col..col + 4], "held");
        assert_eq!(&lines[2][col..col + 4], "free");
    }
}
