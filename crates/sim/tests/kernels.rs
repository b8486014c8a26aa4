//! Pinned host memory, asynchronous copies, events, modules, launches and
//! the NVRTC stand-in, called through the raw table: the codes for NULL,
//! zero, unknown and freed handles, flags outside the documented sets,
//! launch limits, kernels the simulator cannot check, and ledgers back at
//! zero.
#![allow(clippy::unwrap_used, clippy::field_reassign_with_default)]
mod common;
use common::*;

use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr;

use tegra_interop_sim::kernels::{KernelFault, KernelSpec};
use tegra_interop_sys::nvrtc::{nvrtcProgram, nvrtcResult};
use tegra_interop_sys::table::NvrtcApi;

const INVALID_IMAGE: u32 = 200;
const NOT_FOUND: u32 = 500;

/// Calls an NVRTC entry and gives the raw code.
macro_rules! rtc {
    ($api:expr, $f:ident ( $($a:expr),* $(,)? )) => {{
        let f = $api.$f.expect(concat!(stringify!($f), " missing from the table"));
        // SAFETY: as in `cu!`.
        #[allow(clippy::macro_metavars_in_unsafe)]
        let r: nvrtcResult = unsafe { f($($a),*) };
        r.0
    }};
}

/// The twin of `add_one` below, per block: each block increments the
/// bytes its threads' `i = blockIdx.x * blockDim.x + threadIdx.x < n` name.
fn register_add_one(sim: &Sim) {
    sim.register_block_kernel(KernelSpec::new("add_one", &[8, 8]), |b| {
        let (buf, len) = (b.arg_u64(0)?, b.arg_u64(1)?);
        for r in b.indices_x(len) {
            let n = usize::try_from(r.end - r.start).map_err(|_| KernelFault::new("len"))?;
            let mut bytes = vec![0u8; n];
            b.read(buf + r.start, &mut bytes)?;
            bytes.iter_mut().for_each(|v| *v = v.wrapping_add(1));
            b.write(buf + r.start, &bytes)?;
        }
        Ok(())
    });
}

/// The declaration the NVRTC stand-in reads; the body is the one the twin
/// above follows: `i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] += 1;`.
const ADD_ONE: &str =
    "extern \"C\" __global__ void add_one(unsigned char *p, unsigned long long n) {}";

/// Compiles `src` with the table's NVRTC: (code, image or log).
fn compile(api: &NvrtcApi, src: &str, options: &[&str]) -> (u32, String) {
    let src = CString::new(src).unwrap();
    let mut prog: nvrtcProgram = ptr::null_mut();
    assert_eq!(
        rtc!(
            api,
            nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                c"t.cu".as_ptr(),
                0,
                ptr::null(),
                ptr::null()
            )
        ),
        0
    );
    let opts: Vec<CString> = options.iter().map(|o| CString::new(*o).unwrap()).collect();
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let r = rtc!(
        api,
        nvrtcCompileProgram(prog, ptrs.len() as i32, ptrs.as_ptr())
    );
    let (size_fn, text_fn) = if r == 0 {
        (api.nvrtcGetPTXSize.unwrap(), api.nvrtcGetPTX.unwrap())
    } else {
        (
            api.nvrtcGetProgramLogSize.unwrap(),
            api.nvrtcGetProgramLog.unwrap(),
        )
    };
    let mut n = 0usize;
    // SAFETY: a live program and a local out-pointer.
    assert_eq!(unsafe { size_fn(prog, &mut n) }.0, 0);
    let mut buf = vec![0u8; n];
    // SAFETY: `buf` holds the size just reported.
    assert_eq!(unsafe { text_fn(prog, buf.as_mut_ptr().cast()) }.0, 0);
    assert_eq!(rtc!(api, nvrtcDestroyProgram(&mut prog)), 0);
    assert!(prog.is_null());
    let text = CStr::from_bytes_until_nul(&buf)
        .unwrap()
        .to_string_lossy()
        .into_owned();
    (r, text)
}

