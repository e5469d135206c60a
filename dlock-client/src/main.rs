//! `dlock`: run a command while holding a distributed lock.

mod child;
mod cli;
mod cluster;
mod exit;
mod guardian;
mod inspect;
mod keeper;
mod run;
mod say;
mod signals;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == guardian::ARG)
    {
        return guardian::run();
    }
    if std::env::args_os().nth(1).is_some_and(|a| a == "cluster") {
        return cluster::main();
    }
    let args = match cli::Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                _ => ExitCode::from(exit::USAGE),
            };
        }
    };
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
    match runtime.block_on(run::run(args)) {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            if !f.message.is_empty() {
                say!("{}", f.message);
            }
            ExitCode::from(f.code)
        }
    }
}
