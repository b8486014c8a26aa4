//! The camera -> NvSci -> CUDA zero-copy pipeline (`cargo run --release`);
//! `--help` lists the options. All of it lives in the library
//! ([`tegra_interop_pipeline::app`]).

fn main() -> std::process::ExitCode {
    tegra_interop_pipeline::app::main()
}
