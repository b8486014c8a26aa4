//! `cargo xtask codegen`: the sys crate's bindings, generated with bindgen.
//!
//! Why bindgen is pinned to an exact version (`=0.72.1` in xtask/Cargo.toml):
//! the generated files are committed and `--check` compares them byte for
//! byte, so a bindgen upgrade that only reorders or re-spells output would
//! turn CI red for no reason. Upgrading is a deliberate commit that bumps the
//! pin and the regenerated files together.
//!
//! Inputs:
//! - CUDA: `cuda.h` from the PyPI wheel `nvidia-cuda-runtime-cu12==12.9.79`
//!   (fetched with pip into `target/codegen-cache`, checked against a pinned
//!   SHA-256) or from `--cuda-include DIR`.
//! - NvSci: the project's own `crates/sys/include/tegra_interop_nvsci.h`, or
//!   the real BSP headers from `--nvsci-include DIR`.
//!
//! Every C function the project calls becomes a fn-pointer type
//! (`PFN_<name>`), derived from the header's own declaration with
//! `__typeof__`; the exported symbol name to resolve at run time (e.g.
//! `cuMemFree` is exported as `cuMemFree_v2`) is read back from the header's
//! own rename macros, never typed by hand. The sys crate links nothing.

use crate::abi;
use crate::lists;
use crate::util::{self, Failure, Result};
use crate::versions;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Pinned CUDA header source.
const CUDA_WHEEL_SPEC: &str = "nvidia-cuda-runtime-cu12==12.9.79";
const CUDA_WHEEL_FILE: &str =
    "nvidia_cuda_runtime_cu12-12.9.79-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl";
const CUDA_WHEEL_SHA256: &str = "25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3";
const CUDA_WHEEL_HEADER: &str = "nvidia/cuda_runtime/include/cuda.h";
/// The EGL interop header of the same wheel (it includes cuda.h and the
/// system's EGL headers: Debian `libegl-dev`).
const CUDA_WHEEL_EGL_HEADER: &str = "nvidia/cuda_runtime/include/cudaEGL.h";
/// The revision typedefs of the same wheel: the CUDA release of each entry
/// point (`crate::versions`).
const CUDA_WHEEL_TYPEDEFS: &str = "nvidia/cuda_runtime/include/cudaTypedefs.h";
const CUDA_WHEEL_EGL_TYPEDEFS: &str = "nvidia/cuda_runtime/include/cudaEGLTypedefs.h";

/// Pinned NVRTC header source: the runtime compiler of the same CUDA 12.9
/// release (its own wheel).
const NVRTC_WHEEL_SPEC: &str = "nvidia-cuda-nvrtc-cu12==12.9.86";
const NVRTC_WHEEL_FILE: &str =
    "nvidia_cuda_nvrtc_cu12-12.9.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl";
const NVRTC_WHEEL_SHA256: &str = "210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4";
const NVRTC_WHEEL_HEADER: &str = "nvidia/cuda_nvrtc/include/nvrtc.h";

/// The CUDA driver entry points the project resolves at run time, by the name
/// used in C source (the header's macros pick the exported symbol).
pub const CUDA_FUNCTIONS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetUuid_v2",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuDevicePrimaryCtxReset",
    "cuCtxCreate",
    "cuCtxDestroy",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuCtxSynchronize",
    "cuStreamCreate",
    "cuStreamDestroy",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuStreamGetCtx",
    "cuMemAlloc",
    "cuMemFree",
    "cuMemGetHandleForAddressRange",
    "cuMemcpyHtoD",
    "cuMemcpyDtoH",
    "cuMemsetD8",
    "cuMemcpy3D",
    "cuMipmappedArrayDestroy",
    "cuMipmappedArrayGetLevel",
    "cuImportExternalMemory",
    "cuExternalMemoryGetMappedBuffer",
    "cuExternalMemoryGetMappedMipmappedArray",
    "cuDestroyExternalMemory",
    "cuImportExternalSemaphore",
    "cuSignalExternalSemaphoresAsync",
    "cuWaitExternalSemaphoresAsync",
    "cuDestroyExternalSemaphore",
    "cuDeviceGetNvSciSyncAttributes",
    "cuLaunchHostFunc",
    // Pinned host memory, asynchronous copies, events, modules and launches
    // (the pipeline's consumer).
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostGetDevicePointer",
    "cuMemcpyHtoDAsync",
    "cuMemcpyDtoHAsync",
    "cuMemcpyDtoDAsync",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventElapsedTime",
    "cuEventDestroy",
    "cuStreamWaitEvent",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuFuncGetParamInfo",
    "cuLaunchKernel",
    // Page-locking host memory someone else allocated (copy mode's frames).
    "cuMemHostRegister",
    "cuMemHostUnregister",
    // EGL interop (cudaEGL.h): EGLImage registration and EGLStreams.
    "cuGraphicsEGLRegisterImage",
    "cuGraphicsResourceGetMappedEglFrame",
    "cuGraphicsUnregisterResource",
    "cuEGLStreamConsumerConnect",
    "cuEGLStreamConsumerConnectWithFlags",
    "cuEGLStreamConsumerAcquireFrame",
    "cuEGLStreamConsumerReleaseFrame",
    "cuEGLStreamConsumerDisconnect",
    "cuEGLStreamProducerConnect",
    "cuEGLStreamProducerPresentFrame",
    "cuEGLStreamProducerReturnFrame",
    "cuEGLStreamProducerDisconnect",
    "cuEventCreateFromEGLSync",
];

