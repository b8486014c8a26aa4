//! Project automation for tegra-interop (`cargo xtask <command>`).
//!
//! Commands: `codegen` (the sys crate's bindings, `codegen.rs`) and `cross`
//! (builds and qemu test runs per `targets/*.toml`, `cross.rs`).
//!
//! Every failure ends with one line on stderr (`error: ...`) and exit code 1;
//! a usage mistake exits with 2. Nothing here panics on bad input; a panic
//! inside a dependency (bindgen panics when libclang is missing) is caught and
//! reported the same way. `xtask/tests/cli.rs` checks all of this on the
//! built binary.

mod abi;
mod codegen;
mod cross;
mod lists;
mod util;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  codegen [--check] [--cuda-include DIR] [--nvsci-include DIR]
      Regenerate crates/sys/src/{cuda,nvrtc,nvsci,lists}.rs with bindgen.
      --check            regenerate in memory and fail if the committed files are stale;
                         with --nvsci-include, also list every difference between the
                         real NvSci headers and the project's own declaration header.
      --cuda-include DIR use DIR/{cuda,cudaEGL,nvrtc}.h instead of the pinned PyPI wheels.
      --nvsci-include DIR a Jetson/DRIVE include directory with nvscibuf.h, nvscisync.h.
      --against DIR      with --check: compare with DIR/{cuda,nvrtc,nvsci,lists}.rs instead of
                         crates/sys/src (used by the xtask's own tests).
      --cache-dir DIR    where the wheels and headers are cached (default target/codegen-cache).

  cross [--only TARGET]... [--no-run] [--keep-going] [--list]
      Build the crates for every target described in targets/*.toml, and run the
      host-runnable test suites for aarch64-unknown-linux-gnu under qemu-aarch64.
      --only TARGET      only this target triple (repeatable).
      --no-run           build the test steps' tests without running them.
      --keep-going       run every step, report all failures at the end.
      --list             print the steps and their commands, run nothing.
";

fn main() -> ExitCode {
    util::quiet_panics();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("codegen") => util::catch("codegen: internal failure", || codegen::run(&args[1..])),
        Some("cross") => util::catch("cross: internal failure", || cross::run(&args[1..])),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => Err(util::Failure::usage(format!("unknown command `{other}`"))),
        None => Err(util::Failure::usage("no command given".to_string())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("error: {}", failure.message);
            if failure.usage {
                eprintln!("(run `cargo xtask help` for usage)");
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
