//! `crates/sys/src/versions.rs` and `crates/sys/CUDA_VERSIONS.md`: the CUDA
//! release that introduced each entry point the project resolves, derived
//! from the pinned headers (never typed by hand).
//!
//! Source: `cudaTypedefs.h` and `cudaEGLTypedefs.h` of the same pinned wheel
//! as `cuda.h`. They declare one function-pointer type per ABI revision of
//! each driver function, named `PFN_<name>_v<NNNNN>` where `NNNNN` is the
//! `CUDA_VERSION` of the release that introduced that revision (the number a
//! caller passes to `cuGetProcAddress` to ask for it; revisions older than
//! the header's floor sit in its `__CUDA_API_VERSION_INTERNAL` block, which
//! is read too). The exported symbols of one function are `<name>`,
//! `<name>_v2`, `<name>_v3`, ... in the order of those revisions, so the
//! symbol the loader resolves (the header's rename macros pick it:
//! `cuMemAlloc` -> `cuMemAlloc_v2`) was introduced by the revision at the
//! same position: `cuMemAlloc_v2` is the second revision, `_v3020`, CUDA 3.2.
//! The per-thread-stream variants (`_ptds`, `_ptsz`) are other symbols and
//! are left out. A symbol with more revision suffixes than the header has
//! revisions is an error, so a header that breaks the rule cannot produce a
//! wrong table silently.
//!
//! Cross-checked once by script (session 11) against cudarc 0.19.10's
//! feature-gated bindings, for the 60 CUDA entries cudarc binds (it has no
//! EGL call and no `cuDeviceGetNvSciSyncAttributes`): every entry this
//! derives as 11.4 or older is bound under cudarc's `cuda-11040` feature,
//! and the two it derives as newer (`cuMemGetHandleForAddressRange` 11.7,
//! `cuFuncGetParamInfo` 12.4) are gated to `cuda-11070` and `cuda-12040`
//! onwards there; no entry disagreed.
//!
//! NVRTC has no such typedef header: every NVRTC call of the table is part
//! of NVRTC since its first release, CUDA 7.0 (and bound under cudarc's
//! `cuda-11040` feature); [`NVRTC_SINCE`] says so once.

use crate::util::{Failure, Result};

/// The CUDA release (as `CUDA_VERSION`) of NVRTC's first release, which
/// already had every NVRTC call of the table.
pub const NVRTC_SINCE: u32 = 7000;

/// The CUDA release a JetPack 5 / DRIVE OS 6.0 driver implements (the floor
/// the table's last column is about).
pub const FLOOR: u32 = 11040;

/// One entry point with the release that introduced its symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Since {
    /// The C name (the table's field).
    pub name: String,
    /// The exported symbol the loader resolves.
    pub symbol: String,
    /// `CUDA_VERSION` of the release that introduced `symbol`.
    pub since: u32,
}

/// (C name, symbol) pairs from the `symbols` module of a generated
/// bindings text (`pub const NAME: &::core::ffi::CStr = c"SYMBOL";`).
pub fn symbols(bindings: &str) -> Vec<(String, String)> {
    bindings
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("pub const ")?;
            let (name, rest) = rest.split_once(": &::core::ffi::CStr = c\"")?;
            let symbol = rest.strip_suffix("\";")?;
            Some((name.to_string(), symbol.to_string()))
        })
        .collect()
}