#[test]
fn pinned_memory_codes_and_ledger() {
    let c = Cu::ready();
    let t = &c.t;
    let mut p: *mut c_void = ptr::null_mut();
    assert_eq!(
        cu!(t, cuMemHostAlloc(ptr::null_mut(), 64, 2)),
        INVALID_VALUE
    );
    assert_eq!(cu!(t, cuMemHostAlloc(&mut p, 0, 2)), INVALID_VALUE);
    assert_eq!(cu!(t, cuMemHostAlloc(&mut p, 64, 0x10)), INVALID_VALUE);
    assert_eq!(cu!(t, cuMemHostAlloc(&mut p, 4096, 0x3)), SUCCESS);
    assert_eq!(c.sim.ledger().live_host_allocations, 1);
    let mut d: CUdeviceptr = 0;
    assert_eq!(
        cu!(t, cuMemHostGetDevicePointer(&mut d, p, 1)),
        INVALID_VALUE
    );
    assert_eq!(cu!(t, cuMemHostGetDevicePointer(&mut d, p, 0)), SUCCESS);
    assert_ne!(d, 0);
    // Pinned memory is not freed with cuMemFree, nor device memory with cuMemFreeHost.
    assert_eq!(cu!(t, cuMemFree(d)), INVALID_VALUE);
    let mut dev: CUdeviceptr = 0;
    assert_eq!(cu!(t, cuMemAlloc(&mut dev, 64)), SUCCESS);
    assert_eq!(
        cu!(t, cuMemFreeHost(dev as usize as *mut c_void)),
        INVALID_VALUE
    );
    assert_eq!(cu!(t, cuMemFree(dev)), SUCCESS);
    assert_eq!(cu!(t, cuMemFreeHost(p)), SUCCESS);
    assert_eq!(cu!(t, cuMemFreeHost(p)), INVALID_VALUE, "double free");
    assert!(c.has_diag(DiagnosticKind::DoubleDestroy));
    assert_eq!(
        cu!(t, cuMemHostGetDevicePointer(&mut d, p, 0)),
        INVALID_VALUE
    );

    // Without DEVICEMAP there is no device pointer and no device access.
    assert_eq!(cu!(t, cuMemHostAlloc(&mut p, 4096, 0x1)), SUCCESS);
    assert_eq!(
        cu!(t, cuMemHostGetDevicePointer(&mut d, p, 0)),
        INVALID_VALUE
    );
    assert_eq!(cu!(t, cuMemsetD8(p as usize as u64, 1, 16)), INVALID_VALUE);
    assert_eq!(cu!(t, cuMemFreeHost(p)), SUCCESS);
    assert_eq!(c.sim.ledger().live_host_allocations, 0);
}

#[test]
fn async_copies_run_in_stream_order_and_refuse_pageable_memory() {
    let c = Cu::ready();
    let t = &c.t;
    let s = c.stream();
    let mut host: *mut c_void = ptr::null_mut();
    assert_eq!(cu!(t, cuMemHostAlloc(&mut host, 4096, 0x2)), SUCCESS);
    let mut dev: CUdeviceptr = 0;
    assert_eq!(cu!(t, cuMemAlloc(&mut dev, 4096)), SUCCESS);
    // SAFETY: `host` is 4096 bytes of pinned memory the simulator gave us.
    let view = unsafe { std::slice::from_raw_parts_mut(host.cast::<u8>(), 4096) };
    view.fill(7);
    assert_eq!(cu!(t, cuMemcpyHtoDAsync(dev, host, 4096, s)), SUCCESS);
    assert_eq!(c.sync(s), SUCCESS);
    assert_eq!(c.dtoh(dev, 4), [7; 4]);
    c.htod(dev, &[9; 16]);
    assert_eq!(cu!(t, cuMemcpyDtoHAsync(host, dev, 16, s)), SUCCESS);
    assert_eq!(c.sync(s), SUCCESS);
    assert_eq!(&view[..16], &[9; 16]);
    // Past the end of the pinned allocation, a pageable buffer, a bad stream.
    assert_eq!(cu!(t, cuMemcpyHtoDAsync(dev, host, 4097, s)), INVALID_VALUE);
    let pageable = [0u8; 64];
    assert_eq!(
        cu!(t, cuMemcpyHtoDAsync(dev, pageable.as_ptr().cast(), 64, s)),
        INVALID_VALUE
    );
    assert!(c.has_diag(DiagnosticKind::Unimplemented));
    let bogus = 0x7c02_dead_0000usize as CUstream;
    assert_eq!(
        cu!(t, cuMemcpyDtoDAsync(dev, dev, 16, bogus)),
        INVALID_HANDLE
    );
    assert_eq!(cu!(t, cuMemFree(dev)), SUCCESS);
    assert_eq!(
        cu!(t, cuMemcpyDtoDAsync(dev, dev, 16, s)),
        INVALID_VALUE,
        "freed"
    );
    assert_eq!(cu!(t, cuMemFreeHost(host)), SUCCESS);
    assert_eq!(cu!(t, cuStreamDestroy(s)), SUCCESS);
    let l = settled_ledger(&c.sim);
    assert_eq!(
        (l.live_allocations, l.live_host_allocations, l.pending_work),
        (0, 0, 0)
    );
}