/// CUDA types the project needs beyond what the functions pull in.
const CUDA_TYPES: &[&str] = &[
    "CUresult",
    "CUdevice",
    "CUcontext",
    "CUstream",
    "CUdeviceptr",
    "CUarray",
    "CUmipmappedArray",
    "CUuuid",
    "CUarray_format",
    "CUdevice_attribute",
    "CUexternalMemory",
    "CUexternalSemaphore",
    "CUexternalMemoryHandleType",
    "CUexternalSemaphoreHandleType",
    "CUDA_ARRAY3D_DESCRIPTOR",
    "CUDA_EXTERNAL_MEMORY_HANDLE_DESC",
    "CUDA_EXTERNAL_MEMORY_BUFFER_DESC",
    "CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC",
    "CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC",
    "CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS",
    "CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS",
    "CUeglFrame",
    "CUeglFrameType",
    "CUeglColorFormat",
    "CUeglResourceLocationFlags",
    "CUeglStreamConnection",
    "CUgraphicsResource",
    "CUgraphicsMapResourceFlags",
    "CUevent",
    "CUmodule",
    "CUfunction",
];

/// The NVRTC entry points (`nvrtc.h`), an optional library of the table.
pub const NVRTC_FUNCTIONS: &[&str] = &[
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcDestroyProgram",
];

/// NVRTC types beyond what its functions pull in.
const NVRTC_TYPES: &[&str] = &["nvrtcResult", "nvrtcProgram"];

/// CUDA macros (constants) the project needs.
const CUDA_VARS: &str = "CUDA_VERSION|CUDA_EXTERNAL_MEMORY_DEDICATED|\
CUDA_EXTERNAL_SEMAPHORE_SIGNAL_SKIP_NVSCIBUF_MEMSYNC|CUDA_EXTERNAL_SEMAPHORE_WAIT_SKIP_NVSCIBUF_MEMSYNC|\
CUDA_NVSCISYNC_ATTR_SIGNAL|CUDA_NVSCISYNC_ATTR_WAIT|CUDA_ARRAY3D_.*|CU_STREAM_NON_BLOCKING|CU_STREAM_DEFAULT|\
MAX_PLANES|CU_MEMHOSTALLOC_.*|CU_MEMHOSTREGISTER_.*|CU_EVENT_DEFAULT|CU_EVENT_BLOCKING_SYNC|CU_EVENT_DISABLE_TIMING|\
CU_EVENT_INTERPROCESS";

// NvSci entry points are not listed here: they are every prototype declared
// in `OWN_NVSCI_HEADER`, in declaration order (`nvsci_functions`), so adding
// one is: declare it there, write the simulator's body.

/// NvSci types the project needs beyond what the functions pull in.
const NVSCI_TYPES: &[&str] = &[
    "NvSciError",
    "NvSciBufAttrKey",
    "NvSciBufType",
    "NvSciBufAttrValAccessPerm",
    "NvSciBufAttrValImageLayoutType",
    "NvSciBufAttrKeyValuePair",
    "NvSciSyncAttrKey",
    "NvSciSyncAccessPerm",
    "NvSciSyncAttrValPrimitiveType",
    "NvSciSyncAttrKeyValuePair",
    "NvSciSyncFence",
    "NvSciSyncFenceIpcExportDescriptor",
    "NvSciSyncObjIpcExportDescriptor",
    "NvSciBufObjIpcExportDescriptor",
    "NvSciRmGpuId",
    "NvSciIpcEndpoint",
    "NvSciIpcEndpointInfo",
];

