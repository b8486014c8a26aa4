//! The ABI comparison behind `cargo xtask codegen --nvsci-include DIR --check`.
//!
//! The project declares its NvSci subset in its own words
//! (`crates/sys/include/tegra_interop_nvsci.h`); the real headers spell some
//! of it differently (a `uint64_t` typedef plus `#define`s where we have an
//! enum, a record under another name). Spelling does not matter to the
//! machine code, so this module compares what does:
//!
//! - **constants**: the value of every constant we declare, evaluated by the
//!   host C compiler (so enum constants, `#define`s with casts and
//!   `static const` variables are all read the same way);
//! - **types and records**: `sizeof`, `_Alignof` and the `offsetof` of every
//!   field, measured by a small C program compiled and run on the host (LP64:
//!   the same layout as aarch64 Linux), plus each field's type reduced to its
//!   ABI shape;
//! - **prototypes**: parameter and return types reduced to their ABI shape
//!   (typedefs resolved, an enum newtype becomes its integer, a record
//!   becomes its field shapes plus packing, an opaque handle becomes a
//!   pointer), read from bindgen's output for both sides. Pointer
//!   const-ness is not ABI; where it differs, a note says so.
//!
//! An item we declare that the real headers lack is a difference, unless the
//! real headers are an older release of that library than ours (their
//! `Nv*MajorVersion`/`Nv*MinorVersion`, or none at all); then it is listed as
//! "absent in this release", information for code that must probe for it.