const HOST_MEMORY_ALREADY_REGISTERED: u32 = 712;
const HOST_MEMORY_NOT_REGISTERED: u32 = 713;

#[test]
fn registered_memory_codes_copies_and_ledger() {
    let c = Cu::ready();
    let t = &c.t;
    let s = c.stream();
    let layout = std::alloc::Layout::from_size_align(8192, 4096).unwrap();
    // SAFETY: a non-zero size; freed at the end, after the unregistration.
    let mem = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!mem.is_null());
    let p: *mut c_void = mem.cast();
    // Refused before anything is registered: NULL, unknown flags, the
    // documented flags the simulator does not model, partial pages.
    assert_eq!(
        cu!(t, cuMemHostRegister(ptr::null_mut(), 4096, 3)),
        INVALID_VALUE
    );
    assert_eq!(cu!(t, cuMemHostRegister(p, 4096, 0x10)), INVALID_VALUE);
    assert_eq!(
        cu!(t, cuMemHostRegister(p, 4096, 0x7)),
        INVALID_VALUE,
        "IOMEMORY"
    );
    assert_eq!(
        cu!(t, cuMemHostRegister(p, 4096, 0xb)),
        NOT_SUPPORTED,
        "READ_ONLY"
    );
    assert_eq!(cu!(t, cuMemHostRegister(p, 0, 3)), INVALID_VALUE);
    assert_eq!(cu!(t, cuMemHostRegister(p, 100, 3)), INVALID_VALUE);
    // SAFETY: inside the 8192-byte allocation.
    let inner = unsafe { p.cast::<u8>().add(16) }.cast::<c_void>();
    assert_eq!(cu!(t, cuMemHostRegister(inner, 4096, 3)), INVALID_VALUE);
    assert!(c.has_diag(DiagnosticKind::Unimplemented));
    assert_eq!(c.sim.ledger().live_host_allocations, 0);

    assert_eq!(cu!(t, cuMemHostRegister(p, 8192, 3)), SUCCESS);
    assert_eq!(c.sim.ledger().live_host_allocations, 1);
    // SAFETY: the second page of the allocation.
    let second = unsafe { p.cast::<u8>().add(4096) }.cast::<c_void>();
    assert_eq!(
        cu!(t, cuMemHostRegister(second, 4096, 3)),
        HOST_MEMORY_ALREADY_REGISTERED,
        "overlap"
    );
    let mut d: CUdeviceptr = 0;
    assert_eq!(cu!(t, cuMemHostGetDevicePointer(&mut d, p, 0)), SUCCESS);
    assert_eq!(d, p as usize as u64);
    // Copies both ways read and write the caller's memory in place. (The
    // host reads and writes it through `mem` only while no copy runs.)
    // SAFETY: the allocation's 8192 bytes; no copy is queued.
    unsafe { ptr::write_bytes(mem, 5, 8192) };
    let bytes = || {
        // SAFETY: as above; read only after the stream was synchronised.
        unsafe { std::slice::from_raw_parts(mem, 8192) }.to_vec()
    };
    let mut dev: CUdeviceptr = 0;
    assert_eq!(cu!(t, cuMemAlloc(&mut dev, 8192)), SUCCESS);
    assert_eq!(cu!(t, cuMemcpyHtoDAsync(dev, p, 8192, s)), SUCCESS);
    assert_eq!(c.sync(s), SUCCESS);
    assert_eq!(c.dtoh(dev + 8188, 4), [5; 4]);
    c.htod(dev, &[6; 32]);
    assert_eq!(cu!(t, cuMemcpyDtoDAsync(d + 64, dev, 32, s)), SUCCESS);
    assert_eq!(cu!(t, cuMemcpyDtoHAsync(p, dev, 16, s)), SUCCESS);
    assert_eq!(c.sync(s), SUCCESS);
    let view = bytes();
    assert_eq!(&view[..16], &[6; 16]);
    assert_eq!(&view[64..96], &[6; 32]);
    assert_eq!(view[16], 5);
    // Registered memory is not freed by the allocators' frees, and only its
    // start unregisters it.
    assert_eq!(cu!(t, cuMemFreeHost(p)), INVALID_VALUE);
    assert_eq!(cu!(t, cuMemFree(d)), INVALID_VALUE);
    assert_eq!(
        cu!(t, cuMemHostUnregister(second)),
        HOST_MEMORY_NOT_REGISTERED
    );
    assert_eq!(cu!(t, cuMemHostUnregister(p)), SUCCESS);
    assert_eq!(cu!(t, cuMemHostUnregister(p)), HOST_MEMORY_NOT_REGISTERED);
    assert_eq!(c.sim.ledger().live_host_allocations, 0);
    // The memory is the caller's again: an asynchronous copy of it is the
    // pageable case, refused; memory the simulator allocated cannot be
    // registered.
    assert_eq!(cu!(t, cuMemcpyHtoDAsync(dev, p, 64, s)), INVALID_VALUE);
    assert_eq!(
        cu!(t, cuMemHostRegister(dev as usize as *mut c_void, 4096, 3)),
        INVALID_VALUE
    );
    assert_eq!(cu!(t, cuMemFree(dev)), SUCCESS);
    assert_eq!(cu!(t, cuStreamDestroy(s)), SUCCESS);
    // SAFETY: allocated above with this layout; unregistered, no copy pending.
    unsafe { std::alloc::dealloc(mem, layout) };
    let l = settled_ledger(&c.sim);
    assert_eq!((l.live_allocations, l.live_host_allocations), (0, 0));
}

