//! Kernels the simulator can run: each is a Rust function registered under
//! the name of the CUDA kernel it stands in for, with the C parameter list
//! (the size of each parameter) that kernel has.
//!
//! The simulator refuses what it cannot check. Its NVRTC "compiles" a
//! source only when every `extern "C" __global__` function the source
//! declares is registered with that exact name and parameter list
//! (anything else fails like a compile error, with a log naming the
//! kernel); `cuModuleLoadData` accepts the image that produced, or real
//! PTX, only when each `.entry` is registered (with matching parameter
//! sizes); `cuLaunchKernel` checks the launch dimensions and then runs the
//! Rust function in stream order, over the simulator's memory (device
//! allocations, mapped imports, device-mapped pinned host memory).
//!
//! ```
//! use tegra_interop_sim::kernels::{KernelFault, KernelSpec};
//! use tegra_interop_sim::Sim;
//!
//! let sim = Sim::new()?;
//! // Stands in for:
//! // extern "C" __global__ void add_one(unsigned char *buf, unsigned long long len)
//! sim.register_kernel(KernelSpec::new("add_one", &[8, 8]), |k| {
//!     let (buf, len) = (k.arg_u64(0)?, k.arg_u64(1)?);
//!     let len = usize::try_from(len).map_err(|_| KernelFault::new("len too large"))?;
//!     let mut bytes = vec![0u8; len];
//!     k.read(buf, &mut bytes)?;
//!     for b in &mut bytes {
//!         *b = b.wrapping_add(1);
//!     }
//!     k.write(buf, &bytes)
//! });
//! # Ok::<(), tegra_interop_sim::SimError>(())
//! ```

#![deny(unsafe_code)]

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::instance::State;

/// A kernel's name and C parameter list (the size in bytes of each
/// parameter, in order: 8 for a pointer or a 64-bit integer, 4 for `int`,
/// `unsigned int`, `float`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelSpec {
    name: String,
    params: Vec<usize>,
}

impl KernelSpec {
    /// A kernel named `name` (its `extern "C"` name) with parameters of
    /// `param_sizes` bytes.
    pub fn new(name: &str, param_sizes: &[usize]) -> KernelSpec {
        KernelSpec {
            name: name.to_string(),
            params: param_sizes.to_vec(),
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The parameter sizes.
    pub fn param_sizes(&self) -> &[usize] {
        &self.params
    }
}

/// Why a simulated kernel stopped: what the real GPU would report as an
/// illegal address or a trap. The simulator records it as a diagnostic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelFault(String);

impl KernelFault {
    /// A fault with a message.
    pub fn new(message: impl Into<String>) -> KernelFault {
        KernelFault(message.into())
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KernelFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KernelFault {}

/// The Rust body of a simulated kernel.
pub type KernelFn = dyn Fn(&mut KernelLaunch<'_>) -> Result<(), KernelFault> + Send + Sync;

/// A registered kernel.
#[derive(Clone)]
pub(crate) struct Registered {
    pub(crate) params: Vec<usize>,
    pub(crate) body: Arc<KernelFn>,
}

/// The registry of one simulator.
#[derive(Default)]
pub(crate) struct Registry {
    pub(crate) kernels: HashMap<String, Registered>,
}

/// One launch of a simulated kernel, as its Rust body sees it: the launch
/// dimensions, the argument bytes, and bounds-checked access to the
/// simulator's memory by device address.
pub struct KernelLaunch<'a> {
    pub(crate) name: &'a str,
    pub(crate) grid: [u32; 3],
    pub(crate) block: [u32; 3],
    pub(crate) shared: u32,
    pub(crate) args: &'a [Vec<u8>],
    pub(crate) state: &'a State,
}

impl fmt::Debug for KernelLaunch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelLaunch")
            .field("name", &self.name)
            .field("grid", &self.grid)
            .field("block", &self.block)
            .field("args", &self.args.len())
            .finish()
    }
}

impl KernelLaunch<'_> {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        self.name
    }

    /// Grid dimensions (blocks).
    pub fn grid(&self) -> [u32; 3] {
        self.grid
    }

    /// Block dimensions (threads).
    pub fn block(&self) -> [u32; 3] {
        self.block
    }

    /// Dynamic shared memory per block, in bytes.
    pub fn shared_mem(&self) -> u32 {
        self.shared
    }

    /// The total number of threads of the launch.
    pub fn threads(&self) -> u64 {
        self.grid
            .iter()
            .chain(&self.block)
            .map(|d| u64::from(*d))
            .product()
    }