/// Where the project's own NvSci declaration header lives.
const OWN_NVSCI_HEADER: &str = "crates/sys/include/tegra_interop_nvsci.h";

/// The options of `cargo xtask codegen`.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// Regenerate in memory and fail if the committed files are stale; with
    /// --nvsci-include, also list every difference between the real NvSci
    /// headers and the project's own declaration header
    #[arg(long)]
    check: bool,
    /// Use DIR/{cuda,cudaEGL,nvrtc,cudaTypedefs,cudaEGLTypedefs}.h instead of
    /// the pinned PyPI wheels
    #[arg(long, value_name = "DIR")]
    cuda_include: Option<PathBuf>,
    /// A Jetson/DRIVE include directory with nvscibuf.h, nvscisync.h
    #[arg(long, value_name = "DIR")]
    nvsci_include: Option<PathBuf>,
    /// With --check: compare with DIR/{cuda,nvrtc,nvsci,lists,versions}.rs and
    /// DIR/CUDA_VERSIONS.md instead of crates/sys (used by the xtask's own tests)
    #[arg(long, value_name = "DIR")]
    against: Option<PathBuf>,
    /// Where the wheels and headers are cached (default target/codegen-cache)
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

/// Entry point of `cargo xtask codegen`.
pub fn run(options: Options) -> Result<()> {
    if options.against.is_some() && !options.check {
        return Err(Failure::usage(
            "codegen: --against only makes sense with --check".to_string(),
        ));
    }
    let root = util::workspace_root();

    // Check every input before doing any work, so a typo costs nothing.
    if let Some(dir) = &options.cuda_include {
        require_file(&dir.join("cuda.h"), "--cuda-include")?;
        require_file(&dir.join("cudaEGL.h"), "--cuda-include")?;
        require_file(&dir.join("nvrtc.h"), "--cuda-include")?;
        require_file(&dir.join("cudaTypedefs.h"), "--cuda-include")?;
        require_file(&dir.join("cudaEGLTypedefs.h"), "--cuda-include")?;
    }
    if let Some(dir) = &options.nvsci_include {
        require_file(&dir.join("nvscibuf.h"), "--nvsci-include")?;
        require_file(&dir.join("nvscisync.h"), "--nvsci-include")?;
    }
    if let Some(dir) = &options.against {
        for file in GENERATED {
            require_file(&dir.join(file), "--against")?;
        }
    }

    let cuda_dir = match &options.cuda_include {
        Some(dir) => dir.clone(),
        None => fetch_cuda_header(
            &options
                .cache_dir
                .clone()
                .unwrap_or_else(|| root.join("target/codegen-cache")),
        )?,
    };
    let cuda_source = match &options.cuda_include {
        Some(dir) => format!("cuda.h from {}", dir.display()),
        None => format!("cuda.h of the PyPI wheel {CUDA_WHEEL_SPEC}"),
    };
    let cuda = generate_cuda(&cuda_dir, &cuda_source)?;
    let nvrtc_source = match &options.cuda_include {
        Some(dir) => format!("nvrtc.h from {}", dir.display()),
        None => format!("nvrtc.h of the PyPI wheel {NVRTC_WHEEL_SPEC}"),
    };
    let nvrtc = generate_nvrtc(&cuda_dir, &nvrtc_source)?;

    let own_nvsci_dir = root.join("crates/sys/include");
    let nvsci_names = nvsci_functions(&own_nvsci_dir)?;
    let nvsci_functions: Vec<&str> = nvsci_names.iter().map(String::as_str).collect();
    let own_nvsci = generate_nvsci(&own_nvsci_dir, NvSciHeaders::Own, &nvsci_functions)?;
    let lists = generate_lists(&cuda, &nvrtc, &own_nvsci, &nvsci_functions)?;
    let (versions, versions_md) = generate_versions(&cuda_dir, &cuda, &nvrtc)?;

    let out_dir = options
        .against
        .clone()
        .unwrap_or_else(|| root.join("crates/sys/src"));
    let cuda_path = out_dir.join("cuda.rs");
    let nvsci_path = out_dir.join("nvsci.rs");
    let lists_path = out_dir.join("lists.rs");
    let nvrtc_path = out_dir.join("nvrtc.rs");
    let versions_path = out_dir.join("versions.rs");
    let versions_md_path = match &options.against {
        Some(dir) => dir.join(VERSIONS_MD),
        None => root.join("crates/sys").join(VERSIONS_MD),
    };

    if options.check {
        let mut stale = Vec::new();
        for (path, fresh) in [
            (&cuda_path, &cuda),
            (&nvsci_path, &own_nvsci),
            (&lists_path, &lists),
            (&nvrtc_path, &nvrtc),
            (&versions_path, &versions),
            (&versions_md_path, &versions_md),
        ] {
            let committed = std::fs::read_to_string(path).unwrap_or_default();
            if committed != *fresh {
                stale.push(relative(&root, path));
            }
        }
        let mut differences = 0usize;
        if let Some(dir) = &options.nvsci_include {
            differences = check_abi(&own_nvsci_dir, &own_nvsci, dir, &nvsci_functions)?;
        }
        if !stale.is_empty() {
            return Err(Failure::new(format!(
                "generated bindings are stale: {} (run `cargo xtask codegen` and commit the result)",
                stale.join(", ")
            )));
        }
        if differences > 0 {
            return Err(Failure::new(format!(
                "{differences} ABI difference(s) between {OWN_NVSCI_HEADER} and the real NvSci headers (listed above)"
            )));
        }
        println!(
            "codegen --check: {}, {}, {}, {}, {} and {} are up to date",
            relative(&root, &cuda_path),
            relative(&root, &nvrtc_path),
            relative(&root, &nvsci_path),
            relative(&root, &lists_path),
            relative(&root, &versions_path),
            relative(&root, &versions_md_path)
        );
        return Ok(());
    }

    let nvsci = match &options.nvsci_include {
        Some(dir) => generate_nvsci(dir, NvSciHeaders::Real, &nvsci_functions)?,
        None => own_nvsci,
    };
    util::write(&cuda_path, &cuda)?;
    util::write(&nvsci_path, &nvsci)?;
    util::write(&lists_path, &lists)?;
    util::write(&nvrtc_path, &nvrtc)?;
    util::write(&versions_path, &versions)?;
    util::write(&versions_md_path, &versions_md)?;
    println!(
        "codegen: wrote {}, {}, {}, {}, {} and {}",
        relative(&root, &cuda_path),
        relative(&root, &nvrtc_path),
        relative(&root, &nvsci_path),
        relative(&root, &lists_path),
        relative(&root, &versions_path),
        relative(&root, &versions_md_path)
    );
    Ok(())
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

fn require_file(path: &Path, flag: &str) -> Result<()> {
    if path.is_file() {
        Ok(())
    } else {
        Err(Failure::new(format!(
            "{flag}: {} does not exist",
            path.display()
        )))
    }
}

/// Fetches (once) the pinned wheels and returns the directory holding
/// cuda.h, cudaEGL.h and nvrtc.h.
fn fetch_cuda_header(cache: &Path) -> Result<PathBuf> {
    let include = cache.join("cuda-12.9.79/include");
    std::fs::create_dir_all(&include)
        .map_err(|e| Failure::new(format!("cannot create {}: {e}", include.display())))?;
    fetch_headers(
        cache,
        CUDA_WHEEL_SPEC,
        CUDA_WHEEL_FILE,
        CUDA_WHEEL_SHA256,
        &[
            (CUDA_WHEEL_HEADER, include.join("cuda.h")),
            (CUDA_WHEEL_EGL_HEADER, include.join("cudaEGL.h")),
            (CUDA_WHEEL_TYPEDEFS, include.join("cudaTypedefs.h")),
            (CUDA_WHEEL_EGL_TYPEDEFS, include.join("cudaEGLTypedefs.h")),
        ],
    )?;
    fetch_headers(
        cache,
        NVRTC_WHEEL_SPEC,
        NVRTC_WHEEL_FILE,
        NVRTC_WHEEL_SHA256,
        &[(NVRTC_WHEEL_HEADER, include.join("nvrtc.h"))],
    )?;
    Ok(include)
}

/// Fetches (once) one pinned wheel into `cache`, checks its digest and
/// unpacks `headers` (path in the wheel, destination) unless all exist.
fn fetch_headers(
    cache: &Path,
    spec: &str,
    file: &str,
    sha256: &str,
    headers: &[(&str, PathBuf)],
) -> Result<()> {
    if headers.iter().all(|(_, dest)| dest.is_file()) {
        return Ok(());
    }
    let wheel = cache.join(file);
    if !wheel.is_file() {
        eprintln!("codegen: fetching {spec} with pip into {}", cache.display());
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
        let output = Command::new(&python)
            .args([
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "--platform",
                "manylinux2014_x86_64",
                "--dest",
            ])
            .arg(cache)
            .arg(spec)
            .output()
            .map_err(|e| {
                Failure::new(format!(
                    "cannot run `{python} -m pip` to fetch {spec}: {e} (install pip, or pass --cuda-include DIR)"
                ))
            })?;
        if !output.status.success() || !wheel.is_file() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let last = stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no output");
            return Err(Failure::new(format!(
                "could not fetch the wheel {spec} ({}); pass --cuda-include DIR to use local headers",
                last.trim()
            )));
        }
    }
    let bytes = std::fs::read(&wheel)
        .map_err(|e| Failure::new(format!("cannot read {}: {e}", wheel.display())))?;
    let digest = sha256_hex(&bytes);
    if digest != sha256 {
        // A corrupt or substituted download must not be used, nor kept.
        let _ = std::fs::remove_file(&wheel);
        return Err(Failure::new(format!(
            "{} has SHA-256 {digest}, expected {sha256}; removed it, run again",
            wheel.display()
        )));
    }
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|e| Failure::new(format!("{} is not a valid wheel: {e}", wheel.display())))?;
    for (name, dest) in headers {
        let mut entry = archive
            .by_name(name)
            .map_err(|e| Failure::new(format!("{name} not found in the wheel: {e}")))?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut entry, &mut text)
            .map_err(|e| Failure::new(format!("cannot unpack {name}: {e}")))?;
        util::write(dest, &text)?;
    }
    Ok(())
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The common bindgen configuration of both headers.
fn builder(wrapper_name: &str, wrapper: &str, include: &Path) -> bindgen::Builder {
    bindgen::Builder::default()
        .header_contents(wrapper_name, wrapper)
        .clang_arg(format!("-I{}", include.display()))
        // LP64 layout, the same on x86_64 and aarch64 Linux; the output is
        // target independent apart from C's own type names.
        .clang_arg("--target=x86_64-unknown-linux-gnu")
        .use_core()
        .ctypes_prefix("::core::ffi")
        // The headers' comments are NVIDIA's text: never copy them.
        .generate_comments(false)
        // Layout tests are hand-written (tests/layout.rs) so they can hold on
        // 32-bit targets too and be cross-checked against cudarc.
        .layout_tests(false)
        .derive_default(true)
        .derive_debug(true)
        .derive_copy(true)
        .derive_eq(true)
        .derive_hash(true)
        .impl_debug(false)
        // C enums are open sets: newtypes with associated constants, so an
        // unknown value from the driver is representable and never UB.
        .default_enum_style(bindgen::EnumVariation::NewType {
            is_bitfield: false,
            is_global: false,
        })
        // Enum newtypes wrap fixed-width integers (u32, u64), never `c_ulong`,
        // whose width would change on 32-bit targets.
        .translate_enum_integer_types(true)
        .allowlist_recursively(true)
        .formatter(bindgen::Formatter::Prettyplease)
}

