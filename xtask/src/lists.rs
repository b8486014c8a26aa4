//! `crates/sys/src/lists.rs`: every list the other crates used to keep by
//! hand, generated from the one list of entry points.
//!
//! Inputs are the bindings bindgen just produced (never the committed files):
//! - the entry points: [`crate::codegen::CUDA_FUNCTIONS`] for CUDA, and for
//!   NvSci every prototype declared in `crates/sys/include/tegra_interop_nvsci.h`
//!   (in declaration order), each with the signature of its `PFN_` type;
//! - the result codes: the constants of bindgen's `CUresult` and `NvSciError`
//!   newtypes, sorted by value.
//!
//! The output is a set of `#[macro_export]` "list macros" in the callback
//! style: `cuda_entry_points!(m extra...)` expands to `m! { [extra...] CudaApi
//! "libcuda.so.1" cuInit { symbol: .., pfn: .., ret: safe fn(..) -> .. } ... }`,
//! where `unsafe fn` instead of `safe fn` marks an entry point that takes a
//! raw pointer (its wrappers are `unsafe fn`s: the caller vouches for the
//! pointers).
//! The sys crate builds the table structs from them, the driver its loader,
//! the simulator its trampolines; core and the simulator their code names.

use crate::util::{Failure, Result};

/// One C entry point, as its `PFN_` type declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The C name (the field name in the table).
    pub name: String,
    /// Argument types, as Rust source with sys-crate paths (`$crate::...`).
    pub args: Vec<String>,
    /// Return type as Rust source; `None` for `void`.
    pub ret: Option<String>,
    /// Whether an argument is a raw pointer (`*mut`/`*const`, as the `PFN_`
    /// type writes it): the entry point reads or writes memory the caller
    /// names.
    pub takes_pointer: bool,
}

/// One named result code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Code {
    /// Short Rust name (`INVALID_VALUE`).
    pub short: String,
    /// The value.
    pub value: u64,
    /// The C name (`CUDA_ERROR_INVALID_VALUE`).
    pub c_name: String,
}

/// One table group: a struct name, its library and its entry points.
pub struct Api<'a> {
    /// Struct name in the sys crate (`CudaApi`).
    pub name: &'static str,
    /// The module of sys holding its `PFN_` types (`cuda`, `nvsci`).
    pub module: &'static str,
    /// Soname.
    pub library: &'static str,
    /// The list macro's name (`cuda_entry_points`).
    pub macro_name: &'static str,
    /// The entry points.
    pub entries: &'a [Entry],
}

fn parse(text: &str, what: &str) -> Result<syn::File> {
    syn::parse_file(text).map_err(|e| Failure::new(format!("cannot parse {what}: {e}")))
}

/// The function names `extern "C"` blocks of `bindings` declare, in order.
pub fn declared_functions(bindings: &str) -> Result<Vec<String>> {
    let file = parse(bindings, "bindgen output (declared functions)")?;
    let mut out = Vec::new();
    for item in file.items {
        if let syn::Item::ForeignMod(block) = item {
            for f in block.items {
                if let syn::ForeignItem::Fn(f) = f {
                    out.push(f.sig.ident.to_string());
                }
            }
        }
    }
    Ok(out)
}

/// Reads the signature of `PFN_<name>` for each of `functions` from
/// `bindings` (the generated text of sys module `module`).
pub fn entries(bindings: &str, module: &str, functions: &[&str]) -> Result<Vec<Entry>> {
    let file = parse(bindings, "bindgen output (PFN types)")?;
    let mut types = std::collections::HashMap::new();
    for item in &file.items {
        if let syn::Item::Type(t) = item {
            types.insert(t.ident.to_string(), &*t.ty);
        }
    }
    functions
        .iter()
        .map(|f| {
            let pfn = format!("PFN_{f}");
            let ty = types
                .get(&pfn)
                .ok_or_else(|| Failure::new(format!("{pfn} missing from the bindings")))?;
            let bare = option_fn(ty).ok_or_else(|| {
                Failure::new(format!("{pfn} is not `Option<unsafe extern \"C\" fn>`"))
            })?;
            let args = bare
                .inputs
                .iter()
                .map(|a| render(&a.ty, module))
                .collect::<Result<Vec<_>>>()?;
            let ret = match &bare.output {
                syn::ReturnType::Default => None,
                syn::ReturnType::Type(_, t) => Some(render(t, module)?),
            };
            let takes_pointer = bare.inputs.iter().any(|a| has_pointer(&a.ty));
            Ok(Entry {
                name: (*f).to_string(),
                args,
                ret,
                takes_pointer,
            })
        })
        .collect()
}