#[test]
fn event_codes() {
    let c = Cu::ready();
    let t = &c.t;
    let s = c.stream();
    let mut e: CUevent = ptr::null_mut();
    assert_eq!(cu!(t, cuEventCreate(ptr::null_mut(), 0)), INVALID_VALUE);
    assert_eq!(
        cu!(t, cuEventCreate(&mut e, 4)),
        INVALID_VALUE,
        "interprocess is not simulated"
    );
    assert_eq!(cu!(t, cuEventCreate(&mut e, 8)), INVALID_VALUE);
    assert_eq!(cu!(t, cuEventCreate(&mut e, 0)), SUCCESS);
    assert_eq!(c.sim.ledger().live_events, 1);
    assert_eq!(cu!(t, cuEventQuery(e)), SUCCESS, "never recorded");
    let mut ms = 0f32;
    assert_eq!(
        cu!(t, cuEventElapsedTime(&mut ms, e, e)),
        INVALID_HANDLE,
        "never recorded"
    );
    assert_eq!(cu!(t, cuEventRecord(e, s)), SUCCESS);
    assert_eq!(cu!(t, cuEventSynchronize(e)), SUCCESS);
    assert_eq!(cu!(t, cuEventElapsedTime(&mut ms, e, e)), SUCCESS);
    assert_eq!(ms, 0.0);
    assert_eq!(cu!(t, cuStreamWaitEvent(s, e, 1)), INVALID_VALUE);
    assert_eq!(cu!(t, cuStreamWaitEvent(s, e, 0)), SUCCESS);
    let mut nt: CUevent = ptr::null_mut();
    assert_eq!(cu!(t, cuEventCreate(&mut nt, 2)), SUCCESS);
    assert_eq!(cu!(t, cuEventRecord(nt, s)), SUCCESS);
    assert_eq!(cu!(t, cuEventSynchronize(nt)), SUCCESS);
    assert_eq!(
        cu!(t, cuEventElapsedTime(&mut ms, e, nt)),
        INVALID_HANDLE,
        "no timing"
    );
    assert_eq!(cu!(t, cuEventDestroy(nt)), SUCCESS);
    assert_eq!(cu!(t, cuEventDestroy(e)), SUCCESS);
    assert_eq!(cu!(t, cuEventDestroy(e)), INVALID_HANDLE);
    assert!(c.has_diag(DiagnosticKind::DoubleDestroy));
    assert_eq!(cu!(t, cuEventQuery(e)), INVALID_HANDLE);
    assert_eq!(cu!(t, cuEventQuery(ptr::null_mut())), INVALID_HANDLE);
    assert_eq!(cu!(t, cuStreamDestroy(s)), SUCCESS);
    assert_eq!(settled_ledger(&c.sim).live_events, 0);
}

