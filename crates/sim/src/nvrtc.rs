//! The simulator's NVRTC: it "compiles" a CUDA C source only when every
//! `extern "C" __global__` function the source declares is a registered
//! kernel ([`crate::kernels`]) with the same parameter sizes; the output is
//! a module image naming those kernels, which the simulated
//! `cuModuleLoadData` accepts. Everything else fails as a compilation
//! error whose log says what the simulator could not check.
//!
//! Codes follow the header's documentation of each function: NULL
//! out-pointers and a negative count are `NVRTC_ERROR_INVALID_INPUT`, an
//! unknown program `NVRTC_ERROR_INVALID_PROGRAM`, an option the simulator
//! does not know `NVRTC_ERROR_INVALID_OPTION` (the real compiler knows
//! more; the simulator refuses what it does not model).

#![deny(unsafe_code)]
#![allow(non_snake_case)]

use core::ffi::{c_char, c_int};
use std::io::Write as _;
use std::panic::AssertUnwindSafe;

use tegra_interop_sys::nvrtc::{nvrtcProgram, nvrtcResult};

use crate::cmem::{CMut, CPtr, Handle};
use crate::instance::{new_handle, Call, GoneWhy, ProgramObj, Tag};
use crate::kernels::{declared_kernels, module_image};
use crate::DiagnosticKind as D;

const SUCCESS: nvrtcResult = nvrtcResult::NVRTC_SUCCESS;
const INVALID_INPUT: nvrtcResult = nvrtcResult::NVRTC_ERROR_INVALID_INPUT;
const INVALID_PROGRAM: nvrtcResult = nvrtcResult::NVRTC_ERROR_INVALID_PROGRAM;
const INVALID_OPTION: nvrtcResult = nvrtcResult::NVRTC_ERROR_INVALID_OPTION;
const COMPILATION: nvrtcResult = nvrtcResult::NVRTC_ERROR_COMPILATION;
const INTERNAL: nvrtcResult = nvrtcResult::NVRTC_ERROR_INTERNAL_ERROR;

/// The version the simulator reports (the pinned header's release).
const VERSION: (c_int, c_int) = (12, 9);

type R<T = ()> = Result<T, nvrtcResult>;

fn done(r: R) -> nvrtcResult {
    r.err().unwrap_or(SUCCESS)
}

/// Serves one NVRTC call for the simulator in `slot`: counts, logs,
/// injects failures (the injected code is handed back as an
/// `nvrtcResult`), catches panics.
pub(crate) fn run_ret(
    slot: usize,
    symbol: &'static str,
    f: &mut dyn FnMut(&Call<'_>) -> nvrtcResult,
) -> nvrtcResult {
    let Some(inst) = crate::slots::get(slot) else {
        let _ = writeln!(
            std::io::stderr(),
            "tegra-interop-sim: {symbol} called through the table of a simulator that was dropped"
        );
        return INTERNAL;
    };
    let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let index = match inst.enter(symbol) {
            Ok(i) => i,
            Err(_) if inst.is_shut() => return INTERNAL,
            Err(code) => return nvrtcResult(code.0),
        };
        f(&Call {
            inst: &inst,
            index: Some(index),
            symbol,
        })
    }));
    run.unwrap_or_else(|_| {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
            inst.diag(
                None,
                symbol,
                D::Internal,
                "the simulator panicked (bug in the simulator)".into(),
            );
        }));
        INTERNAL
    })
}

/// The simulated NVRTC is of the driver's release (JetPack installs the
/// toolkit with the driver): 12.9 by default, 11.4 on the 11.4 profile.
pub(crate) fn nvrtcVersion(c: &Call, major: CMut<c_int>, minor: CMut<c_int>) -> nvrtcResult {
    if major.is_null() || minor.is_null() {
        return INVALID_INPUT;
    }
    let v = c.inst.config.driver_version;
    let (maj, min) = if v >= crate::SimConfig::CUDA_12_9 {
        VERSION
    } else {
        (v / 1000, (v % 1000) / 10)
    };
    major.write(maj);
    minor.write(min);
    SUCCESS
}

