//! `dlock-torture`: parse options, run, exit with the verdict.

mod availability;
mod cli;
mod faults;
mod history;
mod honest;
mod report;
mod run;
mod target;
mod wire;
mod workload;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = cli::Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("dlock-torture: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let verdict = runtime.block_on(run::run(args));
    match verdict {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("dlock-torture: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