#[test]
fn a_stream_waiting_on_an_event_runs_after_the_record() {
    let c = Cu::new();
    let ctx = c.ctx();
    let t = &c.t;
    let (a, b) = (c.stream(), c.stream());
    let mut host: *mut c_void = ptr::null_mut();
    assert_eq!(cu!(t, cuMemHostAlloc(&mut host, 1 << 20, 0x2)), SUCCESS);
    let mut dev: CUdeviceptr = 0;
    assert_eq!(cu!(t, cuMemAlloc(&mut dev, 1 << 20)), SUCCESS);
    c.htod(dev, &vec![3u8; 1 << 20]);
    let mut e: CUevent = ptr::null_mut();
    assert_eq!(cu!(t, cuEventCreate(&mut e, 2)), SUCCESS);
    // Stream a: a copy, then the record; stream b waits for it, then copies back.
    for _ in 0..20 {
        assert_eq!(cu!(t, cuMemcpyDtoHAsync(host, dev, 1 << 20, a)), SUCCESS);
    }
    assert_eq!(cu!(t, cuEventRecord(e, a)), SUCCESS);
    assert_eq!(cu!(t, cuStreamWaitEvent(b, e, 0)), SUCCESS);
    let mut dev2: CUdeviceptr = 0;
    assert_eq!(cu!(t, cuMemAlloc(&mut dev2, 1 << 20)), SUCCESS);
    assert_eq!(cu!(t, cuMemcpyHtoDAsync(dev2, host, 1 << 20, b)), SUCCESS);
    assert_eq!(c.sync(b), SUCCESS);
    assert_eq!(
        cu!(t, cuEventQuery(e)),
        SUCCESS,
        "b finished, so the record did"
    );
    assert_eq!(c.dtoh(dev2 + 12345, 3), [3; 3]);
    for x in [
        cu!(t, cuEventDestroy(e)),
        cu!(t, cuMemFree(dev)),
        cu!(t, cuMemFree(dev2)),
    ] {
        assert_eq!(x, SUCCESS);
    }
    assert_eq!(cu!(t, cuMemFreeHost(host)), SUCCESS);
    assert_eq!(cu!(t, cuStreamDestroy(a)), SUCCESS);
    assert_eq!(cu!(t, cuStreamDestroy(b)), SUCCESS);
    assert_eq!(cu!(t, cuCtxDestroy(ctx)), SUCCESS);
    assert!(settled_ledger(&c.sim).is_clean(), "{}", c.sim.ledger());
    assert!(c.sim.diagnostics().is_empty(), "{:?}", c.sim.diagnostics());
}

