//! `iggy-replicator`: the command-line entry point. It parses arguments, installs
//! logging, and hands each subcommand to its module; every failure ends here as
//! one clear line, a hint, and a documented exit code (see [`exit::Failure`]).

mod admin;
mod api_client;
mod cli;
#[cfg(feature = "dev-tools")]
mod demo;
mod exit;
mod flow;
mod flow_call;
mod logging;
mod metrics;
mod node;
mod reload;
mod reset;
mod run;
mod status;
mod verify;
mod wiring;

use clap::Parser;

/// jemalloc instead of the system allocator: see its entry in Cargo.toml.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    // The demo prints its own story; library logs would only interleave with its progress
    // bars, and the errors peers log about the node it kills on purpose are expected.
    let default_level = match cli.command {
        #[cfg(feature = "dev-tools")]
        cli::Command::Demo(_) => "warn,openraft=off,iggy=off",
        _ => logging::DEFAULT_FILTER,
    };
    if let Err(error) = logging::install(cli.log_format, cli.log_level.as_deref(), default_level) {
        eprintln!("error: cannot install logging: {error}");
        return std::process::ExitCode::from(exit::RUNTIME);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return std::process::ExitCode::from(exit::RUNTIME);
        }
    };
    let result = runtime.block_on(cli::dispatch(cli.command));
    // A task stuck in blocking code (a slow disk under the control plane's database, say) must
    // not keep a stopped node from exiting: dropping the runtime would wait for it forever.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(failure) => failure.report(),
    }
}