use crate::util::{Failure, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The libraries whose version constants decide what "older" means.
const LIBRARIES: &[&str] = &["NvSciBuf", "NvSciSync", "NvSciIpc"];

/// What the project's own header declares, read from its generated bindings.
#[derive(Debug, Default)]
pub struct Declared {
    /// C names of constants (enum constants, `static const` variables).
    pub constants: Vec<String>,
    /// Named types that are not records (enums, scalar and handle typedefs).
    pub types: Vec<String>,
    /// Records with their field names, in declaration order.
    pub records: Vec<(String, Vec<String>)>,
    /// Functions (from the `PFN_` types).
    pub functions: Vec<String>,
}

impl Declared {
    /// Reads the declarations out of bindgen's output for our own header.
    pub fn from_bindings(text: &str) -> Result<Declared> {
        let file = parse(text)?;
        let mut d = Declared::default();
        for item in &file.items {
            match item {
                syn::Item::Impl(i) => {
                    for impl_item in &i.items {
                        if let syn::ImplItem::Const(c) = impl_item {
                            d.constants.push(c.ident.to_string());
                        }
                    }
                }
                syn::Item::Const(c) => d.constants.push(c.ident.to_string()),
                syn::Item::Struct(s) => match &s.fields {
                    syn::Fields::Unnamed(_) => d.types.push(s.ident.to_string()),
                    syn::Fields::Named(named) => {
                        let fields: Vec<String> = named
                            .named
                            .iter()
                            .filter_map(|f| f.ident.as_ref().map(|i| i.to_string()))
                            .collect();
                        if fields != ["_unused"] {
                            d.records.push((s.ident.to_string(), fields));
                        }
                    }
                    syn::Fields::Unit => {}
                },
                syn::Item::Type(t) => {
                    let name = t.ident.to_string();
                    match name.strip_prefix("PFN_") {
                        Some(f) => d.functions.push(f.to_string()),
                        None => d.types.push(name),
                    }
                }
                _ => {}
            }
        }
        Ok(d)
    }
}

fn parse(text: &str) -> Result<syn::File> {
    syn::parse_file(text).map_err(|e| Failure::new(format!("cannot parse bindgen output: {e}")))
}

/// The host C compiler (`$CC`, else `cc`).
fn cc() -> String {
    std::env::var("CC")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .unwrap_or_else(|| "cc".to_string())
}

/// A scratch directory for the probe, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "tegra-interop-abi-probe-{}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| Failure::new(format!("cannot create {}: {e}", dir.display())))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run_cc(args: &[&std::ffi::OsStr], what: &str) -> Result<String> {
    let compiler = cc();
    let output = Command::new(&compiler).args(args).output().map_err(|e| {
        Failure::new(format!(
            "cannot run the host C compiler `{compiler}` for {what}: {e} (install gcc or set CC)"
        ))
    })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let first = stderr
            .lines()
            .find(|l| l.contains("error"))
            .unwrap_or("no diagnostic");
        return Err(Failure::new(format!(
            "`{compiler}` failed on {what}: {}",
            first.trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Every identifier the headers declare or use after preprocessing, plus
/// every macro they define: the names that exist in this release. Names
/// usable as a type on their own (typedefs, not just `struct` tags) are also
/// entered as `typedef NAME`.
pub fn names_present(include: &Path, includes: &str) -> Result<BTreeSet<String>> {
    let scratch = Scratch::new()?;
    let source = scratch.0.join("names.c");
    crate::util::write(&source, includes)?;
    let inc = format!("-I{}", include.display());
    let mut names = BTreeSet::new();
    for extra in [&["-E", "-P"][..], &["-E", "-dM"][..]] {
        let mut args: Vec<&std::ffi::OsStr> = extra.iter().map(|a| a.as_ref()).collect();
        args.push(inc.as_ref());
        args.push(source.as_os_str());
        let text = run_cc(&args, &format!("the headers in {}", include.display()))?;
        names.extend(identifiers(&text));
        if extra.contains(&"-P") {
            names.extend(typedef_names(&text));
        }
    }
    Ok(names)
}

/// Names that end a declaration (`... NAME ;`) without being a `struct`,
/// `union` or `enum` tag there: typedef names (and variables, harmless here).
fn typedef_names(text: &str) -> BTreeSet<String> {
    let mut tokens: Vec<&str> = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        let ident = c.is_ascii_alphanumeric() || c == '_';
        match (ident, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                tokens.push(&text[s..i]);
                start = None;
            }
            _ => {}
        }
        if !ident && !c.is_whitespace() {
            tokens.push(&text[i..i + c.len_utf8()]);
        }
    }
    let mut names = BTreeSet::new();
    for w in tokens.windows(3) {
        if w[2] == ";" && !matches!(w[0], "struct" | "union" | "enum") {
            names.insert(format!("typedef {}", w[1]));
        }
    }
    names
}

fn identifiers(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_'))
        .map(str::to_string)
}

/// Compiles and runs a C program that prints the value of every constant and
/// the size, alignment and field offsets of every type in `items` (only
/// names in `present` are asked for). Keys: `const N`, `size T`, `align T`,
/// `offset T.f`.
pub fn measure(
    include: &Path,
    includes: &str,
    declared: &Declared,
    present: &BTreeSet<String>,
) -> Result<BTreeMap<String, u64>> {
    let has = |n: &str| present.contains(n);
    let mut c = String::from(includes);
    c.push_str("#include <stdio.h>\n#include <stddef.h>\nint main(void) {\n");
    // The libraries' versions are always read, declared by us or not: they
    // decide whether a missing item is a difference or an older release.
    let mut constants: Vec<String> = LIBRARIES
        .iter()
        .flat_map(|l| [format!("{l}MajorVersion"), format!("{l}MinorVersion")])
        .filter(|k| !declared.constants.contains(k))
        .collect();
    constants.extend(declared.constants.iter().cloned());
    for k in constants.iter().filter(|k| has(k)) {
        c.push_str(&format!(
            "    printf(\"const {k} %llu\\n\", (unsigned long long)({k}));\n"
        ));
    }
    let type_names = declared
        .types
        .iter()
        .chain(declared.records.iter().map(|(n, _)| n));
    // A record the headers name only by its tag (`struct T`, no typedef) is
    // measured as `struct T`: the same layout under another spelling.
    let spelled = |t: &str| {
        if has(&format!("typedef {t}")) {
            t.to_string()
        } else {
            format!("struct {t}")
        }
    };
    for t in type_names.filter(|t| has(t)) {
        let is_record = declared.records.iter().any(|(r, _)| r == t);
        let c_type = if is_record { spelled(t) } else { t.clone() };
        c.push_str(&format!(
            "    printf(\"size {t} %zu\\n\", sizeof({c_type}));\n    printf(\"align {t} %zu\\n\", (size_t)_Alignof({c_type}));\n"
        ));
    }
    for (t, fields) in declared.records.iter().filter(|(t, _)| has(t)) {
        for f in fields.iter().filter(|f| has(f)) {
            c.push_str(&format!(
                "    printf(\"offset {t}.{f} %zu\\n\", offsetof({}, {f}));\n",
                spelled(t)
            ));
        }
    }
    c.push_str("    return 0;\n}\n");

    let scratch = Scratch::new()?;
    let source = scratch.0.join("probe.c");
    let binary = scratch.0.join("probe");
    crate::util::write(&source, &c)?;
    let inc = format!("-I{}", include.display());
    let args: Vec<&std::ffi::OsStr> = vec![
        "-std=gnu11".as_ref(),
        "-w".as_ref(),
        inc.as_ref(),
        source.as_os_str(),
        "-o".as_ref(),
        binary.as_os_str(),
    ];
    run_cc(
        &args,
        &format!("the layout probe over {}", include.display()),
    )?;
    let output = Command::new(&binary)
        .output()
        .map_err(|e| Failure::new(format!("cannot run the layout probe: {e}")))?;
    if !output.status.success() {
        return Err(Failure::new("the layout probe failed".to_string()));
    }
    let mut values = BTreeMap::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        if let Some((key, value)) = line.rsplit_once(' ') {
            let value: u64 = value
                .parse()
                .map_err(|_| Failure::new(format!("layout probe printed {line:?}")))?;
            values.insert(key.to_string(), value);
        }
    }
    Ok(values)
}

/// Type shapes read from bindgen's output: every name resolved down to
/// what the machine sees.
struct Shapes {
    aliases: HashMap<String, syn::Type>,
    newtypes: HashMap<String, syn::Type>,
    records: HashMap<String, (Vec<(String, syn::Type)>, String)>,
    opaque: BTreeSet<String>,
}

impl Shapes {
    fn new(text: &str) -> Result<Shapes> {
        let file = parse(text)?;
        let mut s = Shapes {
            aliases: HashMap::new(),
            newtypes: HashMap::new(),
            records: HashMap::new(),
            opaque: BTreeSet::new(),
        };
        for item in file.items {
            match item {
                syn::Item::Type(t) => {
                    s.aliases.insert(t.ident.to_string(), *t.ty);
                }
                // bindgen writes `typedef enum XRec X;` as `pub use XRec as X;`.
                syn::Item::Use(u) => {
                    let mut tree = &u.tree;
                    while let syn::UseTree::Path(p) = tree {
                        tree = &p.tree;
                    }
                    if let syn::UseTree::Rename(r) = tree {
                        let target: syn::Type = syn::Type::Path(syn::TypePath {
                            qself: None,
                            path: syn::Path::from(r.ident.clone()),
                        });
                        s.aliases.insert(r.rename.to_string(), target);
                    }
                }
                syn::Item::Struct(st) => {
                    let name = st.ident.to_string();
                    match st.fields {
                        syn::Fields::Unnamed(u) => {
                            if let Some(f) = u.unnamed.into_iter().next() {
                                s.newtypes.insert(name, f.ty);
                            }
                        }
                        syn::Fields::Named(n) => {
                            let fields: Vec<(String, syn::Type)> = n
                                .named
                                .into_iter()
                                .map(|f| (f.ident.map(|i| i.to_string()).unwrap_or_default(), f.ty))
                                .collect();
                            if fields.len() == 1 && fields[0].0 == "_unused" {
                                s.opaque.insert(name);
                            } else {
                                s.records.insert(name, (fields, repr_flags(&st.attrs)));
                            }
                        }
                        syn::Fields::Unit => {
                            s.opaque.insert(name);
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(s)
    }

    /// The ABI shape of a named item; `keep_const` keeps pointer const-ness
    /// (API, not ABI).
    fn named(&self, name: &str, keep_const: bool) -> Option<String> {
        if let Some((fields, flags)) = self.records.get(name) {
            return Some(self.record(fields, flags, keep_const, 0));
        }
        if let Some(t) = self.aliases.get(name).or_else(|| self.newtypes.get(name)) {
            return Some(self.shape(t, keep_const, 0));
        }
        None
    }

    /// The record named `name`, following typedefs (`typedef struct Tag Name`).
    fn record_named(&self, name: &str) -> Option<&(Vec<(String, syn::Type)>, String)> {
        let mut name = name.to_string();
        for _ in 0..16 {
            if let Some(r) = self.records.get(&name) {
                return Some(r);
            }
            match self.aliases.get(&name) {
                Some(syn::Type::Path(p)) => {
                    name = p.path.segments.last()?.ident.to_string();
                }
                _ => return None,
            }
        }
        None
    }

    fn field(&self, record: &str, field: &str, keep_const: bool) -> Option<String> {
        let (fields, _) = self.record_named(record)?;
        let (_, ty) = fields.iter().find(|(n, _)| n == field)?;
        Some(self.shape(ty, keep_const, 0))
    }

    fn record(
        &self,
        fields: &[(String, syn::Type)],
        flags: &str,
        keep_const: bool,
        depth: usize,
    ) -> String {
        let inner: Vec<String> = fields
            .iter()
            .map(|(_, t)| self.shape(t, keep_const, depth + 1))
            .collect();
        format!("{{{}}}{flags}", inner.join(", "))
    }

    fn shape(&self, ty: &syn::Type, keep_const: bool, depth: usize) -> String {
        if depth > 16 {
            return "...".to_string();
        }
        match ty {
            syn::Type::Path(p) => {
                let Some(last) = p.path.segments.last() else {
                    return "?".to_string();
                };
                let name = last.ident.to_string();
                if name == "Option" {
                    if let syn::PathArguments::AngleBracketed(args) = &last.arguments {
                        if let Some(syn::GenericArgument::Type(inner)) = args.args.first() {
                            return self.shape(inner, keep_const, depth + 1);
                        }
                    }
                }
                if let Some(p) = primitive(&name) {
                    return p.to_string();
                }
                if let Some((fields, flags)) = self.records.get(&name) {
                    return self.record(fields, flags, keep_const, depth + 1);
                }
                if let Some(t) = self.aliases.get(&name).or_else(|| self.newtypes.get(&name)) {
                    return self.shape(t, keep_const, depth + 1);
                }
                if self.opaque.contains(&name) {
                    return "opaque".to_string();
                }
                format!("?{name}")
            }
            syn::Type::Ptr(p) => {
                let constness = if keep_const && p.const_token.is_some() {
                    "const "
                } else {
                    ""
                };
                format!("*{constness}{}", self.shape(&p.elem, keep_const, depth + 1))
            }
            syn::Type::Array(a) => {
                let len = match &a.len {
                    syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Int(i),
                        ..
                    }) => i.base10_digits().to_string(),
                    other => format!("{other:?}"),
                };
                format!("[{}; {len}]", self.shape(&a.elem, keep_const, depth + 1))
            }
            syn::Type::BareFn(f) => {
                let args: Vec<String> = f
                    .inputs
                    .iter()
                    .map(|a| self.shape(&a.ty, keep_const, depth + 1))
                    .collect();
                let ret = match &f.output {
                    syn::ReturnType::Default => "void".to_string(),
                    syn::ReturnType::Type(_, t) => self.shape(t, keep_const, depth + 1),
                };
                format!("fn({}) -> {ret}", args.join(", "))
            }
            syn::Type::Tuple(t) if t.elems.is_empty() => "void".to_string(),
            syn::Type::Paren(p) => self.shape(&p.elem, keep_const, depth),
            syn::Type::Group(g) => self.shape(&g.elem, keep_const, depth),
            other => format!("?{other:?}"),
        }
    }
}

/// `packed` / `align(N)` from a record's `#[repr(...)]`.
fn repr_flags(attrs: &[syn::Attribute]) -> String {
    let mut flags = String::new();
    for attr in attrs {
        if let syn::Meta::List(list) = &attr.meta {
            if list.path.is_ident("repr") {
                let text: String = list
                    .tokens
                    .to_string()
                    .chars()
                    .filter(|c| !c.is_whitespace())
                    .collect();
                for part in text.split(',') {
                    if part.starts_with("packed") || part.starts_with("align") {
                        flags.push(' ');
                        flags.push_str(part);
                    }
                }
            }
        }
    }
    flags
}

/// C's scalar types as bindgen spells them, by width and kind.
fn primitive(name: &str) -> Option<&'static str> {
    Some(match name {
        "u8" | "c_uchar" => "u8",
        "i8" | "c_schar" => "i8",
        // Signedness of plain char is per target (signed on x86_64,
        // unsigned on aarch64); only its width is ABI here.
        "c_char" => "char",
        "u16" | "c_ushort" => "u16",
        "i16" | "c_short" => "i16",
        "u32" | "c_uint" => "u32",
        "i32" | "c_int" => "i32",
        "u64" | "c_ulong" | "c_ulonglong" => "u64",
        "i64" | "c_long" | "c_longlong" => "i64",
        "usize" => "usize",
        "isize" => "isize",
        "bool" => "bool",
        "f32" | "c_float" => "f32",
        "f64" | "c_double" => "f64",
        "c_void" => "void",
        _ => return None,
    })
}

/// One side of the comparison: measured values and type shapes.
pub struct Side {
    values: BTreeMap<String, u64>,
    shapes: Shapes,
}

impl Side {
    /// Measures `declared` (the names in `present`) in the headers of
    /// `include`, and reads type shapes from bindgen's output `bindings`.
    pub fn new(
        include: &Path,
        includes: &str,
        declared: &Declared,
        present: &BTreeSet<String>,
        bindings: &str,
    ) -> Result<Side> {
        Ok(Side {
            values: measure(include, includes, declared, present)?,
            shapes: Shapes::new(bindings)?,
        })
    }

    fn version(&self, library: &str) -> Option<(u64, u64)> {
        let major = self.values.get(&format!("const {library}MajorVersion"))?;
        let minor = self.values.get(&format!("const {library}MinorVersion"))?;
        Some((*major, *minor))
    }
}

/// What the comparison found.
#[derive(Debug, Default)]
pub struct Report {
    /// Real ABI differences, one line each.
    pub differences: Vec<String>,
    /// Things worth knowing that are not ABI differences.
    pub notes: Vec<String>,
    /// Items absent from the real headers because they are an older release,
    /// grouped by the reason.
    pub absent: BTreeMap<String, Vec<String>>,
    /// How many constants, records and prototypes were compared.
    pub counts: (usize, usize, usize),
}

fn library_of(item: &str) -> Option<&'static str> {
    // NvSciIpc's macros are spelled in capitals.
    if item.starts_with("NV_SCI_IPC_") || item.starts_with("NVSCIIPC_") {
        return Some("NvSciIpc");
    }
    // The three prefixes never prefix each other.
    LIBRARIES.iter().copied().find(|l| item.starts_with(l))
}

fn show(v: Option<&u64>) -> String {
    v.map_or_else(|| "absent".to_string(), |v| format!("{v} ({v:#x})"))
}

/// Compares our declarations (`own`) with the real headers (`real`), whose
/// names are `present`.
pub fn compare(declared: &Declared, own: &Side, real: &Side, present: &BTreeSet<String>) -> Report {
    let mut r = Report::default();

    // Why an item may be missing: its library (or, for shared items, any of
    // the three) is an older release than ours.
    let older = |item: &str| -> Option<String> {
        let libs: Vec<&str> = match library_of(item) {
            Some(l) => vec![l],
            None => LIBRARIES.to_vec(),
        };
        for lib in libs {
            let Some((our_major, our_minor)) = own.version(lib) else {
                continue;
            };
            match real.version(lib) {
                None => {
                    return Some(format!(
                        "{lib}: these headers predate its version constants (ours {our_major}.{our_minor})"
                    ))
                }
                Some((major, minor)) if (major, minor) < (our_major, our_minor) => {
                    return Some(format!(
                        "{lib} {major}.{minor}, older than ours ({our_major}.{our_minor})"
                    ))
                }
                Some(_) => {}
            }
        }
        None
    };
    let absent = |r: &mut Report, kind: &str, item: &str| {
        match older(item) {
        Some(why) => r
            .absent
            .entry(why)
            .or_default()
            .push(format!("{kind} {item}")),
        None => r.differences.push(format!(
            "{kind} {item}: declared by us, absent from the real headers (which are not an older release)"
        )),
    }
    };

    // Constants.
    for k in &declared.constants {
        if !present.contains(k) {
            absent(&mut r, "constant", k);
            continue;
        }
        r.counts.0 += 1;
        let key = format!("const {k}");
        let (ours, theirs) = (own.values.get(&key), real.values.get(&key));
        if ours == theirs {
            continue;
        }
        // A release's version and its keys' upper bound sentinels change
        // with every release: only a difference when the release is not
        // older than ours.
        let per_release =
            k.ends_with("MinorVersion") || (k.ends_with("_UpperBound") && older(k).is_some());
        if per_release {
            r.notes.push(format!(
                "constant {k}: a different release, ours {}, real {} (not an ABI difference)",
                show(ours),
                show(theirs)
            ));
        } else {
            r.differences.push(format!(
                "constant {k}: ours {}, real {}",
                show(ours),
                show(theirs)
            ));
        }
    }

    // Layout of every named type and record.
    let layout = |r: &mut Report, t: &str| {
        for what in ["size", "align"] {
            let key = format!("{what} {t}");
            let (ours, theirs) = (own.values.get(&key), real.values.get(&key));
            if ours != theirs {
                r.differences.push(format!(
                    "{what} of {t}: ours {}, real {}",
                    show(ours),
                    show(theirs)
                ));
            }
        }
    };
    for t in &declared.types {
        if !present.contains(t) {
            absent(&mut r, "type", t);
            continue;
        }
        layout(&mut r, t);
        let (ours, theirs) = (own.shapes.named(t, false), real.shapes.named(t, false));
        if ours != theirs {
            r.differences.push(format!(
                "type {t}: ours {}, real {}",
                ours.unwrap_or_else(|| "?".into()),
                theirs.unwrap_or_else(|| "?".into())
            ));
        }
    }
    for (t, fields) in &declared.records {
        if !present.contains(t) {
            absent(&mut r, "record", t);
            continue;
        }
        r.counts.1 += 1;
        layout(&mut r, t);
        for f in fields {
            let key = format!("offset {t}.{f}");
            let (ours, theirs) = (own.values.get(&key), real.values.get(&key));
            if ours != theirs {
                r.differences.push(format!(
                    "offset of {t}.{f}: ours {}, real {}",
                    show(ours),
                    show(theirs)
                ));
            }
            let (ours, theirs) = (
                own.shapes.field(t, f, false),
                real.shapes.field(t, f, false),
            );
            if ours != theirs {
                r.differences.push(format!(
                    "type of {t}.{f}: ours {}, real {}",
                    ours.unwrap_or_else(|| "absent".into()),
                    theirs.unwrap_or_else(|| "absent".into())
                ));
            }
        }
        let (ours, theirs) = (own.shapes.named(t, false), real.shapes.named(t, false));
        if ours != theirs {
            r.differences.push(format!(
                "record {t}: ours {}, real {}",
                ours.unwrap_or_else(|| "?".into()),
                theirs.unwrap_or_else(|| "?".into())
            ));
        }
    }

    // Prototypes.
    for f in &declared.functions {
        if !present.contains(f) {
            absent(&mut r, "function", f);
            continue;
        }
        r.counts.2 += 1;
        let pfn = format!("PFN_{f}");
        let (ours, theirs) = (
            own.shapes.named(&pfn, false),
            real.shapes.named(&pfn, false),
        );
        if ours != theirs {
            r.differences.push(format!(
                "prototype of {f}: ours {}, real {}",
                ours.unwrap_or_else(|| "?".into()),
                theirs.unwrap_or_else(|| "absent".into())
            ));
            continue;
        }
        let (ours, theirs) = (own.shapes.named(&pfn, true), real.shapes.named(&pfn, true));
        if ours != theirs {
            r.notes.push(format!(
                "prototype of {f}: pointer const-ness differs (not an ABI difference): ours {}, real {}",
                ours.unwrap_or_default(),
                theirs.unwrap_or_default()
            ));
        }
    }
    r
}

impl Report {
    /// Prints the report (differences first, then notes, absences and the
    /// summary) and returns the number of ABI differences.
    pub fn print(&self, real_versions: &str) -> usize {
        for d in &self.differences {
            println!("nvsci ABI difference: {d}");
        }
        for n in &self.notes {
            println!("nvsci note: {n}");
        }
        for (why, items) in &self.absent {
            println!(
                "nvsci: absent in this release ({why}), {} item(s): {}",
                items.len(),
                items.join(", ")
            );
        }
        println!("nvsci: real headers are {real_versions}");
        let (c, r, p) = self.counts;
        if self.differences.is_empty() {
            println!(
                "nvsci: no ABI difference ({c} constants, {r} records, {p} prototypes compared)"
            );
        } else {
            println!(
                "nvsci: {} ABI difference(s) ({c} constants, {r} records, {p} prototypes compared)",
                self.differences.len()
            );
        }
        self.differences.len()
    }
}

/// "NvSciBuf 2.11, NvSciSync 2.8, NvSciIpc (no version constants)".
pub fn versions(side: &Side) -> String {
    LIBRARIES
        .iter()
        .map(|l| match side.version(l) {
            Some((major, minor)) => format!("{l} {major}.{minor}"),
            None => format!("{l} (no version constants)"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}
