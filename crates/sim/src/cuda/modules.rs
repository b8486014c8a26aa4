//! Modules and launches: `cuModuleLoadData` (the simulator's module image
//! or real PTX, each `.entry` a registered kernel), `cuModuleGetFunction`,
//! `cuModuleUnload`, `cuFuncGetParamInfo` and `cuLaunchKernel` (the
//! registered Rust function runs in stream order over simulated memory).

use super::*;

use crate::instance::{FuncObj, ModuleObj};
use crate::kernels::{ptx_entries, KernelLaunch};

/// Launch limits of every current device (compute capability 5.0 and
/// later, from the CUDA programming guide's table of technical
/// specifications): threads per block, block x/y, block z, grid x, grid
/// y/z, dynamic shared memory without the opt-in attribute.
const MAX_THREADS: u64 = 1024;
const MAX_BLOCK_XY: u32 = 1024;
const MAX_BLOCK_Z: u32 = 64;
const MAX_GRID_X: u32 = 0x7fff_ffff;
const MAX_GRID_YZ: u32 = 65_535;
const MAX_SHARED: u32 = 48 * 1024;

pub(crate) fn cuModuleLoadData(c: &Call, out: CMut<CUmodule>, image: CPtr<c_char>) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let ctx = current_ctx(c, &st)?;
        if out.is_null() {
            return Err(INVALID_VALUE);
        }
        let Some(image) = image.c_str() else {
            return Err(INVALID_VALUE);
        };
        let text = image.to_string_lossy();
        if text.starts_with("\u{7f}ELF") {
            c.diag(
                D::Unimplemented,
                "cuModuleLoadData: cubin/fatbin images are not simulated; load PTX".into(),
            );
            return Err(INVALID_IMAGE);
        }
        let declared = ptx_entries(&text);
        if declared.is_empty() && !text.contains(".version") {
            c.diag(
                D::Misuse,
                "cuModuleLoadData: the image is neither PTX nor the simulator's module image"
                    .into(),
            );
            return Err(INVALID_IMAGE);
        }
        let mut entries = std::collections::HashMap::new();
        for d in declared {
            let Some(k) = st.kernels.kernels.get(&d.name) else {
                c.diag(
                    D::Unimplemented,
                    format!(
                        "cuModuleLoadData: kernel `{}` is not registered with the simulator \
                         (Sim::register_kernel); it cannot run what it cannot check",
                        d.name
                    ),
                );
                return Err(INVALID_IMAGE);
            };
            if k.params != d.params {
                c.diag(
                    D::Misuse,
                    format!(
                        "cuModuleLoadData: entry `{}` has parameter sizes {:?}, the registered kernel {:?}",
                        d.name, d.params, k.params
                    ),
                );
                return Err(INVALID_IMAGE);
            }
            entries.insert(d.name, k.clone());
        }
        let h = new_handle(Tag::Module);
        st.modules.insert(h, ModuleObj { ctx, entries });
        put(
            out,
            core::ptr::without_provenance_mut::<core::ffi::c_void>(h as usize).cast(),
        )
    })();
    done(r)
}

pub(crate) fn cuModuleUnload(c: &Call, m: Handle<CUmodule>) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let h = m.addr() as u64;
        if !st.modules.contains_key(&h) {
            return Err(not_live(c, &st, "module", h, true, INVALID_HANDLE));
        }
        st.drop_module(h, GoneWhy::Destroyed);
        Ok(())
    })();
    done(r)
}

pub(crate) fn cuModuleGetFunction(
    c: &Call,
    out: CMut<CUfunction>,
    m: Handle<CUmodule>,
    name: CPtr<c_char>,
) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let h = m.addr() as u64;
        if out.is_null() {
            return Err(INVALID_VALUE);
        }
        let Some(name) = name.c_str() else {
            return Err(INVALID_VALUE);
        };
        let name = name.to_string_lossy().into_owned();
        let Some(module) = st.modules.get(&h) else {
            return Err(not_live(c, &st, "module", h, false, INVALID_HANDLE));
        };
        let Some(kernel) = module.entries.get(&name).cloned() else {
            return Err(NOT_FOUND);
        };
        // One handle per (module, name), as the driver hands out the same
        // function for the same name.
        let existing = st
            .functions
            .iter()
            .find(|(_, f)| f.module == h && f.name == name)
            .map(|(k, _)| *k);
        let f = match existing {
            Some(f) => f,
            None => {
                let f = new_handle(Tag::Function);
                st.functions.insert(
                    f,
                    FuncObj {
                        module: h,
                        name,
                        kernel,
                    },
                );
                f
            }
        };
        put(
            out,
            core::ptr::without_provenance_mut::<core::ffi::c_void>(f as usize).cast(),
        )
    })();
    done(r)
}

fn function<'s>(c: &Call, st: &'s State, f: u64) -> R<&'s FuncObj> {
    st.functions
        .get(&f)
        .ok_or_else(|| not_live(c, st, "function", f, false, INVALID_HANDLE))
}