/// Whether `ty` is or contains a raw pointer (`*mut T`, `[*const T; N]`,
/// a function pointer's own pointer arguments do not count: calling it is
/// the callee's business). Named types (handles such as `CUcontext`) are
/// values here: the crate that passes them keeps them valid.
fn has_pointer(ty: &syn::Type) -> bool {
    match ty {
        syn::Type::Ptr(_) => true,
        syn::Type::Array(a) => has_pointer(&a.elem),
        syn::Type::Paren(p) => has_pointer(&p.elem),
        syn::Type::Group(g) => has_pointer(&g.elem),
        _ => false,
    }
}

/// `Option<unsafe extern "C" fn(..)>` -> the fn type.
fn option_fn(ty: &syn::Type) -> Option<&syn::TypeBareFn> {
    let syn::Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    if last.ident != "Option" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.first()? {
        syn::GenericArgument::Type(syn::Type::BareFn(f)) => Some(f),
        _ => None,
    }
}

const PRIMITIVES: &[&str] = &[
    "u8", "u16", "u32", "u64", "usize", "i8", "i16", "i32", "i64", "isize", "bool", "f32", "f64",
];

/// A type as Rust source, with the sys crate's own types spelled
/// `$crate::<module>::Name` so the list macros work from any crate.
fn render(ty: &syn::Type, module: &str) -> Result<String> {
    match ty {
        syn::Type::Ptr(p) => Ok(format!(
            "*{} {}",
            if p.mutability.is_some() {
                "mut"
            } else {
                "const"
            },
            render(&p.elem, module)?
        )),
        syn::Type::Path(p) if p.qself.is_none() => {
            let mut segments = Vec::new();
            for s in &p.path.segments {
                if !s.arguments.is_none() {
                    return Err(Failure::new(format!(
                        "unexpected generic type `{}` in a PFN signature",
                        s.ident
                    )));
                }
                segments.push(s.ident.to_string());
            }
            let joined = segments.join("::");
            if p.path.leading_colon.is_some() {
                Ok(format!("::{joined}"))
            } else if segments.len() == 1 && PRIMITIVES.contains(&joined.as_str()) {
                Ok(joined)
            } else {
                Ok(format!("$crate::{module}::{joined}"))
            }
        }
        syn::Type::Tuple(t) if t.elems.is_empty() => Ok("()".to_string()),
        _ => Err(Failure::new(
            "unexpected type shape in a PFN signature".to_string(),
        )),
    }
}

/// The constants of `impl <type_name> { pub const X: T = T(v); }` blocks,
/// as (C name, value), sorted by value (first name wins for a value).
pub fn codes(bindings: &str, type_name: &str, prefixes: &[&str]) -> Result<Vec<Code>> {
    let file = parse(bindings, "bindgen output (codes)")?;
    let mut out: Vec<Code> = Vec::new();
    for item in &file.items {
        let syn::Item::Impl(block) = item else {
            continue;
        };
        let syn::Type::Path(p) = &*block.self_ty else {
            continue;
        };
        if !p.path.is_ident(type_name) {
            continue;
        }
        for i in &block.items {
            let syn::ImplItem::Const(c) = i else { continue };
            let c_name = c.ident.to_string();
            let Some(value) = const_value(&c.expr) else {
                return Err(Failure::new(format!("{c_name}: value is not a literal")));
            };
            let rest = prefixes
                .iter()
                .find_map(|p| c_name.strip_prefix(p))
                .ok_or_else(|| Failure::new(format!("{c_name}: unexpected prefix")))?;
            let short = if rest.contains('_') || rest.chars().all(|c| !c.is_lowercase()) {
                rest.to_string()
            } else {
                upper_snake(rest)
            };
            if !out.iter().any(|o| o.value == value) {
                out.push(Code {
                    short,
                    value,
                    c_name,
                });
            }
        }
    }
    if out.is_empty() {
        return Err(Failure::new(format!("no constants of {type_name} found")));
    }
    out.sort_by_key(|c| c.value);
    Ok(out)
}