/// The revisions (`NNNNN` of `PFN_<base>_vNNNNN`) the typedef headers
/// declare for `base`, ascending, without the per-thread variants.
fn revisions(typedefs: &str, base: &str) -> Vec<u32> {
    let needle = format!("*PFN_{base}_v");
    let mut out: Vec<u32> = typedefs
        .match_indices(&needle)
        .filter_map(|(at, _)| {
            let rest = &typedefs[at + needle.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            // `)` right after the digits: the plain revision, not `_ptds`.
            if digits.is_empty() || !rest[digits.len()..].starts_with(')') {
                return None;
            }
            digits.parse().ok()
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// `cuMemAlloc_v2` -> (`cuMemAlloc`, 2); `cuInit` -> (`cuInit`, 1).
fn split_revision(symbol: &str) -> (&str, usize) {
    if let Some((base, n)) = symbol.rsplit_once("_v") {
        if let Ok(n) = n.parse::<usize>() {
            if n >= 2 {
                return (base, n);
            }
        }
    }
    (symbol, 1)
}

/// The release that introduced each of `symbols` (C name, symbol), read
/// from the text of the typedef headers.
pub fn cuda_since(typedefs: &str, symbols: &[(String, String)]) -> Result<Vec<Since>> {
    symbols
        .iter()
        .map(|(name, symbol)| {
            let (base, position) = split_revision(symbol);
            let found = revisions(typedefs, base);
            let since = found.get(position - 1).copied().ok_or_else(|| {
                Failure::new(format!(
                    "{name}: the typedef headers declare {} revision(s) of {base} ({found:?}), \
                     so they cannot say when {symbol} (revision {position}) appeared",
                    found.len()
                ))
            })?;
            Ok(Since {
                name: name.clone(),
                symbol: symbol.clone(),
                since,
            })
        })
        .collect()
}

/// `12040` -> `12.4`.
pub fn dotted(v: u32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The text of `crates/sys/src/versions.rs`.
pub fn render_rs(cuda: &[Since], nvrtc: &[Since]) -> String {
    let mut out = String::from(
        "// @generated by `cargo xtask codegen` from cudaTypedefs.h and cudaEGLTypedefs.h of the\n\
         // pinned CUDA wheel (xtask/src/versions.rs says how). Do not edit by hand.\n\
         //! The CUDA release that introduced each entry point the project resolves (the\n\
         //! symbol the loader looks up, so `cuMemAlloc` is dated by `cuMemAlloc_v2`).\n\
         //! A driver older than an entry's `since` does not export its symbol. The same\n\
         //! table, as markdown, is `crates/sys/CUDA_VERSIONS.md`.\n\n\
         /// One entry point and the release that introduced its symbol.\n\
         #[derive(Clone, Copy, Debug, PartialEq, Eq)]\n\
         pub struct EntryPointVersion {\n\
         \x20   /// The C name (the field of the function table).\n\
         \x20   pub name: &'static str,\n\
         \x20   /// The exported symbol the loader resolves.\n\
         \x20   pub symbol: &'static str,\n\
         \x20   /// The release that introduced `symbol`, as `cuDriverGetVersion`\n\
         \x20   /// reports versions (12040 is CUDA 12.4).\n\
         \x20   pub since: i32,\n\
         }\n",
    );
    for (what, name, rows) in [
        ("CUDA driver (`libcuda.so.1`)", "CUDA", cuda),
        ("NVRTC", "NVRTC", nvrtc),
    ] {
        out.push_str(&format!(
            "\n/// Every {what} entry point of the table, in list order.\npub const {name}: &[EntryPointVersion] = &[\n"
        ));
        for r in rows {
            out.push_str(&format!(
                "    EntryPointVersion {{ name: \"{}\", symbol: \"{}\", since: {} }},\n",
                r.name, r.symbol, r.since
            ));
        }
        out.push_str("];\n");
    }
    out.push_str(
        "\n/// The release that introduced the entry point `name` (C name, CUDA or\n\
         /// NVRTC), if it is one of the table's.\n\
         pub fn since(name: &str) -> Option<i32> {\n\
         \x20   let mut i = 0;\n\
         \x20   while i < CUDA.len() {\n\
         \x20       if eq(CUDA[i].name, name) {\n\
         \x20           return Some(CUDA[i].since);\n\
         \x20       }\n\
         \x20       i += 1;\n\
         \x20   }\n\
         \x20   let mut i = 0;\n\
         \x20   while i < NVRTC.len() {\n\
         \x20       if eq(NVRTC[i].name, name) {\n\
         \x20           return Some(NVRTC[i].since);\n\
         \x20       }\n\
         \x20       i += 1;\n\
         \x20   }\n\
         \x20   None\n\
         }\n\n\
         fn eq(a: &str, b: &str) -> bool {\n\
         \x20   a.len() == b.len() && a.as_bytes() == b.as_bytes()\n\
         }\n",
    );
    out
}

/// The text of `crates/sys/CUDA_VERSIONS.md`.
pub fn render_md(cuda: &[Since], nvrtc: &[Since]) -> String {
    let mut out = format!(
        "<!-- @generated by `cargo xtask codegen` (xtask/src/versions.rs). Do not edit by hand. -->\n\
         # The CUDA release of every entry point\n\n\
         Each C entry point the project resolves at run time, the exported symbol the\n\
         loader looks up (the header picks the `_v2`/`_v3` revision), and the CUDA release\n\
         that introduced that symbol. A driver older than that release does not export it:\n\
         the driver crate then answers `Error::NeedsNewerDriver` naming the entry point and\n\
         this release, before any call (see crates/driver/README.md, \"Older drivers\").\n\n\
         Source: the revision typedefs `PFN_<name>_v<release>` of `cudaTypedefs.h` and\n\
         `cudaEGLTypedefs.h` in the pinned CUDA 12.9 wheel (the n-th revision is the symbol\n\
         `<name>_vn`). Cross-checked against cudarc 0.19.10's feature-gated bindings for the\n\
         entries it binds (all but the EGL calls and `cuDeviceGetNvSciSyncAttributes`): its\n\
         `cuda-11040` bindings have exactly those marked yes below. NVRTC's calls all date\n\
         from its first release, CUDA 7.0 (cudarc binds them for every CUDA it supports).\n\n\
         Floor: CUDA {} (JetPack 5, DRIVE OS 6.0).\n\n",
        dotted(FLOOR)
    );
    for (title, rows) in [("CUDA driver (`libcuda.so.1`)", cuda), ("NVRTC", nvrtc)] {
        let lacking = rows.iter().filter(|r| r.since > FLOOR).count();
        out.push_str(&format!(
            "## {title}\n\n{} entry points, {lacking} newer than CUDA {}.\n\n\
             | entry point | symbol | since CUDA | in {} |\n|---|---|---|---|\n",
            rows.len(),
            dotted(FLOOR),
            dotted(FLOOR)
        ));
        for r in rows {
            out.push_str(&format!(
                "| `{}` | `{}` | {} | {} |\n",
                r.name,
                r.symbol,
                dotted(r.since),
                if r.since <= FLOOR { "yes" } else { "**no**" }
            ));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const TYPEDEFS: &str = "
        typedef CUresult (CUDAAPI *PFN_cuMemAlloc_v3020)(CUdeviceptr_v2 *dptr, size_t bytesize);
        typedef CUresult (CUDAAPI *PFN_cuMemsetD8_v7000_ptds)(CUdeviceptr_v2 d, unsigned char uc, size_t N);
        typedef CUresult (CUDAAPI *PFN_cuMemsetD8_v3020)(CUdeviceptr_v2 d, unsigned char uc, size_t N);
        typedef CUresult (CUDAAPI *PFN_cuFuncGetParamInfo_v12040)(CUfunction f, size_t i, size_t *o, size_t *s);
        #if defined(__CUDA_API_VERSION_INTERNAL)
            typedef CUresult (CUDAAPI *PFN_cuMemAlloc_v2000)(CUdeviceptr_v1 *dptr, unsigned int bytesize);
            typedef CUresult (CUDAAPI *PFN_cuMemsetD8_v2000)(CUdeviceptr_v1 d, unsigned char uc, unsigned int N);
        #endif
    ";

    fn pair(name: &str, symbol: &str) -> (String, String) {
        (name.to_string(), symbol.to_string())
    }

    #[test]
    fn the_symbols_revision_picks_the_release() {
        let got = cuda_since(
            TYPEDEFS,
            &[
                pair("cuMemAlloc", "cuMemAlloc_v2"),
                pair("cuMemsetD8", "cuMemsetD8_v2"),
                pair("cuFuncGetParamInfo", "cuFuncGetParamInfo"),
            ],
        )
        .unwrap();
        let since: Vec<u32> = got.iter().map(|s| s.since).collect();
        assert_eq!(since, [3020, 3020, 12040]);
        let first = cuda_since(TYPEDEFS, &[pair("cuMemAlloc", "cuMemAlloc")]).unwrap();
        assert_eq!(
            first[0].since, 2000,
            "the unsuffixed symbol is the oldest revision"
        );
    }

    #[test]
    fn a_symbol_the_headers_cannot_date_is_an_error() {
        let e = cuda_since(TYPEDEFS, &[pair("cuMemAlloc", "cuMemAlloc_v3")]).unwrap_err();
        assert!(e.message.contains("cuMemAlloc_v3"), "{}", e.message);
        let e = cuda_since(TYPEDEFS, &[pair("cuNothing", "cuNothing")]).unwrap_err();
        assert!(e.message.contains("0 revision"), "{}", e.message);
    }

    #[test]
    fn symbols_are_read_from_the_generated_module() {
        let text = "pub mod symbols {\n    pub const cuMemFree: &::core::ffi::CStr = c\"cuMemFree_v2\";\n}\n";
        assert_eq!(symbols(text), [pair("cuMemFree", "cuMemFree_v2")]);
    }

    #[test]
    fn the_markdown_marks_what_the_floor_lacks() {
        let rows = cuda_since(
            TYPEDEFS,
            &[
                pair("cuMemAlloc", "cuMemAlloc_v2"),
                pair("cuFuncGetParamInfo", "cuFuncGetParamInfo"),
            ],
        )
        .unwrap();
        let md = render_md(&rows, &[]);
        assert!(
            md.contains("| `cuMemAlloc` | `cuMemAlloc_v2` | 3.2 | yes |"),
            "{md}"
        );
        assert!(
            md.contains("| `cuFuncGetParamInfo` | `cuFuncGetParamInfo` | 12.4 | **no** |"),
            "{md}"
        );
        assert!(
            md.contains("2 entry points, 1 newer than CUDA 11.4"),
            "{md}"
        );
        let rs = render_rs(&rows, &[]);
        assert!(
            rs.contains(
                "name: \"cuFuncGetParamInfo\", symbol: \"cuFuncGetParamInfo\", since: 12040"
            ),
            "{rs}"
        );
    }
}