/// The natural alignment the simulator gives a parameter of `size` bytes
/// (its size for 1, 2, 4, 8; 8 otherwise).
fn align_of(size: usize) -> usize {
    match size {
        1 | 2 | 4 | 8 => size,
        _ => 8,
    }
}

pub(crate) fn cuFuncGetParamInfo(
    c: &Call,
    f: Handle<CUfunction>,
    index: usize,
    offset: CMut<usize>,
    size: CMut<usize>,
) -> CUresult {
    let r = (|| {
        let st = c.state();
        init(&st)?;
        let func = function(c, &st, f.addr() as u64)?;
        let params = &func.kernel.params;
        if index >= params.len() || offset.is_null() || size.is_null() {
            return Err(INVALID_VALUE);
        }
        let mut at = 0usize;
        for (i, s) in params.iter().enumerate() {
            at = at.div_ceil(align_of(*s)) * align_of(*s);
            if i == index {
                break;
            }
            at += s;
        }
        put(offset, at)?;
        put(size, params[index])
    })();
    done(r)
}

/// The parameter sizes of function `f`, for the ABI adapter that reads the
/// caller's `kernelParams` array (`None` for an unknown function: the body
/// then reports it).
pub(crate) fn launch_param_sizes(c: &Call, f: u64) -> Option<Vec<usize>> {
    c.state().functions.get(&f).map(|x| x.kernel.params.clone())
}

/// `cuLaunchKernel`, after the ABI adapter read the arguments (`None`:
/// `kernelParams` was NULL or the function unknown); `extra` is whether the
/// `extra` array was given.
#[allow(clippy::too_many_arguments)]
pub(crate) fn cuLaunchKernel(
    c: &Call,
    f: Handle<CUfunction>,
    grid: [u32; 3],
    block: [u32; 3],
    shared: c_uint,
    s: Handle<CUstream>,
    args: Option<Vec<Vec<u8>>>,
    extra: bool,
) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let fh = f.addr() as u64;
        let (name, kernel) = {
            let func = function(c, &st, fh)?;
            (func.name.clone(), func.kernel.clone())
        };
        let (stream_ctx, stream) = resolve_stream(c, &mut st, s)?;
        let module_ctx = st
            .functions
            .get(&fh)
            .and_then(|func| st.modules.get(&func.module))
            .map(|m| m.ctx);
        if module_ctx != Some(stream_ctx) {
            c.diag(
                D::CrossContext,
                format!(
                    "kernel `{name}` launched on a stream of another context than its module's"
                ),
            );
            return Err(INVALID_HANDLE);
        }
        if grid.contains(&0) || block.contains(&0) {
            return Err(INVALID_VALUE);
        }
        let threads: u64 = block.iter().map(|d| u64::from(*d)).product();
        if grid[0] > MAX_GRID_X
            || grid[1] > MAX_GRID_YZ
            || grid[2] > MAX_GRID_YZ
            || block[0] > MAX_BLOCK_XY
            || block[1] > MAX_BLOCK_XY
            || block[2] > MAX_BLOCK_Z
            || threads > MAX_THREADS
            || shared > MAX_SHARED
        {
            c.diag(
                D::Misuse,
                format!(
                    "kernel `{name}`: grid {grid:?}, block {block:?}, {shared} bytes of shared \
                     memory exceed the device limits"
                ),
            );
            return Err(INVALID_VALUE);
        }
        if let Some(why) = kernel.form.refusal(grid, block) {
            c.diag(D::Unimplemented, format!("kernel `{name}`: {why}"));
            return Err(INVALID_VALUE);
        }
        if extra {
            c.diag(
                D::Unimplemented,
                "cuLaunchKernel: arguments through `extra` are not simulated; use kernelParams"
                    .into(),
            );
            return Err(INVALID_VALUE);
        }
        let args = match args {
            Some(a) => a,
            None if kernel.params.is_empty() => Vec::new(),
            None => return Err(INVALID_VALUE),
        };
        let inst = c.inst.weak();
        let (index, symbol) = (c.index, c.symbol);
        stream.enqueue(Box::new(move |sc: &StreamCore| {
            if sc.cancelled() {
                return;
            }
            let Some(inst) = inst.upgrade() else { return };
            let Some(st) = inst.lock_state_for_work(|| sc.cancelled()) else {
                return;
            };
            let mut launch = KernelLaunch {
                name: &name,
                grid,
                block,
                shared,
                args: &args,
                state: &st,
            };
            let result = (kernel.body)(&mut launch);
            drop(st);
            if let Err(fault) = result {
                inst.diag(
                    index,
                    symbol,
                    D::OutOfBounds,
                    format!("kernel `{name}` faulted: {fault}"),
                );
            }
        }));
        Ok(())
    })();
    done(r)
}