pub(crate) fn nvrtcCreateProgram(
    c: &Call,
    out: CMut<nvrtcProgram>,
    src: CPtr<c_char>,
    name: CPtr<c_char>,
    headers: c_int,
    header_sources: CPtr<*const c_char>,
    include_names: CPtr<*const c_char>,
) -> nvrtcResult {
    let r = (|| {
        if out.is_null() || headers < 0 {
            return Err(INVALID_INPUT);
        }
        let Some(src) = src.c_str() else {
            return Err(INVALID_INPUT);
        };
        if headers > 0 || !header_sources.is_null() || !include_names.is_null() {
            c.diag(
                D::Unimplemented,
                "nvrtcCreateProgram: in-memory headers are not simulated; refused".into(),
            );
            return Err(INVALID_INPUT);
        }
        let name = name.c_str().map_or_else(
            || "default_program".to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let h = new_handle(Tag::Program);
        c.state().programs.insert(
            h,
            ProgramObj {
                source: src.to_string_lossy().into_owned(),
                name,
                image: None,
                log: String::new(),
            },
        );
        out.write(core::ptr::without_provenance_mut::<core::ffi::c_void>(h as usize).cast());
        Ok(())
    })();
    done(r)
}

pub(crate) fn nvrtcDestroyProgram(c: &Call, prog: CMut<nvrtcProgram>) -> nvrtcResult {
    let r = (|| {
        let Some(p) = prog.read() else {
            return Err(INVALID_INPUT);
        };
        let h = p as usize as u64;
        let mut st = c.state();
        if st.programs.remove(&h).is_none() {
            if st.gone.contains_key(&h) {
                c.diag(
                    D::DoubleDestroy,
                    format!("NVRTC program {h:#x} destroyed twice"),
                );
            }
            return Err(INVALID_PROGRAM);
        }
        st.gone.insert(h, GoneWhy::Destroyed);
        drop(st);
        prog.write(core::ptr::null_mut());
        Ok(())
    })();
    done(r)
}

/// Whether the simulator knows option `o` (a few common ones; none changes
/// what it does).
fn known_option(o: &str) -> bool {
    const EXACT: &[&str] = &[
        "-default-device",
        "--use_fast_math",
        "-use_fast_math",
        "-lineinfo",
        "--generate-line-info",
        "-G",
        "--device-debug",
        "-dopt=on",
        "--extra-device-vectorization",
        "-extra-device-vectorization",
    ];
    const PREFIX: &[&str] = &[
        "--gpu-architecture=",
        "-arch=",
        "--std=",
        "-std=",
        "-D",
        "--define-macro=",
        "-I",
        "--include-path=",
        "--maxrregcount=",
        "-maxrregcount=",
    ];
    EXACT.contains(&o) || PREFIX.iter().any(|p| o.starts_with(p) && o.len() > p.len())
}

/// `nvrtcCompileProgram`, after the ABI adapter read the option strings
/// (`None`: a NULL array with a positive count).
pub(crate) fn compile(
    c: &Call,
    prog: Handle<nvrtcProgram>,
    count: c_int,
    options: Option<Vec<String>>,
) -> nvrtcResult {
    let r = (|| {
        let h = prog.addr() as u64;
        let mut st = c.state();
        if !st.programs.contains_key(&h) {
            return Err(INVALID_PROGRAM);
        }
        if count < 0 {
            return Err(INVALID_INPUT);
        }
        let options = options.ok_or(INVALID_INPUT)?;
        if let Some(bad) = options.iter().find(|o| !known_option(o)) {
            let log = format!("option `{bad}` is not known to the simulator's NVRTC\n");
            if let Some(p) = st.programs.get_mut(&h) {
                p.log = log;
                p.image = None;
            }
            return Err(INVALID_OPTION);
        }
        let (source, name) = match st.programs.get(&h) {
            Some(p) => (p.source.clone(), p.name.clone()),
            None => return Err(INVALID_PROGRAM),
        };
        let (declared, mut log) = declared_kernels(&source);
        for d in &declared {
            match st.kernels.kernels.get(&d.name) {
                None => log.push(format!(
                    "kernel `{}` is not registered with the simulator (Sim::register_kernel): \
                     it cannot run what it cannot check",
                    d.name
                )),
                Some(k) if k.params != d.params => log.push(format!(
                    "kernel `{}` declares parameter sizes {:?}, the registered Rust twin {:?}",
                    d.name, d.params, k.params
                )),
                Some(_) => {}
            }
        }
        let Some(p) = st.programs.get_mut(&h) else {
            return Err(INVALID_PROGRAM);
        };
        if log.is_empty() {
            p.image = Some(module_image(&declared));
            p.log = String::new();
            Ok(())
        } else {
            p.image = None;
            p.log = log
                .iter()
                .map(|l| format!("{name}: error: {l}\n"))
                .collect();
            Err(COMPILATION)
        }
    })();
    done(r)
}

/// The bytes `nvrtcGetPTX` / `nvrtcGetProgramLog` write (with the NUL).
pub(crate) fn output(c: &Call, prog: u64, ptx: bool) -> Result<Vec<u8>, nvrtcResult> {
    let st = c.state();
    let p = st.programs.get(&prog).ok_or(INVALID_PROGRAM)?;
    let text = if ptx {
        p.image.as_deref().ok_or_else(|| {
            c.diag(
                D::Misuse,
                "nvrtcGetPTX(Size) before a successful nvrtcCompileProgram".into(),
            );
            INVALID_PROGRAM
        })?
    } else {
        p.log.as_str()
    };
    let mut bytes = text.as_bytes().to_vec();
    bytes.push(0);
    Ok(bytes)
}

fn size(c: &Call, prog: Handle<nvrtcProgram>, out: CMut<usize>, ptx: bool) -> nvrtcResult {
    if out.is_null() {
        return INVALID_INPUT;
    }
    match output(c, prog.addr() as u64, ptx) {
        Ok(bytes) => {
            out.write(bytes.len());
            SUCCESS
        }
        Err(e) => e,
    }
}

pub(crate) fn nvrtcGetPTXSize(
    c: &Call,
    prog: Handle<nvrtcProgram>,
    out: CMut<usize>,
) -> nvrtcResult {
    size(c, prog, out, true)
}

pub(crate) fn nvrtcGetProgramLogSize(
    c: &Call,
    prog: Handle<nvrtcProgram>,
    out: CMut<usize>,
) -> nvrtcResult {
    size(c, prog, out, false)
}

/// Copies `bytes` into the caller's buffer (`out`, sized by the matching
/// size call; `None` for NULL).
pub(crate) fn fill(out: Option<&mut [c_char]>, bytes: &[u8]) -> nvrtcResult {
    let Some(out) = out else {
        return INVALID_INPUT;
    };
    for (o, b) in out.iter_mut().zip(bytes) {
        *o = *b as c_char;
    }
    SUCCESS
}