fn const_value(expr: &syn::Expr) -> Option<u64> {
    match expr {
        syn::Expr::Call(call) => const_value(call.args.first()?),
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(i),
            ..
        }) => i.base10_parse().ok(),
        _ => None,
    }
}

/// `AttrListValidationFailed` -> `ATTR_LIST_VALIDATION_FAILED`.
fn upper_snake(camel: &str) -> String {
    let mut out = String::new();
    for (i, ch) in camel.chars().enumerate() {
        if ch.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(ch.to_ascii_uppercase());
    }
    out
}

/// The text of `crates/sys/src/lists.rs`.
pub fn render_file(apis: &[Api<'_>], cuda_codes: &[Code], nvsci_codes: &[Code]) -> String {
    let mut out = String::from(
        "// @generated by `cargo xtask codegen`. Do not edit by hand: change the entry-point\n\
         // list in xtask/src/codegen.rs (CUDA) or declare the function in\n\
         // crates/sys/include/tegra_interop_nvsci.h (NvSci), and run the command again.\n\
         //! The project's lists, written once: every C entry point it resolves (with the\n\
         //! signature of its `PFN_` type and its exported symbol) and every named result\n\
         //! code, as callback macros. `cuda_entry_points!(m extra...)` expands to\n\
         //! `m! { [extra...] CudaApi \"libcuda.so.1\" cuInit { symbol: .., pfn: .., ret: safe fn(a0: ..) -> .. } ... }`\n\
         //! (`void` instead of `ret` for C functions without a result; their return type is `()`;\n\
         //! `unsafe fn` instead of `safe fn` for entry points that take a raw pointer argument).\n\
         //! [`crate::table`] builds the function table from them, the driver its loader,\n\
         //! the simulator its trampolines; the result-code lists name the codes in core\n\
         //! and in the simulator.\n",
    );
    for api in apis {
        out.push_str(&format!(
            "\n/// Calls `$m! {{ [extra...] {} \"{}\" entries... }}` with every entry point of\n\
             /// `{}` the project resolves (see the module documentation for the form).\n\
             #[macro_export]\n\
             macro_rules! {} {{\n    ($m:ident $($extra:tt)*) => {{\n        $m! {{\n            [$($extra)*] {} \"{}\"\n",
            api.name, api.library, api.library, api.macro_name, api.name, api.library
        ));
        for e in api.entries {
            let args: Vec<String> = e
                .args
                .iter()
                .enumerate()
                .map(|(i, t)| format!("a{i}: {t}"))
                .collect();
            let (kind, ret) = match &e.ret {
                Some(r) => ("ret", r.as_str()),
                None => ("void", "()"),
            };
            let safety = if e.takes_pointer { "unsafe" } else { "safe" };
            out.push_str(&format!(
                "            {name} {{ symbol: $crate::{m}::symbols::{name}, pfn: $crate::{m}::PFN_{name}, {kind}: {safety} fn({args}) -> {ret} }}\n",
                name = e.name,
                m = api.module,
                args = args.join(", "),
            ));
        }
        out.push_str("        }\n    };\n}\n");
    }
    for (macro_name, what, codes) in [
        ("cuda_result_codes", "`CUresult`", cuda_codes),
        ("nvsci_error_codes", "`NvSciError`", nvsci_codes),
    ] {
        out.push_str(&format!(
            "\n/// Calls `$m! {{ [extra...] SHORT = value, \"C_NAME\", c\"C_NAME\"; ... }}` with every\n\
             /// named {what} value of the header, in ascending order of value.\n\
             #[macro_export]\n\
             macro_rules! {macro_name} {{\n    ($m:ident $($extra:tt)*) => {{\n        $m! {{\n            [$($extra)*]\n"
        ));
        for c in codes {
            out.push_str(&format!(
                "            {} = {:#x}, \"{}\", c\"{}\";\n",
                c.short, c.value, c.c_name, c.c_name
            ));
        }
        out.push_str("        }\n    };\n}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const BINDINGS: &str = r#"
        pub type CUdeviceptr = u64;
        pub type PFN_cuMemAlloc = ::core::option::Option<
            unsafe extern "C" fn(arg1: *mut CUdeviceptr, arg2: usize) -> CUresult,
        >;
        pub type PFN_cuNewThing = ::core::option::Option<
            unsafe extern "C" fn(arg1: *const ::core::ffi::c_int),
        >;
        pub type PFN_cuValues = ::core::option::Option<
            unsafe extern "C" fn(arg1: CUdeviceptr, arg2: CUcontext) -> CUresult,
        >;
        impl cudaError_enum {
            pub const CUDA_SUCCESS: cudaError_enum = cudaError_enum(0);
            pub const CUDA_ERROR_INVALID_VALUE: cudaError_enum = cudaError_enum(1);
        }
        extern "C" { pub fn NvSciA(); pub fn NvSciB(x: u32); }
    "#;

    #[test]
    fn a_new_entry_point_is_one_list_line_and_reaches_every_list() {
        let entries = entries(BINDINGS, "cuda", &["cuMemAlloc", "cuNewThing", "cuValues"]).unwrap();
        assert_eq!(
            entries[0].args,
            ["*mut $crate::cuda::CUdeviceptr".to_string(), "usize".into()]
        );
        assert_eq!(entries[0].ret.as_deref(), Some("$crate::cuda::CUresult"));
        assert_eq!(entries[1].ret, None);
        assert!(entries[0].takes_pointer && entries[1].takes_pointer);
        assert!(!entries[2].takes_pointer, "handles and integers are values");
        let api = Api {
            name: "CudaApi",
            module: "cuda",
            library: "libcuda.so.1",
            macro_name: "cuda_entry_points",
            entries: &entries,
        };
        let text = render_file(&[api], &[], &[]);
        assert!(text.contains(
            "cuNewThing { symbol: $crate::cuda::symbols::cuNewThing, pfn: $crate::cuda::PFN_cuNewThing, void: unsafe fn(a0: *const ::core::ffi::c_int) -> () }"
        ), "{text}");
        assert!(
            text.contains("PFN_cuValues, ret: safe fn(a0: $crate::cuda::CUdeviceptr, a1: $crate::cuda::CUcontext) -> $crate::cuda::CUresult }"),
            "{text}"
        );
        assert!(text.contains("cuMemAlloc { symbol: $crate::cuda::symbols::cuMemAlloc"));
    }

    #[test]
    fn a_pfn_missing_from_the_bindings_is_an_error() {
        let e = entries(BINDINGS, "cuda", &["cuNotThere"]).unwrap_err();
        assert!(e.message.contains("PFN_cuNotThere"), "{}", e.message);
    }

    #[test]
    fn codes_are_named_and_sorted() {
        let c = codes(BINDINGS, "cudaError_enum", &["CUDA_ERROR_", "CUDA_"]).unwrap();
        assert_eq!(c[0].short, "SUCCESS");
        assert_eq!(c[1].short, "INVALID_VALUE");
        assert_eq!(c[1].c_name, "CUDA_ERROR_INVALID_VALUE");
        assert_eq!(
            upper_snake("AttrListValidationFailed"),
            "ATTR_LIST_VALIDATION_FAILED"
        );
    }

    #[test]
    fn declared_functions_keep_declaration_order() {
        assert_eq!(declared_functions(BINDINGS).unwrap(), ["NvSciA", "NvSciB"]);
    }
}