#[test]
fn nvrtc_compiles_only_registered_kernels() {
    // Misuse on purpose below: recorded, not printed.
    let sim = Sim::with_config(SimConfig::default().with_diagnostic_echo(false)).unwrap();
    let api = sim.table().nvrtc;
    let (mut major, mut minor) = (0, 0);
    assert_eq!(rtc!(api, nvrtcVersion(&mut major, &mut minor)), 0);
    assert_eq!((major, minor), (12, 9));
    assert_eq!(rtc!(api, nvrtcVersion(ptr::null_mut(), &mut minor)), 3);

    let (r, log) = compile(&api, ADD_ONE, &[]);
    assert_eq!(r, 6, "not registered yet");
    assert!(
        log.contains("add_one") && log.contains("not registered"),
        "{log}"
    );
    register_add_one(&sim);
    let (r, image) = compile(&api, ADD_ONE, &["--gpu-architecture=compute_90"]);
    assert_eq!(r, 0, "{image}");
    assert!(image.contains(".entry add_one("), "{image}");
    // Parameter sizes must match the registration.
    let (r, log) = compile(
        &api,
        "extern \"C\" __global__ void add_one(int *p, int n) {}",
        &[],
    );
    assert_eq!(r, 6);
    assert!(log.contains("[8, 4]"), "{log}");
    // Not extern "C": the name would be mangled.
    let (r, log) = compile(
        &api,
        "__global__ void add_one(unsigned char *p, unsigned long long n) {}",
        &[],
    );
    assert_eq!(r, 6);
    assert!(log.contains("extern \"C\""), "{log}");
    // Unknown option.
    let (r, log) = compile(&api, ADD_ONE, &["--frobnicate"]);
    assert_eq!(r, 5);
    assert!(log.contains("--frobnicate"), "{log}");

    // Bad handles and inputs.
    let mut prog: nvrtcProgram = ptr::null_mut();
    assert_eq!(
        rtc!(
            api,
            nvrtcCreateProgram(
                &mut prog,
                ptr::null(),
                ptr::null(),
                0,
                ptr::null(),
                ptr::null()
            )
        ),
        3
    );
    assert_eq!(
        rtc!(
            api,
            nvrtcCreateProgram(
                &mut prog,
                c"".as_ptr(),
                ptr::null(),
                -1,
                ptr::null(),
                ptr::null()
            )
        ),
        3
    );
    let bogus = 0x7c30_0000_1230usize as nvrtcProgram;
    assert_eq!(rtc!(api, nvrtcCompileProgram(bogus, 0, ptr::null())), 4);
    let mut n = 0usize;
    assert_eq!(rtc!(api, nvrtcGetPTXSize(bogus, &mut n)), 4);
    let mut b = bogus;
    assert_eq!(rtc!(api, nvrtcDestroyProgram(&mut b)), 4);
    assert_eq!(rtc!(api, nvrtcDestroyProgram(ptr::null_mut())), 3);
    // PTX before a successful compile.
    assert_eq!(
        rtc!(
            api,
            nvrtcCreateProgram(
                &mut prog,
                c"".as_ptr(),
                ptr::null(),
                0,
                ptr::null(),
                ptr::null()
            )
        ),
        0
    );
    assert_eq!(rtc!(api, nvrtcGetPTXSize(prog, &mut n)), 4);
    let d = sim.take_diagnostics();
    assert!(d.len() == 1 && d[0].kind == DiagnosticKind::Misuse, "{d:?}");
    assert_eq!(sim.ledger().live_programs, 1);
    assert_eq!(rtc!(api, nvrtcDestroyProgram(&mut prog)), 0);
    assert_eq!(sim.ledger().live_programs, 0);
}