fn bindgen_text(builder: bindgen::Builder, what: &str) -> Result<String> {
    // bindgen panics (instead of returning an error) when it cannot load
    // libclang; `catch` turns that into the same one-line error.
    let bindings = util::catch(
        &format!("bindgen failed on {what} (is libclang-dev installed?)"),
        || {
            builder.generate().map_err(|e| {
                Failure::new(format!(
                    "bindgen failed on {what}: {e} (is libclang-dev installed?)"
                ))
            })
        },
    )?;
    Ok(bindings.to_string())
}

fn pfn_wrapper(includes: &str, functions: &[&str]) -> String {
    let mut wrapper = String::from(includes);
    for f in functions {
        wrapper.push_str(&format!("typedef __typeof__({f}) *PFN_{f};\n"));
    }
    wrapper.push_str("struct tegra_interop_symbol_probe {\n");
    for f in functions {
        // Field names go through the preprocessor, so each field is named
        // after the symbol the header's rename macros pick.
        wrapper.push_str(&format!("    int {f};\n"));
    }
    wrapper.push_str("};\n");
    wrapper
}

/// Reads back the symbol names from the probe struct, in declaration order.
fn probe_symbols(text: &str, functions: &[&str]) -> Result<Vec<(String, String)>> {
    let file = syn::parse_file(text)
        .map_err(|e| Failure::new(format!("cannot parse bindgen output: {e}")))?;
    for item in file.items {
        if let syn::Item::Struct(s) = item {
            if s.ident == "tegra_interop_symbol_probe" {
                let names: Vec<String> = s
                    .fields
                    .iter()
                    .filter_map(|f| f.ident.as_ref().map(|i| i.to_string()))
                    .collect();
                if names.len() != functions.len() {
                    return Err(Failure::new("symbol probe lost fields".to_string()));
                }
                return Ok(functions
                    .iter()
                    .map(|f| (*f).to_string())
                    .zip(names)
                    .collect());
            }
        }
    }
    Err(Failure::new(
        "symbol probe struct missing from bindgen output".to_string(),
    ))
}

