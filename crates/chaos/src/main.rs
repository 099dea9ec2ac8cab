//! `inflight-chaos`: fault runs of inflight on loopback (issue 28). `holder` is one client process
//! writing its history; `run` starts topologies, holders and faults, and prints one JSON line per
//! scenario from the histories' check (inflight-history). `scripts/chaos.sh` builds and runs it.
#![forbid(unsafe_code)]

mod history;
mod holder;
mod run;

use clap::{Parser, Subcommand};

/// A boxed error: nothing here needs to tell them apart.
type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Parser)]
#[command(about = "Fault runs of inflight on loopback, judged from the clients' histories")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// One holder process: acquire, hold a random short while, release; every operation in its history.
    Holder(holder::HolderArgs),
    /// The scenarios, one JSON line each; exits 1 when one is over its bound (or could not be checked).
    Run(run::RunArgs),
}

fn main() -> Result {
    match Cli::parse().command {
        Cmd::Holder(args) => holder::run(args),
        Cmd::Run(args) => {
            if !run::run(args)? {
                std::process::exit(1);
            }
            Ok(())
        }
    }
}