#[test]
fn modules_load_registered_entries_and_launches_check_limits() {
    let c = Cu::ready();
    let t = &c.t;
    let api = c.sim.table().nvrtc;
    register_add_one(&c.sim);
    let (_, image) = compile(&api, ADD_ONE, &[]);
    let image = CString::new(image).unwrap();
    let mut m: CUmodule = ptr::null_mut();
    assert_eq!(
        cu!(t, cuModuleLoadData(ptr::null_mut(), image.as_ptr().cast())),
        INVALID_VALUE
    );
    assert_eq!(cu!(t, cuModuleLoadData(&mut m, ptr::null())), INVALID_VALUE);
    assert_eq!(
        cu!(t, cuModuleLoadData(&mut m, c"not a module".as_ptr().cast())),
        INVALID_IMAGE
    );
    // Real PTX naming an unregistered kernel, or a registered one with other sizes.
    let other = c".version 8.0\n.visible .entry other(\n\t.param .u64 p\n)\n{\n ret;\n}\n";
    assert_eq!(
        cu!(t, cuModuleLoadData(&mut m, other.as_ptr().cast())),
        INVALID_IMAGE
    );
    let sizes = c".version 8.0\n.visible .entry add_one(\n\t.param .u64 p,\n\t.param .u32 n\n)\n{\n ret;\n}\n";
    assert_eq!(
        cu!(t, cuModuleLoadData(&mut m, sizes.as_ptr().cast())),
        INVALID_IMAGE
    );
    // Real PTX with the registered signature loads.
    let real = c".version 8.0\n.target sm_90\n.visible .entry add_one(\n\t.param .u64 add_one_param_0,\n\t.param .u64 add_one_param_1\n)\n{\n ret;\n}\n";
    assert_eq!(
        cu!(t, cuModuleLoadData(&mut m, real.as_ptr().cast())),
        SUCCESS
    );
    assert_eq!(cu!(t, cuModuleUnload(m)), SUCCESS);
    assert_eq!(cu!(t, cuModuleUnload(m)), INVALID_HANDLE);

    assert_eq!(
        cu!(t, cuModuleLoadData(&mut m, image.as_ptr().cast())),
        SUCCESS
    );
    assert_eq!(c.sim.ledger().live_modules, 1);
    let mut f: CUfunction = ptr::null_mut();
    assert_eq!(
        cu!(t, cuModuleGetFunction(&mut f, m, c"nope".as_ptr())),
        NOT_FOUND
    );
    assert_eq!(
        cu!(t, cuModuleGetFunction(&mut f, m, ptr::null())),
        INVALID_VALUE
    );
    assert_eq!(
        cu!(t, cuModuleGetFunction(&mut f, m, c"add_one".as_ptr())),
        SUCCESS
    );
    let (mut off, mut size) = (0usize, 0usize);
    assert_eq!(
        cu!(t, cuFuncGetParamInfo(f, 1, &mut off, &mut size)),
        SUCCESS
    );
    assert_eq!((off, size), (8, 8));
    assert_eq!(
        cu!(t, cuFuncGetParamInfo(f, 2, &mut off, &mut size)),
        INVALID_VALUE
    );

    let s = c.stream();
    let mut dev: CUdeviceptr = 0;
    assert_eq!(cu!(t, cuMemAlloc(&mut dev, 256)), SUCCESS);
    c.htod(dev, &[10; 256]);
    let (mut a0, mut a1) = (dev, 256u64);
    let mut params = [
        ptr::addr_of_mut!(a0).cast::<c_void>(),
        ptr::addr_of_mut!(a1).cast(),
    ];
    let launch = |g: [u32; 3], b: [u32; 3], shared: u32, params: *mut *mut c_void| {
        cu!(
            t,
            cuLaunchKernel(
                f,
                g[0],
                g[1],
                g[2],
                b[0],
                b[1],
                b[2],
                shared,
                s,
                params,
                ptr::null_mut()
            )
        )
    };
    let pp = params.as_mut_ptr();
    assert_eq!(launch([1, 1, 1], [1025, 1, 1], 0, pp), INVALID_VALUE);
    assert_eq!(launch([1, 1, 1], [32, 32, 2], 0, pp), INVALID_VALUE);
    assert_eq!(launch([1, 1, 1], [1, 1, 65], 0, pp), INVALID_VALUE);
    assert_eq!(launch([1, 65_536, 1], [1, 1, 1], 0, pp), INVALID_VALUE);
    assert_eq!(launch([0, 1, 1], [1, 1, 1], 0, pp), INVALID_VALUE);
    assert_eq!(
        launch([1, 1, 1], [1, 1, 1], 48 * 1024 + 1, pp),
        INVALID_VALUE
    );
    assert_eq!(
        launch([1, 1, 1], [256, 1, 1], 0, ptr::null_mut()),
        INVALID_VALUE
    );
    assert_eq!(launch([1, 1, 1], [256, 1, 1], 0, pp), SUCCESS);
    assert_eq!(c.sync(s), SUCCESS);
    assert_eq!(c.dtoh(dev, 256), vec![11; 256]);
    // A kernel reaching past its allocation is a fault (a diagnostic), not
    // UB. One block of 256 threads over n = 257 never reaches byte 256 (no
    // thread computes i = 256); two blocks do. The blocks run last to
    // first, so the faulting block stops the launch before block 0 writes.
    let (mut a0, mut a1) = (dev, 257u64);
    let mut params = [
        ptr::addr_of_mut!(a0).cast::<c_void>(),
        ptr::addr_of_mut!(a1).cast(),
    ];
    let pp = params.as_mut_ptr();
    assert_eq!(launch([1, 1, 1], [256, 1, 1], 0, pp), SUCCESS);
    assert_eq!(c.sync(s), SUCCESS);
    assert!(!c.has_diag(DiagnosticKind::OutOfBounds));
    assert_eq!(c.dtoh(dev, 256), vec![12; 256]);
    assert_eq!(launch([2, 1, 1], [256, 1, 1], 0, pp), SUCCESS);
    assert_eq!(c.sync(s), SUCCESS);
    assert!(c.has_diag(DiagnosticKind::OutOfBounds));
    assert_eq!(
        c.dtoh(dev, 256),
        vec![12; 256],
        "nothing written by the faulting launch"
    );
    // Unloading the module takes its functions along.
    assert_eq!(cu!(t, cuModuleUnload(m)), SUCCESS);
    assert_eq!(launch([1, 1, 1], [1, 1, 1], 0, pp), INVALID_HANDLE);
    assert_eq!(cu!(t, cuMemFree(dev)), SUCCESS);
    assert_eq!(cu!(t, cuStreamDestroy(s)), SUCCESS);
    let l = settled_ledger(&c.sim);
    assert_eq!(
        (l.live_modules, l.live_allocations, l.pending_work),
        (0, 0, 0)
    );
}

