//! `dlock`: run a command while holding a distributed lock.

mod child;
mod cli;
mod cluster;
mod columns;
mod connect;
mod elect;
mod exit;
mod guardian;
mod guardian_message;
mod hook;
mod inspect;
mod keeper;
mod leader;
mod reconnects;
mod run;
mod say;
mod signals;
mod stdout;
mod subcommand;
mod top;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == guardian::ARG)
    {
        return guardian::run();
    }
    let (sub, argv) = subcommand::split(std::env::args_os().collect());
    match sub {
        Some(subcommand::Sub::Cluster) => {
            return run_parsed(argv, |a| async { cluster::run(a).await.map(|()| 0) })
        }
        Some(subcommand::Sub::Elect) => return run_parsed(argv, elect::run),
        Some(subcommand::Sub::Leader) => return run_parsed(argv, leader::run),
        Some(subcommand::Sub::Top) => return run_parsed(argv, top::run),
        None => {}
    }
    let args = match parse_args::<cli::Args>(argv) {
        Ok(a) => a,
        Err(code) => return code,
    };
    if let Some(shell) = args.completions {
        let mut cmd = command_tree();
        let mut text = Vec::new();
        clap_complete::generate(shell, &mut cmd, "dlock", &mut text);
        return print_generated(&text, "completions");
    }
    if args.man {
        let cmd = <cli::Args as clap::CommandFactory>::command();
        let mut text = Vec::new();
        if let Err(e) = clap_mangen::Man::new(cmd).render(&mut text) {
            say!("cannot render the man page: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
        return print_generated(&text, "man page");
    }
    run_blocking(run::run(args))
}

/// The whole command as a shell completes it: the lock form with every
/// subcommand and its own options. (`subcommand::split` parses them apart,
/// so clap's own tree of the lock form names none.)
fn command_tree() -> clap::Command {
    use clap::CommandFactory;
    let sub =
        |name: &'static str, cmd: clap::Command| cmd.name(name).bin_name(format!("dlock {name}"));
    cli::Args::command()
        .subcommand(sub("cluster", cluster::ClusterArgs::command()))
        .subcommand(sub("elect", elect::ElectArgs::command()))
        .subcommand(sub("leader", leader::LeaderArgs::command()))
        .subcommand(sub("top", top::TopArgs::command()))
}

/// Writes generated text (completions, the man page) to stdout. A reader
/// that stops early (`dlock --man | head`) is not an error, as for cat.
fn print_generated(text: &[u8], what: &str) -> ExitCode {
    match stdout::print(text) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) if f.message.is_empty() => ExitCode::from(f.code),
        Err(f) => {
            say!("cannot write the {what}: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

/// A subcommand's whole run: its arguments parsed from `argv` (its name
/// first, see `subcommand.rs`), then `run` on them.
fn run_parsed<T: Parser, F>(argv: Vec<std::ffi::OsString>, run: impl FnOnce(T) -> F) -> ExitCode
where
    F: std::future::Future<Output = Result<u8, exit::Failure>>,
{
    match parse_args::<T>(argv) {
        Ok(args) => run_blocking(run(args)),
        Err(code) => code,
    }
}

/// Parses `T` from `args` (argv, the program name first): help and
/// version print and exit 0, a bad command line prints why and exits 64.
fn parse_args<T: Parser>(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<T, ExitCode> {
    T::try_parse_from(args).map_err(|e| {
        if let Some(said) = no_such_flag(&e) {
            say!("{said}");
            return ExitCode::from(exit::USAGE);
        }
        let _ = e.print();
        match e.kind() {
            clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                ExitCode::SUCCESS
            }
            _ => ExitCode::from(exit::USAGE),
        }
    })
}

/// What to say instead of clap's advice for a flag dlock has on purpose
/// not: clap suggested `-- --token`, which would run `--token` as the
/// command.
fn no_such_flag(e: &clap::Error) -> Option<&'static str> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    (arg == "--token" || arg.starts_with("--token=")).then_some(
        "dlock has no --token: a token on the command line is shown to every user of \
         the machine (ps); set DLOCK_TOKEN, or give --token-file PATH",
    )
}

/// Runs `work` on a single-threaded runtime (dlock waits on one server and
/// one child; more threads would only add wake-ups) and turns its result
/// into the exit code, saying why on stderr when it failed.
fn run_blocking(work: impl std::future::Future<Output = Result<u8, exit::Failure>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say!("cannot start: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    match runtime.block_on(work) {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            if !f.message.is_empty() {
                say!("{}", f.message);
            }
            ExitCode::from(f.code)
        }
    }
}