fn symbols_module(symbols: &[(String, String)], library: &str) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "\n/// Exported symbol names to resolve in {library}, one per `PFN_` type.\n\
         ///\n\
         /// Read back from the header's own rename macros (for example a\n\
         /// function that gained a `_v2` revision), not typed by hand.\n\
         pub mod symbols {{\n"
    ));
    for (api, symbol) in symbols {
        out.push_str(&format!(
            "    /// Symbol implementing `{api}` (type `super::PFN_{api}`).\n    \
             pub const {api}: &::core::ffi::CStr = c\"{symbol}\";\n"
        ));
    }
    out.push_str("}\n");
    out
}

fn preamble(source: &str) -> String {
    format!(
        "// @generated by `cargo xtask codegen` (bindgen 0.72.1). Do not edit by hand:\n\
         // change xtask/src/codegen.rs or crates/sys/include/ and run the command again.\n\
         // Source: {source}.\n\
         #![allow(non_camel_case_types, non_snake_case, non_upper_case_globals, missing_docs)]\n\
         #![allow(clippy::all, clippy::undocumented_unsafe_blocks)]\n\n"
    )
}

fn generate_cuda(include: &Path, source: &str) -> Result<String> {
    // EGL_NO_X11: the EGL headers without X11 types (no libx11-dev needed).
    let wrapper = pfn_wrapper(
        "#define EGL_NO_X11 1\n#include <cuda.h>\n#include <cudaEGL.h>\n",
        CUDA_FUNCTIONS,
    );
    let mut b = builder("tegra_interop_cuda.h", &wrapper, include);
    for t in CUDA_TYPES {
        b = b.allowlist_type(t);
    }
    for f in CUDA_FUNCTIONS {
        b = b.allowlist_type(format!("PFN_{f}"));
    }
    let types = bindgen_text(b.allowlist_var(CUDA_VARS), "cuda.h")?;
    let probe = bindgen_text(
        builder("tegra_interop_cuda.h", &wrapper, include)
            .allowlist_type("tegra_interop_symbol_probe"),
        "cuda.h (symbol probe)",
    )?;
    let symbols = probe_symbols(&probe, CUDA_FUNCTIONS)?;
    Ok(format!(
        "{}{}{}",
        preamble(source),
        types,
        symbols_module(&symbols, "libcuda.so.1")
    ))
}

