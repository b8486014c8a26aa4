//! The main job and `interop_info` on a simulated CUDA 11.4 driver (JetPack
//! 5, DRIVE OS 6.0): `--sim-driver 11.4` makes the simulator report 11040
//! and lack every entry point introduced later (`crates/sys/CUDA_VERSIONS.md`).
//! The main job needs none of them (the launch's argument-size check,
//! `cuFuncGetParamInfo`, is CUDA 12.4+ and is skipped there), so it must
//! verify every frame; `interop_info` must say what the driver lacks and
//! what that costs, and list NVRTC with its version.
//!
//! Cargo builds both binaries for this test.
#![allow(clippy::unwrap_used)]

mod common;
use common::child_command;
use std::path::PathBuf;
use std::process::Output;

fn bin(name: &str) -> PathBuf {
    match name {
        "pipeline" => PathBuf::from(env!("CARGO_BIN_EXE_pipeline")),
        _ => PathBuf::from(env!("CARGO_BIN_EXE_interop_info")),
    }
}

fn run(name: &str, args: &[&str]) -> Output {
    child_command(bin(name)).args(args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const SMALL: &[&str] = &[
    "--backend",
    "sim",
    "--frames",
    "40",
    "--ring",
    "3",
    "--width",
    "64",
    "--height",
    "16",
];

#[test]
fn the_main_job_verifies_every_frame_on_an_11_4_driver() {
    for mode in [&[][..], &["--copy"][..]] {
        let mut args = SMALL.to_vec();
        args.extend_from_slice(&["--sim-driver", "11.4", "--json", "--quiet"]);
        args.extend_from_slice(mode);
        let o = run("pipeline", &args);
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert!(o.status.success(), "{mode:?}: {out}{err}");
        assert!(!err.contains("panicked"), "{err}");
        let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(j["backend"], "nvsci-sim", "{j}");
        assert_eq!(j["verified"], true, "{j}");
        let v = &j["verification"];
        for key in ["consumer_ok", "readback_ok", "pulses"] {
            assert_eq!(v[key].as_u64(), Some(40), "{key}: {j}");
        }
        assert_eq!(v["failed"], 0, "{j}");
    }
}

#[test]
fn the_human_report_says_which_driver_the_simulator_presents() {
    let mut args = SMALL.to_vec();
    args.extend_from_slice(&["--sim-driver", "11.4", "--quiet"]);
    let o = run("pipeline", &args);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{out}{}", text(&o.stderr));
    let first = out.lines().next().unwrap();
    assert!(
        first.contains("presenting a CUDA 11.4 driver (--sim-driver)"),
        "{first}"
    );
}

#[test]
fn sim_driver_is_refused_where_it_does_not_apply() {
    for args in [
        &["--sim-driver", "11.4"][..],
        &["--backend", "host", "--sim-driver", "11.4"][..],
        &[
            "--backend",
            "sim",
            "--processes",
            "2",
            "--sim-driver",
            "11.4",
        ][..],
    ] {
        let o = run("pipeline", args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.starts_with("error: --sim-driver only applies to --backend sim"),
            "{args:?}: {err}"
        );
    }
    let o = run("pipeline", &["--backend", "sim", "--sim-driver", "11.0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("11.0"), "{}", text(&o.stderr));
}

/// The simulator's section of `interop_info --sim [--sim-driver V]`.
fn sim_section(driver: &str) -> String {
    let o = run("interop_info", &["--sim", "--sim-driver", driver]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{out}{err}");
    assert!(err.is_empty(), "{err}");
    let at = out.find("== simulator").unwrap();
    out[at..].to_string()
}

#[test]
fn interop_info_says_what_an_11_4_driver_lacks_and_what_it_costs() {
    let sim = sim_section("11.4");
    assert!(sim.contains("CUDA 11.4 driver) =="), "{sim}");
    assert!(sim.contains("cuDriverGetVersion = 11040"), "{sim}");
    for want in [
        "cuMemGetHandleForAddressRange needs CUDA 11.7 (the driver is CUDA 11.4): the dma-buf import probe cannot run",
        "cuFuncGetParamInfo needs CUDA 12.4 (the driver is CUDA 11.4): launches are not checked against the kernel's parameter sizes",
        "attribute DMA_BUF_SUPPORTED (124) is new in CUDA 11.7 and the driver is CUDA 11.4",
        "libnvrtc (NVRTC)     loaded, NVRTC 11.4 (library loaded; call: nvrtcVersion = 11.4)",
    ] {
        assert!(sim.contains(want), "missing {want:?} in:\n{sim}");
    }
    // The default simulator lacks neither entry and reports NVRTC 12.9.
    let new = sim_section("12.9");
    assert!(!new.contains("cuFuncGetParamInfo"), "{new}");
    assert!(
        !new.contains("cuMemGetHandleForAddressRange needs"),
        "{new}"
    );
    assert!(new.contains("NVRTC 12.9"), "{new}");
}

#[test]
fn interop_info_sim_driver_needs_sim() {
    let o = run("interop_info", &["--sim-driver", "11.4"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("--sim"), "{}", text(&o.stderr));
}