#[test]
fn without_nvrtc_the_table_has_no_nvrtc_part() {
    let sim = Sim::with_config(SimConfig::default().with_nvrtc(false)).unwrap();
    assert_eq!(sim.table().nvrtc.present().count(), 0);
    let sim = Sim::new().unwrap();
    assert_eq!(
        sim.table().nvrtc.present().count(),
        NvrtcApi::ENTRY_POINTS.len()
    );
}

#[test]
fn destroying_a_context_with_kernels_and_copies_queued_does_not_deadlock() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let c = Cu::new();
        let t = &c.t;
        let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = std::sync::Arc::clone(&runs);
        c.sim
            // Each thread (the launches below have one) sleeps, counts
            // and writes 1 at its argument.
            .register_thread_kernel(KernelSpec::new("slow", &[8]), move |t| {
                std::thread::sleep(std::time::Duration::from_millis(20));
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                t.write_u64(t.arg_u64(0)?, 1)
            });
        let ctx = c.ctx();
        let s = c.stream();
        let mut dev: CUdeviceptr = 0;
        assert_eq!(cu!(t, cuMemAlloc(&mut dev, 4096)), SUCCESS);
        let image =
            CString::new(".version 8.0\n.visible .entry slow(\n\t.param .u64 p\n)\n{\n ret;\n}\n")
                .unwrap();
        let mut m: CUmodule = ptr::null_mut();
        assert_eq!(
            cu!(t, cuModuleLoadData(&mut m, image.as_ptr().cast())),
            SUCCESS
        );
        let mut f: CUfunction = ptr::null_mut();
        assert_eq!(
            cu!(t, cuModuleGetFunction(&mut f, m, c"slow".as_ptr())),
            SUCCESS
        );
        let mut a0 = dev;
        let mut params = [ptr::addr_of_mut!(a0).cast::<c_void>()];
        // The kernel really runs: synchronizing the stream waits for it
        // (counted by the kernel itself, not timed).
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert_eq!(
            cu!(
                t,
                cuLaunchKernel(
                    f,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    s,
                    params.as_mut_ptr(),
                    ptr::null_mut()
                )
            ),
            SUCCESS
        );
        assert_eq!(c.sync(s), SUCCESS);
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(c.dtoh(dev, 8), 1u64.to_ne_bytes());
        for _ in 0..20 {
            assert_eq!(
                cu!(
                    t,
                    cuLaunchKernel(
                        f,
                        1,
                        1,
                        1,
                        1,
                        1,
                        1,
                        0,
                        s,
                        params.as_mut_ptr(),
                        ptr::null_mut()
                    )
                ),
                SUCCESS
            );
            assert_eq!(cu!(t, cuMemcpyDtoDAsync(dev + 8, dev, 8, s)), SUCCESS);
        }
        // The context goes with its stream, module and memory while the
        // stream is busy (its worker waiting for the simulator's lock): the
        // queued work is dropped, nothing waits for ever.
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert_eq!(cu!(t, cuCtxDestroy(ctx)), SUCCESS);
        let l = settled_ledger(&c.sim);
        tx.send((l.live_modules, l.live_allocations, l.live_streams))
            .unwrap();
    });
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("cuCtxDestroy with queued kernels and copies deadlocked");
    assert_eq!(got, (0, 0, 0));
}