/// The NVRTC bindings: `nvrtc.h` alone (it has no rename macros: each
/// symbol is the C name).
fn generate_nvrtc(include: &Path, source: &str) -> Result<String> {
    let wrapper = pfn_wrapper("#include <nvrtc.h>\n", NVRTC_FUNCTIONS);
    let mut b = builder("tegra_interop_nvrtc.h", &wrapper, include);
    for t in NVRTC_TYPES {
        b = b.allowlist_type(t);
    }
    for f in NVRTC_FUNCTIONS {
        b = b.allowlist_type(format!("PFN_{f}"));
    }
    let types = bindgen_text(b, "nvrtc.h")?;
    let probe = bindgen_text(
        builder("tegra_interop_nvrtc.h", &wrapper, include)
            .allowlist_type("tegra_interop_symbol_probe"),
        "nvrtc.h (symbol probe)",
    )?;
    let symbols = probe_symbols(&probe, NVRTC_FUNCTIONS)?;
    Ok(format!(
        "{}{}{}",
        preamble(source),
        types,
        symbols_module(&symbols, "libnvrtc.so.12")
    ))
}

#[derive(Clone, Copy, PartialEq)]
enum NvSciHeaders {
    Own,
    Real,
}

/// The `#include` lines of our own NvSci header and of the real ones.
const OWN_NVSCI_INCLUDES: &str = "#include \"tegra_interop_nvsci.h\"\n";
const REAL_NVSCI_INCLUDES: &str =
    "#include <nvscibuf.h>\n#include <nvscisync.h>\n#include <nvsciipc.h>\n";

