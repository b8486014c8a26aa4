//! [`Nvrtc`]: CUDA C compiled to PTX at run time, through the table's
//! optional NVRTC part (`libnvrtc.so.12`, or the other names the loader
//! tries; on the simulator, its registry of Rust kernels).
//!
//! ```
//! use tegra_interop_driver::{Context, Module, Nvrtc};
//! use tegra_interop_sim::{kernels::KernelSpec, Sim};
//!
//! let sim = Sim::new()?;
//! // The simulator compiles only kernels it can run: a Rust twin per name.
//! // (A kernel that does nothing: a twin that does nothing, per block.)
//! sim.register_block_kernel(KernelSpec::new("noop", &[4]), |_block| Ok(()));
//! let backend = sim.backend();
//! let nvrtc = Nvrtc::new(&backend)?;
//! let ptx = nvrtc.compile(r#"extern "C" __global__ void noop(int x) {}"#, "noop.cu", &[])?;
//! let ctx = Context::new(backend, 0)?;
//! let module = Module::load(&ctx, &ptx)?;
//! let _noop = module.function("noop")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![allow(unsafe_code)] // calls of pointer-taking entry points, each with its `// SAFETY:` line

use std::ffi::{c_char, CString};
use std::fmt;
use std::sync::Arc;

use tegra_interop_sys::nvrtc::nvrtcProgram;

use crate::ffi::{call, code, require};
use crate::table::NvrtcApi;
use crate::{Backend, Error};

/// An `nvrtcResult` value (an open set: unknown values are kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NvrtcResult(pub u32);

impl NvrtcResult {
    /// `NVRTC_SUCCESS`.
    pub const SUCCESS: NvrtcResult = NvrtcResult(0);
    /// `NVRTC_ERROR_INVALID_INPUT`.
    pub const INVALID_INPUT: NvrtcResult = NvrtcResult(3);
    /// `NVRTC_ERROR_INVALID_PROGRAM`.
    pub const INVALID_PROGRAM: NvrtcResult = NvrtcResult(4);
    /// `NVRTC_ERROR_INVALID_OPTION`.
    pub const INVALID_OPTION: NvrtcResult = NvrtcResult(5);
    /// `NVRTC_ERROR_COMPILATION`.
    pub const COMPILATION: NvrtcResult = NvrtcResult(6);

    /// The C name, where the 12.9 header names the value.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "NVRTC_SUCCESS",
            1 => "NVRTC_ERROR_OUT_OF_MEMORY",
            2 => "NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
            3 => "NVRTC_ERROR_INVALID_INPUT",
            4 => "NVRTC_ERROR_INVALID_PROGRAM",
            5 => "NVRTC_ERROR_INVALID_OPTION",
            6 => "NVRTC_ERROR_COMPILATION",
            7 => "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE",
            8 => "NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION",
            9 => "NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION",
            10 => "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID",
            11 => "NVRTC_ERROR_INTERNAL_ERROR",
            12 => "NVRTC_ERROR_TIME_FILE_WRITE_FAILED",
            13 => "NVRTC_ERROR_NO_PCH_CREATE_ATTEMPTED",
            14 => "NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED",
            15 => "NVRTC_ERROR_PCH_CREATE",
            16 => "NVRTC_ERROR_CANCELLED",
            _ => return None,
        })
    }
}

impl fmt::Display for NvrtcResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n} ({})", self.0),
            None => write!(f, "unknown nvrtcResult {}", self.0),
        }
    }
}

impl std::error::Error for NvrtcResult {}

/// PTX text (or the simulator's module image): what [`crate::Module::load`]
/// takes. Always NUL-terminated, without an interior NUL.
#[derive(Clone, PartialEq, Eq)]
pub struct Ptx {
    text: CString,
}

impl fmt::Debug for Ptx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ptx")
            .field("bytes", &self.text.as_bytes().len())
            .finish()
    }
}

impl Ptx {
    /// PTX from text (e.g. a file made by `nvcc --ptx`).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the text holds a NUL byte (the driver
    /// reads the image up to the first NUL).
    pub fn from_text(text: impl Into<Vec<u8>>) -> Result<Ptx, Error> {
        CString::new(text)
            .map(|text| Ptx { text })
            .map_err(|_| Error::Unsupported {
                operation: "Ptx::from_text",
                reason: "PTX text must not contain a NUL byte",
            })
    }

    /// The text (lossy for bytes that are not UTF-8).
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        self.text.to_string_lossy()
    }

    /// The bytes with their terminating NUL (what `cuModuleLoadData` reads).
    pub(crate) fn as_c_str(&self) -> &std::ffi::CStr {
        &self.text
    }

    /// The names of the `.entry` points the PTX declares.
    pub fn entries(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| {
                let rest = l.trim_start();
                let rest = rest
                    .strip_prefix(".visible ")
                    .or_else(|| rest.strip_prefix(".weak "))
                    .unwrap_or(rest)
                    .trim_start();
                let rest = rest.strip_prefix(".entry")?.trim_start();
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '$')
                    .collect();
                (!name.is_empty()).then_some(name)
            })
            .collect()
    }
}

/// The run-time compiler, through the backend's table.
///
/// `Send + Sync`: it holds only the backend (an `Arc`); each compilation
/// makes and destroys its own NVRTC program (NVRTC allows concurrent
/// programs on different threads).
#[derive(Clone)]
pub struct Nvrtc {
    backend: Arc<Backend>,
}

impl fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nvrtc")
            .field("backend", &self.backend.name())
            .finish()
    }
}