    /// The bytes of argument `i`.
    pub fn arg_bytes(&self, i: usize) -> Result<&[u8], KernelFault> {
        self.args.get(i).map(Vec::as_slice).ok_or_else(|| {
            KernelFault::new(format!(
                "kernel `{}` has {} parameter(s); argument {i} asked for",
                self.name,
                self.args.len()
            ))
        })
    }

    fn arg_n<const N: usize>(&self, i: usize) -> Result<[u8; N], KernelFault> {
        let b = self.arg_bytes(i)?;
        <[u8; N]>::try_from(b).map_err(|_| {
            KernelFault::new(format!(
                "argument {i} of kernel `{}` has {} byte(s), read as {N}",
                self.name,
                b.len()
            ))
        })
    }

    /// Argument `i` as a 64-bit integer or device pointer (8 bytes).
    pub fn arg_u64(&self, i: usize) -> Result<u64, KernelFault> {
        self.arg_n::<8>(i).map(u64::from_ne_bytes)
    }

    /// Argument `i` as a 32-bit unsigned integer (4 bytes).
    pub fn arg_u32(&self, i: usize) -> Result<u32, KernelFault> {
        self.arg_n::<4>(i).map(u32::from_ne_bytes)
    }

    /// Argument `i` as a 32-bit signed integer (4 bytes).
    pub fn arg_i32(&self, i: usize) -> Result<i32, KernelFault> {
        self.arg_n::<4>(i).map(i32::from_ne_bytes)
    }

    /// Argument `i` as a `float` (4 bytes).
    pub fn arg_f32(&self, i: usize) -> Result<f32, KernelFault> {
        self.arg_n::<4>(i).map(f32::from_ne_bytes)
    }

    fn outside(&self, what: &str, n: usize, addr: u64) -> KernelFault {
        KernelFault::new(format!(
            "kernel `{}` {what} {n} byte(s) at {addr:#x}, outside every live device-accessible \
             allocation (an illegal address on the real GPU)",
            self.name
        ))
    }

    /// Reads `out.len()` bytes at device address `addr`.
    ///
    /// # Errors
    /// A fault when the range is not inside one live device-accessible
    /// allocation (device memory, a mapped import, device-mapped pinned
    /// host memory).
    pub fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), KernelFault> {
        if self.state.live_range(addr, out.len(), false) && self.state.device_read(addr, out) {
            Ok(())
        } else {
            Err(self.outside("read", out.len(), addr))
        }
    }

    /// Writes `data` at device address `addr` (bounds as for [`read`](Self::read)).
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<(), KernelFault> {
        if self.state.live_range(addr, data.len(), false) && self.state.device_write(addr, data) {
            Ok(())
        } else {
            Err(self.outside("wrote", data.len(), addr))
        }
    }

    /// Reads a `u64` at `addr`.
    pub fn read_u64(&self, addr: u64) -> Result<u64, KernelFault> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// Writes a `u64` at `addr`.
    pub fn write_u64(&self, addr: u64, v: u64) -> Result<(), KernelFault> {
        self.write(addr, &v.to_ne_bytes())
    }
}

// ------------------------------------------------ the NVRTC stand-in's parser

/// One `__global__` function a source declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Declared {
    pub(crate) name: String,
    pub(crate) params: Vec<usize>,
}

/// Removes `//` and `/* */` comments (string literals in kernels sources
/// are rare; a `//` inside one would be cut, which only makes the check
/// stricter).
fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map_or("", |i| &r[i..]);
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.find("*/").map_or("", |i| &r[i + 2..]);
            out.push(' ');
        } else {
            let ch = rest.chars().next().unwrap_or(' ');
            out.push(ch);
            rest = &rest[ch.len_utf8()..];
        }
    }
    out
}

/// The size of a C scalar type name, after typedefs.
fn scalar_size(ty: &str, typedefs: &HashMap<String, usize>) -> Option<usize> {
    let words: Vec<&str> = ty
        .split_whitespace()
        .filter(|w| !matches!(*w, "const" | "volatile" | "__restrict__" | "restrict"))
        .collect();
    let joined = words.join(" ");
    let size = match joined.as_str() {
        "char" | "signed char" | "unsigned char" | "bool" | "int8_t" | "uint8_t" => 1,
        "short" | "short int" | "unsigned short" | "unsigned short int" | "signed short"
        | "int16_t" | "uint16_t" => 2,
        "int" | "signed" | "unsigned" | "signed int" | "unsigned int" | "int32_t" | "uint32_t"
        | "float" => 4,
        "long"
        | "long int"
        | "unsigned long"
        | "unsigned long int"
        | "signed long"
        | "long long"
        | "long long int"
        | "unsigned long long"
        | "unsigned long long int"
        | "signed long long"
        | "int64_t"
        | "uint64_t"
        | "size_t"
        | "double"
        | "uintptr_t"
        | "intptr_t"
        | "ptrdiff_t" => 8,
        other => return typedefs.get(other).copied(),
    };
    Some(size)
}