/// The version constants (`static const uint32_t`) of the three libraries,
/// NvSciIpc's event bits and its endpoint-name limit (macros).
const NVSCI_VARS: &str =
    "NvSci(Buf|Sync|Ipc)(Major|Minor)Version|NV_SCI_IPC_EVENT_.*|NVSCIIPC_MAX_ENDPOINT_NAME";

/// `functions`: the entry points to make `PFN_` types for (all of
/// [`nvsci_functions`], or those an older release has).
fn generate_nvsci(include: &Path, headers: NvSciHeaders, functions: &[&str]) -> Result<String> {
    let (includes, source) = match headers {
        NvSciHeaders::Own => (
            OWN_NVSCI_INCLUDES,
            format!("the project's own declarations in {OWN_NVSCI_HEADER}"),
        ),
        NvSciHeaders::Real => (
            REAL_NVSCI_INCLUDES,
            format!("the NvSci headers in {}", include.display()),
        ),
    };
    let wrapper = pfn_wrapper(includes, functions);
    let mut b = builder("tegra_interop_nvsci_wrapper.h", &wrapper, include);
    for t in NVSCI_TYPES {
        b = b.allowlist_type(t);
    }
    for f in functions {
        b = b.allowlist_type(format!("PFN_{f}"));
    }
    let types = bindgen_text(b.allowlist_var(NVSCI_VARS), "the NvSci headers")?;
    let symbols: Vec<(String, String)> = functions
        .iter()
        .map(|f| ((*f).to_string(), (*f).to_string()))
        .collect();
    Ok(format!(
        "{}{}{}",
        preamble(&source),
        types,
        symbols_module(
            &symbols,
            "libnvscibuf.so.1 / libnvscisync.so.1 / libnvsciipc.so"
        )
    ))
}

/// Compares the ABI of our declarations (`own_bindings`, generated from
/// `own_dir`) with the real headers in `real_dir`; prints the report and
/// returns the number of ABI differences.
fn check_abi(
    own_dir: &Path,
    own_bindings: &str,
    real_dir: &Path,
    nvsci_functions: &[&str],
) -> Result<usize> {
    let declared = abi::Declared::from_bindings(own_bindings)?;
    let own_names = abi::names_present(own_dir, OWN_NVSCI_INCLUDES)?;
    let real_names = abi::names_present(real_dir, REAL_NVSCI_INCLUDES)?;
    // bindgen needs `__typeof__(f)` to compile, so only the entry points this
    // release declares get a `PFN_` type on the real side.
    let functions: Vec<&str> = nvsci_functions
        .iter()
        .copied()
        .filter(|f| real_names.contains(*f))
        .collect();
    let real_bindings = generate_nvsci(real_dir, NvSciHeaders::Real, &functions)?;
    let own = abi::Side::new(
        own_dir,
        OWN_NVSCI_INCLUDES,
        &declared,
        &own_names,
        own_bindings,
    )?;
    let real = abi::Side::new(
        real_dir,
        REAL_NVSCI_INCLUDES,
        &declared,
        &real_names,
        &real_bindings,
    )?;
    let report = abi::compare(&declared, &own, &real, &real_names);
    Ok(report.print(&abi::versions(&real)))
}

/// The files `cargo xtask codegen` writes into `crates/sys/src`.
const GENERATED: [&str; 5] = ["cuda.rs", "nvsci.rs", "lists.rs", "nvrtc.rs", "versions.rs"];

/// The markdown table of entry-point releases, in `crates/sys`.
const VERSIONS_MD: &str = "CUDA_VERSIONS.md";

