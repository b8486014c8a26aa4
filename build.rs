//! Target facts for the facade crate, as cfgs (declared with check-cfg).
//!
//! - `tegra_aarch64_linux`: aarch64 Linux userland, where a Jetson's libcuda
//!   and NvSci libraries may exist at run time.
//! - `tegra_bare_metal`: `target_os = "none"` (Cortex-R/M co-processors,
//!   bare-metal aarch64), where only the no_std core makes sense.
//!
//! Nothing is generated or linked here; the cfgs steer documentation and the
//! default backend choice only.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(tegra_aarch64_linux)");
    println!("cargo::rustc-check-cfg=cfg(tegra_bare_metal)");
    println!("cargo::rerun-if-changed=build.rs");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if arch == "aarch64" && os == "linux" {
        println!("cargo::rustc-cfg=tegra_aarch64_linux");
    }
    if os == "none" {
        println!("cargo::rustc-cfg=tegra_bare_metal");
    }
}
