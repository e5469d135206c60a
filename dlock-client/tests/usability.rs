//! The smaller promises of `dlock` that users run into: clear usage errors,
//! tokens, what the command inherits, what is said on stderr.

mod common;

use common::*;
use dlock::{Client, ClientOptions, LockOptions};
use dlock_server::testing::TestServer;
use dlock_server::Config;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_server_addresses_are_usage_errors() {
    for bad in ["nonsense:port", ":99999", "no-port"] {
        let o = run_at(bad, &["--ping"]).await;
        assert_eq!(code(&o), 64, "{bad}: {}", stderr(&o));
        assert!(stderr(&o).contains("--server"), "{}", stderr(&o));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_id_0_is_a_usage_error_saying_where_ids_start() {
    for args in [
        &["cluster", "remove", "0"][..],
        &["cluster", "add", "0", "h:1", "h:2"],
    ] {
        let o = run_at("127.0.0.1:1", args).await;
        assert_eq!(code(&o), 64, "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("node ids start at 1"), "{}", stderr(&o));
    }
}

/// clap's advice for an unknown --token was `-- --token`, which would
/// run `--token` as the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_on_the_command_line_is_refused_saying_where_it_goes() {
    for args in [
        &["--token", "s3cret", "-k", "a", "--", "true"][..],
        &["--token=s3cret", "--ping"],
    ] {
        let o = run_at("127.0.0.1:1", args).await;
        assert_eq!(code(&o), 64, "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("DLOCK_TOKEN") && err.contains("--token-file"),
            "{err}"
        );
        assert!(
            !err.contains("-- --token") && !err.contains("s3cret"),
            "{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_file_skips_comments_and_the_command_does_not_see_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let server_tokens = dir.path().join("server");
    std::fs::write(&server_tokens, "t0ken\n").unwrap();
    let client_token = dir.path().join("client");
    std::fs::write(&client_token, "# deploy token\n\n  t0ken\n").unwrap();
    let server = TestServer::start(Config {
        token_file: Some(server_tokens.to_path_buf()),
        ..Config::default()
    })
    .await;
    let path = client_token.to_str().unwrap();
    let o = run_at(&server.addr_string(), &["--token-file", path, "--ping"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = dlock_at(
        &server.addr_string(),
        &["-k", "t", "-c", "echo \"token=${DLOCK_TOKEN-unset}\""],
    )
    .env("DLOCK_TOKEN", "t0ken")
    .output()
    .await
    .unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "token=unset");
}

/// The image's HEALTHCHECK (`dlock --ping -s 127.0.0.1:7436`, Dockerfile)
/// against a server with access control: the container names a file
/// holding the token of an identity with no rules in DLOCK_CLIENT_TOKEN_FILE.
/// Being known lets it Ping (and Hello, and open a session); no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_token_in_dlock_token_file_may_ping_and_do_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let server_tokens = dir.path().join("tokens");
    std::fs::write(
        &server_tokens,
        "token jobs j0bs-s3cret\n    lock jobs/*\n# the HEALTHCHECK's: no rules\ntoken health h3alth-s3cret\n",
    )
    .unwrap();
    let health = dir.path().join("health.token");
    std::fs::write(&health, "h3alth-s3cret\n").unwrap();
    let server = TestServer::start(Config {
        token_file: Some(server_tokens.to_path_buf()),
        ..Config::default()
    })
    .await;
    let addr = server.addr_string();
    let run = |args: &[&str], token_file: Option<&std::path::Path>| {
        let mut cmd = dlock_at(&addr, args);
        if let Some(f) = token_file {
            cmd.env("DLOCK_CLIENT_TOKEN_FILE", f);
        }
        async move {
            tokio::time::timeout(PATIENCE, cmd.output())
                .await
                .expect("dlock finishes")
                .expect("dlock runs")
        }
    };
    let ping = ["--ping", "-s", addr.as_str()];

    let o = run(&ping, None).await;
    assert_eq!(code(&o), 77, "no token: {}", stderr(&o));
    let o = run(&ping, Some(&health)).await;
    assert_eq!(code(&o), 0, "the health token pings: {}", stderr(&o));

    // Nothing that names a key: no lock, no inspect.
    let o = run(&["-n", "-k", "jobs/nightly", "--", "true"], Some(&health)).await;
    assert_eq!(
        code(&o),
        77,
        "the health token takes no lock: {}",
        stderr(&o)
    );
    assert!(
        stderr(&o).contains(r#"identity "health" has no rule "lock jobs/nightly""#),
        "{}",
        stderr(&o)
    );
    let o = run(&["--inspect", "-k", "jobs/nightly"], Some(&health)).await;
    assert_eq!(code(&o), 77, "nor inspects: {}", stderr(&o));

    // --token-file on the command line wins over the variable.
    let jobs = dir.path().join("jobs.token");
    std::fs::write(&jobs, "j0bs-s3cret\n").unwrap();
    let jobs_arg = jobs.to_str().unwrap();
    let o = run(
        &[
            "--token-file",
            jobs_arg,
            "-n",
            "-k",
            "jobs/nightly",
            "--",
            "true",
        ],
        Some(&health),
    )
    .await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    // The subcommands read it too.
    let missing = dir.path().join("missing.token");
    let o = run(&["cluster", "status"], Some(&missing)).await;
    assert_eq!(code(&o), 64, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("cannot read token file"),
        "{}",
        stderr(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_without_separator_is_run_with_a_warning() {
    let server = TestServer::start(Config::default()).await;
    let o = run_at(&server.addr_string(), &["-k", "a", "true"]).await;
    assert_eq!(code(&o), 0);
    assert!(
        stderr(&o).contains("warning: running 'true' as the command"),
        "{}",
        stderr(&o)
    );
    let o = run_at(&server.addr_string(), &["-k", "a", "--", "true"]).await;
    assert_eq!(stderr(&o), "");
    let o = run_at(&server.addr_string(), &["--auto-key", "/bin/true"]).await;
    assert_eq!(code(&o), 64);
    assert!(
        stderr(&o).contains("--auto-key took '/bin/true' as its PREFIX"),
        "{}",
        stderr(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonblock_verbose_says_who_holds_the_key() {
    let server = TestServer::start(Config::default()).await;
    let holder = client(&server.addr_string()).await;
    let _g = holder.lock(["nv"], LockOptions::new()).await.unwrap();
    let o = run_at(
        &server.addr_string(),
        &["-n", "-v", "-k", "nv", "--", "true"],
    )
    .await;
    assert_eq!(code(&o), 1);
    assert!(
        stderr(&o).contains("busy: \"nv\": held by 127.0.0.1:"),
        "{}",
        stderr(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_while_waiting_says_so_without_verbose() {
    let server = TestServer::start(Config::default()).await;
    let holder = client(&server.addr_string()).await;
    let _g = holder.lock(["iw"], LockOptions::new()).await.unwrap();
    let child = dlock_at(&server.addr_string(), &["-k", "iw", "--", "true"])
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + PATIENCE;
    while holder.inspect(["iw"]).await.unwrap()[0].waiters != 1 {
        assert!(std::time::Instant::now() < deadline, "dlock never waited");
        tokio::task::yield_now().await;
    }
    signal_pid(pid_of(&child), libc::SIGTERM);
    let o = wait_output(child).await;
    assert_eq!(code(&o), 143);
    assert_eq!(
        stderr(&o),
        "dlock: interrupted by SIGTERM while waiting for the lock; command not run\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_without_keys_prints_the_server_counts() {
    let server = TestServer::start(Config::default()).await;
    let holder = Client::connect_with(&server.addr_string(), ClientOptions::default())
        .await
        .unwrap();
    let _g = holder.lock(["a", "b"], LockOptions::new()).await.unwrap();
    let o = run_at(&server.addr_string(), &["--inspect"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("held keys    2"), "{}", stdout(&o));
}

/// `dlock cluster status | head -1` and the like: a reader that stopped
/// early ends the output quietly, as for cat, not with a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_went_away_ends_the_output_without_a_panic() {
    let server = TestServer::start(Config::default()).await;
    for args in [
        &["--ping"][..],
        &["--inspect"],
        &["--inspect", "-k", "a"],
        &["--inspect", "-o", "json"],
        &["leader", "-k", "a"],
        &["--man"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        // Not `output()`, which would capture stdout in a pipe of its own.
        let child = dlock_at(&server.addr_string(), args)
            .stdout(writer)
            .spawn()
            .expect("dlock runs");
        let o = wait_output(child).await;
        assert!(!stderr(&o).contains("panicked"), "{args:?}: {}", stderr(&o));
        assert_eq!(code(&o), 0, "{args:?}: {}", stderr(&o));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_terminal_sigtstp_stops_the_command_not_dlock() {
    let server = TestServer::start(Config::default()).await;
    let mut child = dlock_at(
        &server.addr_string(),
        &["-k", "tstp", "-c", "echo $$; exec sleep 600"],
    )
    .spawn()
    .unwrap();
    let pid: i32 = lines(&mut child, 1).await[0].parse().unwrap();
    let dlock = pid_of(&child);
    signal_pid(dlock, libc::SIGTSTP);
    await_state(pid, "stopped", |s| s == Some('T')).await;
    assert_ne!(state(dlock), Some('T'), "dlock itself must keep running");
    signal_pid(dlock, libc::SIGCONT);
    await_state(pid, "running again", |s| s == Some('S') || s == Some('R')).await;
    signal_pid(dlock, libc::SIGTERM);
    let o = wait_output(child).await;
    assert_eq!(code(&o), 143, "{}", stderr(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_terminal_sigterm_reaches_everything_the_command_started() {
    let server = TestServer::start(Config::default()).await;
    // A pseudo-terminal as stdin makes dlock run COMMAND in its own group.
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two descriptors we then own; the null name,
    // termios and winsize arguments are allowed.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty");
    // SAFETY: both descriptors were just opened and are owned here only.
    let (_master, slave) = unsafe {
        use std::os::fd::FromRawFd;
        (
            std::fs::File::from_raw_fd(master),
            std::fs::File::from_raw_fd(slave),
        )
    };
    let (child, pids) = with_background_child(&server.addr_string(), "tty", slave.into()).await;
    signal_pid(pid_of(&child), libc::SIGTERM);
    await_all_dead(&pids).await;
    let o = wait_output(child).await;
    assert_eq!(code(&o), 128 + libc::SIGTERM, "{}", stderr(&o));
}

#[tokio::test]
async fn help_lists_the_commands_and_a_lock_form_line_still_runs_a_command_named_like_one() {
    let o = run_at("127.0.0.1:1", &["--help"]).await;
    let help = stdout(&o);
    for line in ["  elect ", "  leader ", "  cluster "] {
        assert!(help.contains(line), "--help lacks {line:?}:\n{help}");
    }
    // Before any subcommand existed, this ran a program called `cluster`
    // under the lock; it still does (here a missing one: exit 127 is the
    // lock form's, a subcommand would have said "unexpected argument").
    let server = TestServer::start(Config::default()).await;
    let o = run_at(&server.addr_string(), &["-k", "k", "cluster", "status"]).await;
    assert_eq!(code(&o), 127, "{}", stderr(&o));
}

#[tokio::test]
async fn completions_and_the_man_page_come_from_the_flags() {
    for shell in ["bash", "zsh", "fish"] {
        let o = run_at("127.0.0.1:1", &["--completions", shell]).await;
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        let script = stdout(&o);
        assert!(
            script.contains("lease") && script.contains("inspect"),
            "{shell}: {script}"
        );
    }
    let o = run_at("127.0.0.1:1", &["--man"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let page = stdout(&o);
    assert!(
        page.starts_with(".ie") || page.contains(".TH dlock"),
        "{page}"
    );
    assert!(page.contains("lease"), "{page}");
    // Not beside an action: that is a usage error.
    let o = run_at("127.0.0.1:1", &["--man", "-k", "x"]).await;
    assert_eq!(code(&o), 64, "{}", stderr(&o));
}

/// What bash's completion of `words` (the last one being typed) offers,
/// with the script `dlock --completions bash` prints.
async fn bash_completes(script: &std::path::Path, words: &[&str]) -> String {
    let driver = r#"source "$SCRIPT"
        COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
        COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}; COMPREPLY=()
        _dlock dlock "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
        echo "${COMPREPLY[*]}""#;
    let out = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(driver)
        .arg("bash")
        .args(words)
        .env("SCRIPT", script)
        .output()
        .await
        .expect("bash runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn bash_completion_knows_every_subcommand_and_its_own_options() {
    let o = run_at("127.0.0.1:1", &["--completions", "bash"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let dir = tempfile::tempdir().expect("temp dir");
    let script = dir.path().join("dlock.bash");
    std::fs::write(&script, stdout(&o)).expect("write the script");
    let offered = bash_completes(&script, &["dlock", "el"]).await;
    assert!(
        offered.split_whitespace().any(|w| w == "elect"),
        "{offered}"
    );
    let offered = bash_completes(&script, &["dlock", "cl"]).await;
    assert!(
        offered.split_whitespace().any(|w| w == "cluster"),
        "{offered}"
    );
    let offered = bash_completes(&script, &["dlock", "elect", "--i"]).await;
    assert!(offered.split_whitespace().any(|w| w == "--id"), "{offered}");
    let offered = bash_completes(&script, &["dlock", "cluster", "st"]).await;
    assert!(
        offered.split_whitespace().any(|w| w == "status"),
        "{offered}"
    );
}

#[tokio::test]
async fn the_version_names_the_commit_and_the_protocol_as_the_server_does() {
    let o = run_at("127.0.0.1:1", &["--version"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let client = stdout(&o);
    assert!(
        client
            .trim_end()
            .ends_with(&format!("), protocol {}", dlock::PROTOCOL_VERSION)),
        "{client}"
    );
    // The commit this package was built from (its build script, shared
    // with the server, stamps both).
    assert!(
        client.contains(&format!("({})", env!("DLOCK_COMMIT"))),
        "{client}"
    );
}

/// `--server` naming a server's metrics port (HTTP) instead of its client
/// port: dlock says the other end does not speak its protocol, which
/// address, and what it answered, rather than "a frame of 1213486160 bytes".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_that_does_not_speak_dlock_is_named_with_what_it_answered() {
    use dlock_server::ops::metrics::{Gauges, ReadGauges};
    use dlock_server::ops::metrics_http::{self, Health};
    let gauges: ReadGauges = std::sync::Arc::new(|| Gauges {
        stats: dlock::proto::ServerStats::default(),
        raft: None,
    });
    let http = metrics_http::start(
        "127.0.0.1:0".parse().unwrap(),
        gauges,
        std::sync::Arc::new(Health::default()),
    )
    .await
    .unwrap();
    let addr = http.addr.to_string();
    // `dlock cluster` reads its answers apart, and names the port alike.
    let forms = [
        &["--ping"][..],
        &["-k", "k", "--", "true"][..],
        &["cluster", "status"][..],
    ];
    for args in forms {
        let o = run_at(&addr, args).await;
        let err = stderr(&o);
        assert_eq!(code(&o), 70, "{args:?}: {err}");
        assert!(
            err.contains(&addr) && err.contains("does not speak dlock's protocol"),
            "{err}"
        );
        assert!(err.contains("HTTP/1.1"), "{err}");
        assert!(err.contains("--listen"), "{err}");
    }
    http.stop().await;
}