/// `crates/sys/src/versions.rs` and `crates/sys/CUDA_VERSIONS.md` from the
/// typedef headers in `include` and the symbols of the fresh bindings.
fn generate_versions(include: &Path, cuda: &str, nvrtc: &str) -> Result<(String, String)> {
    let mut typedefs = String::new();
    for header in ["cudaTypedefs.h", "cudaEGLTypedefs.h"] {
        let path = include.join(header);
        typedefs.push_str(
            &std::fs::read_to_string(&path)
                .map_err(|e| Failure::new(format!("cannot read {}: {e}", path.display())))?,
        );
    }
    let cuda_rows = versions::cuda_since(&typedefs, &versions::symbols(cuda))?;
    if cuda_rows.len() != CUDA_FUNCTIONS.len() {
        return Err(Failure::new(
            "the symbols module of cuda.rs does not match the entry-point list".to_string(),
        ));
    }
    let nvrtc_rows: Vec<versions::Since> = versions::symbols(nvrtc)
        .into_iter()
        .map(|(name, symbol)| versions::Since {
            name,
            symbol,
            since: versions::NVRTC_SINCE,
        })
        .collect();
    Ok((
        versions::render_rs(&cuda_rows, &nvrtc_rows),
        versions::render_md(&cuda_rows, &nvrtc_rows),
    ))
}

/// Every NvSci entry point: the functions [`OWN_NVSCI_HEADER`] declares, in
/// declaration order.
fn nvsci_functions(own_dir: &Path) -> Result<Vec<String>> {
    let b = builder("tegra_interop_nvsci_wrapper.h", OWN_NVSCI_INCLUDES, own_dir)
        .allowlist_function("NvSci.*");
    let text = bindgen_text(b, "the NvSci declarations (function list)")?;
    let names = lists::declared_functions(&text)?;
    if names.is_empty() {
        return Err(Failure::new(format!(
            "{OWN_NVSCI_HEADER} declares no NvSci function"
        )));
    }
    Ok(names)
}

/// The text of `crates/sys/src/lists.rs` from the freshly generated bindings.
fn generate_lists(
    cuda: &str,
    nvrtc: &str,
    nvsci: &str,
    nvsci_functions: &[&str],
) -> Result<String> {
    let cuda_entries = lists::entries(cuda, "cuda", CUDA_FUNCTIONS)?;
    let nvrtc_entries = lists::entries(nvrtc, "nvrtc", NVRTC_FUNCTIONS)?;
    let group = |prefix: &str| -> Vec<&str> {
        nvsci_functions
            .iter()
            .copied()
            .filter(|f| f.starts_with(prefix))
            .collect()
    };
    let buf = lists::entries(nvsci, "nvsci", &group("NvSciBuf"))?;
    let sync = lists::entries(nvsci, "nvsci", &group("NvSciSync"))?;
    let ipc = lists::entries(nvsci, "nvsci", &group("NvSciIpc"))?;
    let grouped = buf.len() + sync.len() + ipc.len();
    if grouped != nvsci_functions.len() {
        return Err(Failure::new(format!(
            "{OWN_NVSCI_HEADER}: every function must start with NvSciBuf, NvSciSync or NvSciIpc"
        )));
    }
    let apis = [
        lists::Api {
            name: "CudaApi",
            module: "cuda",
            library: "libcuda.so.1",
            macro_name: "cuda_entry_points",
            entries: &cuda_entries,
        },
        lists::Api {
            name: "NvSciBufApi",
            module: "nvsci",
            library: "libnvscibuf.so.1",
            macro_name: "nvscibuf_entry_points",
            entries: &buf,
        },
        lists::Api {
            name: "NvSciSyncApi",
            module: "nvsci",
            library: "libnvscisync.so.1",
            macro_name: "nvscisync_entry_points",
            entries: &sync,
        },
        lists::Api {
            name: "NvSciIpcApi",
            module: "nvsci",
            library: "libnvsciipc.so",
            macro_name: "nvsciipc_entry_points",
            entries: &ipc,
        },
        lists::Api {
            name: "NvrtcApi",
            module: "nvrtc",
            library: "libnvrtc.so.12",
            macro_name: "nvrtc_entry_points",
            entries: &nvrtc_entries,
        },
    ];
    let cuda_codes = lists::codes(cuda, "cudaError_enum", &["CUDA_ERROR_", "CUDA_"])?;
    let nvsci_codes = lists::codes(nvsci, "NvSciError", &["NvSciError_"])?;
    Ok(lists::render_file(&apis, &cuda_codes, &nvsci_codes))
}