/// `typedef <scalar type> <name>;` lines, resolved in order.
fn typedefs(src: &str) -> HashMap<String, usize> {
    let mut map = HashMap::new();
    for stmt in src.split(';') {
        let s = stmt.trim();
        let Some(rest) = s.strip_prefix("typedef ") else {
            continue;
        };
        let mut words: Vec<&str> = rest.split_whitespace().collect();
        let Some(name) = words.pop() else { continue };
        if name.contains('*') || words.iter().any(|w| w.contains('*')) {
            map.insert(name.trim_start_matches('*').to_string(), 8);
            continue;
        }
        if let Some(size) = scalar_size(&words.join(" "), &map) {
            map.insert(name.to_string(), size);
        }
    }
    map
}

/// The size of one parameter declaration (`const unsigned char *buf`).
fn param_size(decl: &str, typedefs: &HashMap<String, usize>) -> Result<usize, String> {
    let decl = decl.trim();
    if decl.contains('*') {
        return Ok(8);
    }
    if decl.contains('&') || decl.contains('[') {
        return Err(format!(
            "parameter `{decl}`: references and arrays are not modelled"
        ));
    }
    let mut words: Vec<&str> = decl.split_whitespace().collect();
    if words.len() < 2 {
        return Err(format!("parameter `{decl}` has no name"));
    }
    words.pop();
    scalar_size(&words.join(" "), typedefs).ok_or_else(|| {
        format!(
            "parameter `{decl}`: the simulator does not know the size of type `{}`",
            words.join(" ")
        )
    })
}

/// Every `__global__` function of `src` with its parameter sizes, or the
/// compile log lines saying what the simulator cannot check.
pub(crate) fn declared_kernels(src: &str) -> (Vec<Declared>, Vec<String>) {
    let src = strip_comments(src);
    let types = typedefs(&src);
    let mut found = Vec::new();
    let mut log = Vec::new();
    let mut from = 0;
    while let Some(i) = src[from..].find("__global__") {
        let at = from + i;
        from = at + "__global__".len();
        // The declaration starts after the previous `;`, `}` or `{`.
        let start = src[..at].rfind([';', '}', '{']).map_or(0, |p| p + 1);
        let head = &src[start..at];
        let after = &src[from..];
        let Some(open) = after.find('(') else {
            log.push("a `__global__` declaration without a parameter list".to_string());
            break;
        };
        let Some(close) = after[open..].find(')') else {
            log.push("a `__global__` declaration without a closing parenthesis".to_string());
            break;
        };
        let sig = after[..open].trim();
        let name = sig.split_whitespace().last().unwrap_or("").to_string();
        let params_text = &after[open + 1..open + close];
        if !head.contains("extern \"C\"") && !extern_c_block(&src, at) {
            log.push(format!(
                "kernel `{name}` is not `extern \"C\"`: its symbol would be mangled; the simulator \
                 finds kernels only by their C name"
            ));
            continue;
        }
        if head.contains("template") {
            log.push(format!("kernel `{name}` is a template: not modelled"));
            continue;
        }
        let mut params = Vec::new();
        let text = params_text.trim();
        if !(text.is_empty() || text == "void") {
            for p in text.split(',') {
                match param_size(p, &types) {
                    Ok(s) => params.push(s),
                    Err(e) => log.push(format!("kernel `{name}`: {e}")),
                }
            }
        }
        found.push(Declared { name, params });
    }
    (found, log)
}

