//! What this machine offers for CUDA <-> NvSci / Vulkan interop
//! (`cargo run --bin interop_info -- --sim`); the report lives in the library
//! ([`tegra_interop_pipeline::app::info`]).

fn main() -> std::process::ExitCode {
    tegra_interop_pipeline::app::info::main()
}
