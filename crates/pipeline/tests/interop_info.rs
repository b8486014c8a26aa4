//! Runs the compiled `interop_info` binary: the capability report on this
//! machine (with or without a CUDA driver), the simulator's view with
//! `--sim`, and one-line errors.
//!
//! Cargo builds the binary for this test (`CARGO_BIN_EXE_interop_info`).
#![allow(clippy::unwrap_used)]

mod common;
use common::child_command;
use std::path::PathBuf;
use std::process::Output;

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_interop_info"))
}

fn run(args: &[&str]) -> Output {
    child_command(example()).args(args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The value after `name` on the first line that starts (after the
/// indentation) with it.
fn value<'a>(out: &'a str, name: &str) -> Option<&'a str> {
    out.lines()
        .find_map(|l| l.trim_start().strip_prefix(name))
        .map(str::trim)
}

#[test]
fn this_machine_is_reported_with_reasons() {
    let o = run(&[]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{out}{err}");
    assert!(err.is_empty(), "{err}");
    assert!(
        out.starts_with("interop_info: bindings generated from cuda.h "),
        "{out}"
    );
    assert!(out.contains("== this machine =="), "{out}");
    let driver = value(&out, "CUDA driver").unwrap();
    // Either way the line says what was found and why.
    assert!(
        driver.starts_with("not found: CUDA driver not found (libcuda.so.1: ")
            || driver.starts_with("found; supports CUDA "),
        "{driver}"
    );
    if driver.starts_with("not found") {
        assert!(driver.contains("no device"), "{driver}");
        assert!(
            value(&out, "NvSci").unwrap().starts_with("not probed: "),
            "{out}"
        );
    } else {
        for name in [
            "devices",
            "libcuda.so.1",
            "libnvscibuf.so.1",
            "libnvscisync.so.1",
        ] {
            assert!(value(&out, name).is_some(), "{name}: {out}");
        }
        every_line_names_its_evidence(&out);
    }
    // No hardware backend can be opened by the pipeline in this build, so
    // auto picks the simulator, saying why jetson and gpu were passed over.
    for name in ["jetson", "gpu"] {
        assert!(
            value(&out, name).unwrap().starts_with("not available: "),
            "{name}: {out}"
        );
    }
    assert!(
        value(&out, "sim").unwrap().starts_with("available: "),
        "{out}"
    );
    let pick = value(&out, "auto picks").unwrap();
    assert!(
        pick.starts_with("sim (auto: the simulator, because jetson: not available: "),
        "{pick}"
    );
    assert!(out.contains("run with --sim"), "{out}");
    assert!(!out.contains("== simulator"), "{out}");
}

#[test]
fn sim_flag_adds_the_simulators_view() {
    let o = run(&["--sim"]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{out}{err}");
    assert!(err.is_empty(), "{err}");
    let sim = out
        .split_once("== simulator (SimConfig::tegra()")
        .map(|(_, s)| s)
        .unwrap_or_else(|| panic!("no simulator section: {out}"));
    assert_eq!(
        value(sim, "CUDA driver").unwrap(),
        "found; supports CUDA 12.9 (call: cuDriverGetVersion = 12090)"
    );
    assert_eq!(value(sim, "devices").unwrap(), "1 (call: cuDeviceGetCount)");
    every_line_names_its_evidence(sim);
    let uuid = value(sim, "uuid").unwrap();
    assert!(uuid.starts_with("GPU-") && uuid.len() == 40, "{uuid}");
    assert_eq!(uuid.matches('-').count(), 5, "{uuid}");
    assert!(
        value(sim, "integrated")
            .unwrap()
            .starts_with("yes (attribute INTEGRATED (18) = 1)"),
        "{sim}"
    );
    // Not probed (it needs an exporter), and the line says so.
    let opaque = value(sim, "fd (opaque)").unwrap();
    assert!(
        opaque.starts_with("entry points present (symbol present: cuImportExternalMemory")
            && opaque.contains("not probed"),
        "{sim}"
    );
    assert!(
        value(sim, "timeline semaphore")
            .unwrap()
            .starts_with("yes (attribute TIMELINE_SEMAPHORE_INTEROP_SUPPORTED (114) = 1)"),
        "{sim}"
    );
    // Attribute 124 is reported as what it is: export.
    let export = value(sim, "dma-buf export").unwrap();
    assert!(
        export.starts_with("yes (attribute DMA_BUF_SUPPORTED (124) = 1)")
            && export.contains("not importing"),
        "{sim}"
    );
    // The import line is the probe's answer, never the attribute's.
    let import = value(sim, "DMABUF_FD import").unwrap();
    assert!(
        import.starts_with("not supported (probed: import answered CUDA_ERROR_NOT_SUPPORTED)"),
        "{import}"
    );
    assert!(!import.contains("124"), "{import}");
    assert!(
        value(sim, "nvsci").unwrap().starts_with(
            "cuDeviceGetNvSciSyncAttributes present and NvSci libraries loaded (symbol present, library loaded"
        ),
        "{sim}"
    );
    // The NvSci versions the simulator claims by default (DRIVE OS 6.0.10).
    assert_eq!(
        value(sim, "nvsci versions").unwrap(),
        "NvSciBuf 2.11, NvSciSync 2.8 (call: Nv*CheckVersionCompatibility, probed at module open); waiters build deterministic fences (NvSciSyncFenceUpdateFence)",
        "{sim}"
    );
    // The simulator implements every entry point the project resolves, the
    // NvSciIpc life cycle, NvSciSync attribute-list IPC and EGLStreams
    // included, except the EGL sync import, which the x86_64 driver does not
    // export either (measured on the GPU machine): the report must name
    // exactly that.
    assert_eq!(
        value(sim, "libcuda.so.1").unwrap(),
        "74/75 symbols present; missing: cuEventCreateFromEGLSync",
        "{sim}"
    );
    for (lib, n) in [
        ("libnvscibuf.so.1", 24),
        ("libnvscisync.so.1", 32),
        ("libnvsciipc.so", 16),
    ] {
        assert_eq!(
            value(sim, lib).unwrap(),
            format!("{n}/{n} symbols present"),
            "{sim}"
        );
    }
    for lib in ["libnvscibuf.so.1", "libnvscisync.so.1"] {
        let v = value(sim, lib).unwrap();
        assert!(
            v.ends_with("symbols present") && !v.starts_with("0/"),
            "{lib}: {v}"
        );
        let (have, total) = v.split_once(' ').unwrap().0.split_once('/').unwrap();
        assert_eq!(have, total, "{lib}: {v}");
    }
    // On a Tegra-like machine the jetson backend passes the GPU and NvSci
    // checks and is refused for what the simulator really lacks: it cannot
    // run the CUDA kernel that processes the frames.
    assert!(
        value(sim, "jetson")
            .unwrap()
            .starts_with("not available: not the real CUDA driver: "),
        "{sim}"
    );
    assert!(
        value(sim, "gpu").unwrap().contains("is an integrated GPU"),
        "{sim}"
    );
}

#[test]
fn help_and_bad_arguments() {
    let o = run(&["--help"]);
    assert!(o.status.success());
    assert!(text(&o.stdout).contains("--sim"));

    for (args, bad) in [
        (&["--bogus"][..], "'--bogus'"),
        (&["--sim", "extra"][..], "'extra'"),
    ] {
        let o = run(args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error: unexpected argument "), "{err}");
        assert!(err.contains(bad), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}

/// Each capability line of a device says how it was found out.
fn every_line_names_its_evidence(section: &str) {
    const EVIDENCE: [&str; 9] = [
        "(attribute ",
        "probed",
        "symbol present",
        "symbol missing",
        "library not loaded",
        "measured",
        "(call: ",
        "no probe possible",
        "unknown (",
    ];
    let mut seen = 0;
    for name in [
        "integrated",
        "fd (opaque)",
        "timeline semaphore",
        "dma-buf export",
        "DMABUF_FD import",
        "nvsci",
    ] {
        for v in section
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix(name))
        {
            assert!(
                EVIDENCE.iter().any(|e| v.contains(e)),
                "{name}: no evidence named: {v}"
            );
            seen += 1;
        }
    }
    assert!(seen >= 6, "{section}");
}