/// Whether position `at` lies inside an `extern "C" { ... }` block.
fn extern_c_block(src: &str, at: usize) -> bool {
    let mut from = 0;
    while let Some(i) = src[from..at].find("extern \"C\"") {
        let p = from + i + "extern \"C\"".len();
        from = p;
        let rest = src[p..at].trim_start();
        if rest.starts_with('{') {
            let open = p + src[p..].find('{').unwrap_or(0);
            let mut depth = 0i32;
            for (j, ch) in src[open..].char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            if open + j > at {
                                return true;
                            }
                            break;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    false
}

/// The `.entry` points of a PTX text (real or the simulator's image) with
/// their parameter sizes (from each `.param` line's type or byte array).
pub(crate) fn ptx_entries(ptx: &str) -> Vec<Declared> {
    let mut out = Vec::new();
    let mut rest = ptx;
    while let Some(i) = rest.find(".entry") {
        let after = &rest[i + ".entry".len()..];
        let name: String = after
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '$')
            .collect();
        let mut params = Vec::new();
        let (body, next) = match (after.find('('), after.find(')')) {
            (Some(o), Some(c)) if o < c && after[..o].trim() == name => {
                (&after[o + 1..c], &after[c..])
            }
            _ => ("", after),
        };
        for line in body.split(',') {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            params.push(ptx_param_size(line));
        }
        if !name.is_empty() {
            out.push(Declared { name, params });
        }
        rest = next;
    }
    out
}

/// The size of one PTX `.param` declaration; 0 when it cannot be read
/// (never matches a registered size, so the load is refused).
fn ptx_param_size(line: &str) -> usize {
    let array = line
        .find('[')
        .and_then(|o| line[o + 1..].find(']').map(|c| &line[o + 1..o + 1 + c]))
        .and_then(|n| n.trim().parse::<usize>().ok());
    let unit = if line.contains(".u64")
        || line.contains(".s64")
        || line.contains(".b64")
        || line.contains(".f64")
    {
        8
    } else if line.contains(".u32")
        || line.contains(".s32")
        || line.contains(".b32")
        || line.contains(".f32")
    {
        4
    } else if line.contains(".u16")
        || line.contains(".s16")
        || line.contains(".b16")
        || line.contains(".f16")
    {
        2
    } else if line.contains(".u8") || line.contains(".s8") || line.contains(".b8") {
        1
    } else {
        0
    };
    unit * array.unwrap_or(1)
}

/// The simulator's module image for `kernels`: PTX-shaped text whose
/// `.entry` lines name each kernel with its parameters (not real PTX; the
/// first line says so).
pub(crate) fn module_image(kernels: &[Declared]) -> String {
    let mut s = String::from(
        "// tegra-interop simulator module image: made by its NVRTC stand-in, not real PTX.\n\
         .version 8.0\n.target sim\n.address_size 64\n",
    );
    for k in kernels {
        s.push_str(&format!("\n.visible .entry {}(\n", k.name));
        let params: Vec<String> = k
            .params
            .iter()
            .enumerate()
            .map(|(i, size)| match size {
                8 => format!("\t.param .u64 {}_param_{i}", k.name),
                4 => format!("\t.param .u32 {}_param_{i}", k.name),
                2 => format!("\t.param .u16 {}_param_{i}", k.name),
                1 => format!("\t.param .u8 {}_param_{i}", k.name),
                n => format!("\t.param .align 8 .b8 {}_param_{i}[{n}]", k.name),
            })
            .collect();
        s.push_str(&params.join(",\n"));
        s.push_str("\n)\n{\n\tret;\n}\n");
    }
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn declared_kernels_read_names_and_sizes_with_typedefs() {
        let src = r#"
            typedef unsigned long long u64;
            typedef unsigned int u32;
            /* a comment __global__ void fake(int a) */
            extern "C" __global__ void k(unsigned char *buf, u64 len, u32 seed, u64 *out) {}
            extern "C" {
                __global__ void inner(float x, int y) {}
            }
            template <bool S> __device__ void helper(int x) {}
        "#;
        let (k, log) = declared_kernels(src);
        assert!(log.is_empty(), "{log:?}");
        assert_eq!(k.len(), 2);
        assert_eq!(k[0].name, "k");
        assert_eq!(k[0].params, [8, 8, 4, 8]);
        assert_eq!(k[1].name, "inner");
        assert_eq!(k[1].params, [4, 4]);
    }

    #[test]
    fn mangled_or_unknown_types_are_logged() {
        let (_, log) = declared_kernels("__global__ void k(int a) {}");
        assert!(log[0].contains("extern \"C\""), "{log:?}");
        let (_, log) = declared_kernels("extern \"C\" __global__ void k(mystery a) {}");
        assert!(log[0].contains("mystery"), "{log:?}");
    }

    #[test]
    fn the_image_round_trips_through_the_ptx_reader() {
        let k = vec![
            Declared {
                name: "a".into(),
                params: vec![8, 4, 16],
            },
            Declared {
                name: "b".into(),
                params: vec![],
            },
        ];
        assert_eq!(ptx_entries(&module_image(&k)), k);
    }

    #[test]
    fn real_ptx_entries_are_read() {
        let ptx = ".visible .entry add_one(\n\t.param .u64 add_one_param_0,\n\t.param .u64 add_one_param_1\n)\n{\n ret;\n}\n";
        assert_eq!(
            ptx_entries(ptx),
            [Declared {
                name: "add_one".into(),
                params: vec![8, 8]
            }]
        );
    }
}
