//! Raw C-level helpers shared by the NvSci tests (included directly, or by the rule tests
//! through `nvsci_rules/`):
//! the table-call macro, the set-up, and the parts of the buf and sync attribute helpers that
//! differ only in the pair and list types.
#![allow(dead_code)]

use std::ffi::c_void;

use tegra_interop_sim::{FunctionTable, Sim, SimConfig};
use tegra_interop_sys::nvsci::NvSciError;

/// Calls a table entry and gives the raw code.
macro_rules! call {
    ($api:expr, $f:ident ( $($a:expr),* $(,)? )) => {{
        let f = $api.$f.expect(concat!(stringify!($f), " missing from the table"));
        // SAFETY: test code passes arguments that satisfy the C contract.
        #[allow(clippy::macro_metavars_in_unsafe)]
        let r = unsafe { f($($a),*) };
        r
    }};
}

/// A simulator with `cfg` and its tables, CUDA initialised.
pub fn setup_with_config(cfg: SimConfig) -> (Sim, FunctionTable) {
    // Quiet: these tests provoke misuse on purpose and read the
    // diagnostics instead of printing them.
    let sim = Sim::with_config(cfg.with_diagnostic_echo(false)).unwrap();
    let t = sim.table();
    assert_eq!(call!(t.cuda, cuInit(0)).0, 0);
    (sim, t)
}

/// The raw key/value pairs of a SetAttrs call, each made by `make(key, value, len)` from
/// `pairs` (which must outlive the call).
pub fn kv_pairs<P>(
    pairs: &[(u32, Vec<u8>)],
    make: impl Fn(u32, *const c_void, usize) -> P,
) -> Vec<P> {
    pairs
        .iter()
        .map(|(k, v)| make(*k, v.as_ptr().cast(), v.len()))
        .collect()
}

/// A copy of the `len` bytes a GetAttrs call reported at `value`; `None` for a NULL value
/// (the key is not set).
pub fn value_copy(value: *const c_void, len: usize) -> Option<Vec<u8>> {
    if value.is_null() {
        return None;
    }
    // SAFETY: GetAttrs reported `len` readable bytes at the non-null `value`.
    Some(unsafe { std::slice::from_raw_parts(value.cast::<u8>(), len) }.to_vec())
}

/// A reconcile entry point of either library (buf or sync lists).
pub type ReconcileFn<T> =
    Option<unsafe extern "C" fn(*const *mut T, usize, *mut *mut T, *mut *mut T) -> NvSciError>;

/// Reconciles `lists` with `f`: (code, reconciled, conflict).
pub fn reconcile<T>(f: ReconcileFn<T>, lists: &[*mut T]) -> (u32, *mut T, *mut T) {
    let f = f.expect("reconcile missing from the table");
    let (mut out, mut conflict) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: `lists` holds `lists.len()` list handles; both out pointers are valid.
    let r = unsafe { f(lists.as_ptr(), lists.len(), &mut out, &mut conflict) };
    (r.0, out, conflict)
}

/// Initialises NvSciIpc in both tables (where not yet), opens `a` in `ta` and `b` in `tb`, runs the init
/// sequence (event fd, reset) and waits until both report CONN_EST: (handle a, handle b).
pub fn connect_endpoints(ta: &FunctionTable, tb: &FunctionTable, a: &str, b: &str) -> (u64, u64) {
    // The `*Safe` calls where the claimed release has them, their older
    // twins where not (DRIVE OS 5.2.6).
    let events = |t: &FunctionTable, h: u64, ev: &mut u32| match t.nvsciipc.NvSciIpcGetEventSafe {
        Some(_) => call!(t.nvsciipc, NvSciIpcGetEventSafe(h, ev)).0,
        None => call!(t.nvsciipc, NvSciIpcGetEvent(h, ev)).0,
    };
    let open = |t: &FunctionTable, name: &str| {
        // A second pair in the same simulator finds NvSciIpc initialised
        // already (InvalidState: no reference count).
        assert!(matches!(call!(t.nvsciipc, NvSciIpcInit()).0, 0 | 0x22));
        let c = std::ffi::CString::new(name).unwrap();
        let mut h = 0u64;
        assert_eq!(
            call!(t.nvsciipc, NvSciIpcOpenEndpoint(c.as_ptr(), &mut h)).0,
            0
        );
        let mut fd = -1;
        assert_eq!(call!(t.nvsciipc, NvSciIpcGetLinuxEventFd(h, &mut fd)).0, 0);
        match t.nvsciipc.NvSciIpcResetEndpointSafe {
            Some(_) => assert_eq!(call!(t.nvsciipc, NvSciIpcResetEndpointSafe(h)).0, 0),
            None => call!(t.nvsciipc, NvSciIpcResetEndpoint(h)),
        }
        h
    };
    let (ha, hb) = (open(ta, a), open(tb, b));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (mut ea, mut eb) = (0u32, 0u32);
    while (ea | eb) & 0x4 == 0 || ea & eb & 0x4 == 0 {
        let (mut x, mut y) = (0u32, 0u32);
        assert_eq!(events(ta, ha, &mut x), 0);
        assert_eq!(events(tb, hb, &mut y), 0);
        ea |= x;
        eb |= y;
        assert!(std::time::Instant::now() < deadline, "no CONN_EST");
        std::thread::yield_now();
    }
    (ha, hb)
}
