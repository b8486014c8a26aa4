//! Project automation for tegra-interop (`cargo xtask <command>`).
//!
//! Commands: `codegen` (the sys crate's bindings, `codegen.rs`), `cross`
//! (builds and qemu test runs per `targets/*.toml`, `cross.rs`) and
//! `glibc-floor` (the glibc versions ELF files need, `glibc.rs`) and
//! `publish-check` (the published crates' metadata, `publish.rs`); the command
//! line is parsed by clap (derive), each command's options beside its code.
//!
//! Every failure ends with one line on stderr (`error: ...`) and exit code 1;
//! a usage mistake exits with 2. Nothing here panics on bad input; a panic
//! inside a dependency (bindgen panics when libclang is missing) is caught and
//! reported the same way. `xtask/tests/cli.rs` checks all of this on the
//! built binary.

mod abi;
mod codegen;
mod cross;
mod glibc;
mod lists;
mod publish;
mod util;
mod versions;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The command line: `cargo xtask <command> [options]`.
#[derive(Debug, Parser)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "Project automation for tegra-interop",
    disable_version_flag = true,
    after_help = "Exit status: 0 done, 1 the command failed, 2 a usage mistake."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Regenerate crates/sys/src/{cuda,nvrtc,nvsci,lists}.rs with bindgen
    Codegen(codegen::Options),
    /// Build the crates for every target described in targets/*.toml, and run
    /// the host-runnable test suites for aarch64-unknown-linux-gnu under
    /// qemu-aarch64
    Cross(cross::Options),
    /// Print the highest GLIBC_x.y symbol version each ELF file needs; fail
    /// if one is above --max
    GlibcFloor(cross::FloorOptions),
    /// Check that every published crate has complete crates.io/docs.rs
    /// metadata and pins no dependency
    PublishCheck(publish::Options),
}

/// A clap error as the xtask's one line (without usage and tips).
fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let first: Vec<&str> = text
        .lines()
        .map(str::trim)
        .skip_while(|l| l.is_empty())
        .take_while(|l| !l.is_empty())
        .collect();
    let msg = first.join(" ");
    msg.strip_prefix("error: ").unwrap_or(&msg).to_owned()
}

fn main() -> ExitCode {
    util::quiet_panics();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            return match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                    if std::env::args().nth(1).is_some() =>
                {
                    print!("{e}");
                    ExitCode::SUCCESS
                }
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    fail(util::Failure::usage("no command given".to_string()))
                }
                _ => fail(util::Failure::usage(one_line(&e))),
            };
        }
    };
    let result = match cli.command {
        Cmd::Codegen(o) => util::catch("codegen: internal failure", || codegen::run(o)),
        Cmd::Cross(o) => util::catch("cross: internal failure", || cross::run(o)),
        Cmd::GlibcFloor(o) => util::catch("glibc-floor: internal failure", || cross::floor(o)),
        Cmd::PublishCheck(o) => util::catch("publish-check: internal failure", || publish::run(o)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => fail(failure),
    }
}

/// Prints the failure's one line (and, for a usage mistake, where the help
/// is) and gives its exit status.
fn fail(failure: util::Failure) -> ExitCode {
    eprintln!("error: {}", failure.message);
    if failure.usage {
        eprintln!("(run `cargo xtask help` for usage)");
        ExitCode::from(2)
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