/// An NVRTC program, destroyed once on every path (a failed destroy is
/// kept on the backend, as `Drop` failures of handles are).
struct Program<'a> {
    backend: &'a Backend,
    api: &'a NvrtcApi,
    raw: nvrtcProgram,
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` is a live program made by `nvrtcCreateProgram` of
        // the same table, destroyed only here; the call writes NULL to the
        // local it is given.
        if let Err(e) = unsafe { call::nvrtcDestroyProgram(self.api, &mut self.raw) } {
            self.backend.record_drop_error(e);
        }
    }
}

/// Which string to read out of a program.
#[derive(Clone, Copy)]
enum Output {
    Ptx,
    Log,
}

impl Program<'_> {
    /// Reads the PTX or the log: the size call, then the fill call.
    fn read(&self, what: Output) -> Result<Vec<u8>, Error> {
        let mut len = 0usize;
        // SAFETY: `len` is a local the call writes one size to; `raw` is live.
        unsafe {
            match what {
                Output::Ptx => call::nvrtcGetPTXSize(self.api, self.raw, &mut len),
                Output::Log => call::nvrtcGetProgramLogSize(self.api, self.raw, &mut len),
            }
        }?;
        let mut buf = vec![0u8; len.max(1)];
        let out = buf.as_mut_ptr().cast::<c_char>();
        // SAFETY: `buf` holds `len` (at least 1) writable bytes, the size
        // NVRTC reported for this string including its NUL.
        unsafe {
            match what {
                Output::Ptx => call::nvrtcGetPTX(self.api, self.raw, out),
                Output::Log => call::nvrtcGetProgramLog(self.api, self.raw, out),
            }
        }?;
        if let Some(nul) = buf.iter().position(|b| *b == 0) {
            buf.truncate(nul);
        }
        Ok(buf)
    }
}

impl Nvrtc {
    /// The compiler of `backend`'s table.
    ///
    /// # Errors
    /// [`Error::NotSupported`] naming the missing entry point and its
    /// library (`libnvrtc.so.12`) with the loader's reason, when NVRTC is
    /// not installed (or the table has no NVRTC part).
    pub fn new(backend: &Arc<Backend>) -> Result<Nvrtc, Error> {
        let api = &backend.table().nvrtc;
        require::nvrtcVersion(api)?;
        require::nvrtcCreateProgram(api)?;
        require::nvrtcCompileProgram(api)?;
        require::nvrtcGetPTXSize(api)?;
        require::nvrtcGetPTX(api)?;
        require::nvrtcGetProgramLogSize(api)?;
        require::nvrtcGetProgramLog(api)?;
        require::nvrtcDestroyProgram(api)?;
        Ok(Nvrtc {
            backend: Arc::clone(backend),
        })
    }

    fn api(&self) -> &NvrtcApi {
        &self.backend.table().nvrtc
    }

    /// The compiler's version (`nvrtcVersion`): (major, minor).
    pub fn version(&self) -> Result<(i32, i32), Error> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two locals the call writes one int each to.
        unsafe { call::nvrtcVersion(self.api(), &mut major, &mut minor) }?;
        Ok((major, minor))
    }

    /// Compiles CUDA C `source` (program name `name`, used in messages)
    /// with NVRTC `options` (e.g. `"--gpu-architecture=compute_90"`) to PTX.
    ///
    /// # Errors
    /// [`Error::CompileFailed`] with the compiler's log when the source does
    /// not compile (or the options are refused); [`Error::Nvrtc`] for other
    /// NVRTC failures; [`Error::NotSupported`] without NVRTC. A source,
    /// name or option holding a NUL byte is refused before any call.
    pub fn compile(&self, source: &str, name: &str, options: &[&str]) -> Result<Ptx, Error> {
        let nul = |what: &str| Error::CompileFailed {
            program: name.replace('\0', "\\0"),
            code: NvrtcResult::INVALID_INPUT,
            log: format!("the {what} contains a NUL byte; refused before calling NVRTC"),
        };
        let c_source = CString::new(source).map_err(|_| nul("source"))?;
        let c_name = CString::new(name).map_err(|_| nul("program name"))?;
        let c_options = options
            .iter()
            .map(|o| CString::new(*o))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| nul("option list"))?;
        let option_ptrs: Vec<*const c_char> = c_options.iter().map(|o| o.as_ptr()).collect();
        let count = i32::try_from(option_ptrs.len()).map_err(|_| Error::CompileFailed {
            program: name.to_string(),
            code: NvrtcResult::INVALID_OPTION,
            log: "too many options".to_string(),
        })?;
        let api = self.api();
        let mut raw: nvrtcProgram = std::ptr::null_mut();
        // SAFETY: `raw` is a local the call writes one program to; source
        // and name are NUL-terminated strings alive for the call; no headers
        // (count 0, both arrays NULL, as the header allows).
        unsafe {
            call::nvrtcCreateProgram(
                api,
                &mut raw,
                c_source.as_ptr(),
                c_name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        }?;
        let program = Program {
            backend: &self.backend,
            api,
            raw,
        };
        // SAFETY: `option_ptrs` holds `count` NUL-terminated strings
        // (`c_options`, alive for the call); the program is live.
        let compiled = unsafe {
            code::nvrtcCompileProgram(
                api,
                program.raw,
                count,
                if option_ptrs.is_empty() {
                    std::ptr::null()
                } else {
                    option_ptrs.as_ptr()
                },
            )
        }?;
        if compiled.0 != 0 {
            // The log explains a failed compilation; a failure to read it
            // leaves the log empty rather than hiding the compile error.
            let log = program
                .read(Output::Log)
                .map(|l| String::from_utf8_lossy(&l).into_owned())
                .unwrap_or_default();
            return Err(Error::CompileFailed {
                program: name.to_string(),
                code: NvrtcResult(compiled.0),
                log,
            });
        }
        let ptx = program.read(Output::Ptx)?;
        drop(program);
        Ptx::from_text(ptx)
    }
}
