//! The backend conformance suite against the simulator (CI). The GPU issue
//! runs the same checks against the real driver with a Vulkan exporter.
#![allow(clippy::unwrap_used)] // tests may unwrap

use tegra_interop_sim::{DiagnosticKind, Sim, SimConfig};

/// A simulator whose diagnostics are only recorded (the checks provoke
/// misuse on purpose; the tests read the diagnostics).
fn quiet(cfg: SimConfig) -> Sim {
    Sim::with_config(cfg.with_diagnostic_echo(false)).unwrap()
}
use tegra_interop_testkit::conformance;
use tegra_interop_testkit::sim_exporter::SimExporter;

fn run(name: &str, check: conformance::Check) {
    let sim = quiet(SimConfig::default());
    conformance::register_sim_kernels(&sim);
    let backend = sim.backend();
    check(&backend, &mut SimExporter).unwrap();
    drop(backend);
    assert!(sim.ledger().is_clean(), "leaked: {}", sim.ledger());
    let mut diagnostics = sim.diagnostics();
    if name == "failed_imports_return_the_callers_fd" || name == "registered_host_memory_round_trip"
    {
        // Those checks hand /dev/null, pipes and sockets to imports, or
        // register a range twice, on purpose: the simulator reports each as
        // misuse (what it is).
        let before = diagnostics.len();
        diagnostics.retain(|d| d.kind != DiagnosticKind::Misuse);
        assert!(diagnostics.len() < before, "the misuse was reported");
    }
    assert!(
        diagnostics.is_empty(),
        "simulator diagnostics: {diagnostics:#?}"
    );
}

macro_rules! checks {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                run(stringify!($name), conformance::$name);
            }
        )*

        #[test]
        fn every_check_of_the_suite_is_run_here() {
            let here = [$(stringify!($name)),*];
            for (name, _) in conformance::CHECKS {
                assert!(here.contains(name), "conformance check {name} is not run on the simulator");
            }
        }
    };
}

checks!(
    import_and_map,
    data_both_ways,
    binary_exporter_to_cuda,
    binary_cuda_to_exporter,
    timeline_both_directions,
    timeline_backwards_refused,
    batched_signal_and_wait,
    wait_before_signal,
    teardown,
    memory_validation_refusals,
    semaphore_validation_refusals,
    cross_context_refused,
    failed_imports_return_the_callers_fd,
    copy_from_host_done_on_return,
    device_buffer_round_trip,
    pinned_mapped_visible_both_ways,
    event_ordering,
    nvrtc_module_launch,
    short_grid_leaves_the_tail,
    launch_and_module_refusals,
    registered_host_memory_round_trip,
);

/// The check `short_grid_leaves_the_tail` can fail: a twin that processes
/// the whole buffer whatever the grid (what a launch-level twin that does
/// not honour its grid does) passes where the GPU leaves the tail, and the
/// check says so.
#[test]
fn a_twin_that_ignores_the_grid_fails_the_short_grid_check() {
    use tegra_interop_sim::kernels::{KernelFault, KernelSpec};
    let sim = quiet(SimConfig::default());
    sim.register_kernel(
        KernelSpec::new(conformance::ADD_ONE.0, conformance::ADD_ONE.1),
        |k| {
            let (buf, len) = (k.arg_u64(0)?, k.arg_u64(1)?);
            let n = usize::try_from(len).map_err(|_| KernelFault::new("len"))?;
            let mut bytes = vec![0u8; n];
            k.read(buf, &mut bytes)?;
            bytes.iter_mut().for_each(|b| *b = b.wrapping_add(1));
            k.write(buf, &bytes)
        },
    );
    let e = conformance::short_grid_leaves_the_tail(&sim.backend(), &mut SimExporter).unwrap_err();
    assert!(e.to_string().contains("past the grid"), "{e}");
}

#[test]
fn run_all_reports_no_failures() {
    let sim = quiet(SimConfig::default());
    conformance::register_sim_kernels(&sim);
    let failures = conformance::run_all(&sim.backend(), &mut SimExporter);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `Sim::backend` is safe because the simulator keeps the contract of
/// `Backend::from_table`. What can be checked from outside: the backend
/// wraps exactly the simulator's table; with NvSci on, that table has every
/// entry point of the generated lists but the one its README says it leaves
/// out (a new entry point the simulator lacked would be a gap); and the conformance suite (the checks
/// the real driver passes) passes over that same backend with NvSci on too.
#[test]
fn sim_upholds_the_table_contract() {
    let sim = quiet(SimConfig::tegra());
    conformance::register_sim_kernels(&sim);
    let backend = sim.backend();
    let (ours, theirs) = (backend.table(), sim.table());
    let lists = [
        (
            ours.cuda.present().collect::<Vec<_>>(),
            theirs.cuda.present().collect::<Vec<_>>(),
            ours.cuda.missing().collect::<Vec<_>>(),
        ),
        (
            ours.nvscibuf.present().collect(),
            theirs.nvscibuf.present().collect(),
            ours.nvscibuf.missing().collect(),
        ),
        (
            ours.nvscisync.present().collect(),
            theirs.nvscisync.present().collect(),
            ours.nvscisync.missing().collect(),
        ),
        (
            ours.nvsciipc.present().collect(),
            theirs.nvsciipc.present().collect(),
            ours.nvsciipc.missing().collect(),
        ),
        (
            ours.nvrtc.present().collect(),
            theirs.nvrtc.present().collect(),
            ours.nvrtc.missing().collect(),
        ),
    ];
    // Left out on purpose (an absent entry is reported as NotSupported,
    // which is sound); the simulator's README says why.
    const NOT_SIMULATED: &[&str] = &["cuEventCreateFromEGLSync"];
    let mut lacking = Vec::new();
    for (present, sims, missing) in lists {
        assert_eq!(present, sims, "the backend is not the simulator's table");
        lacking.extend(missing);
    }
    assert_eq!(lacking, NOT_SIMULATED, "entries the simulator lacks");
    let failures = conformance::run_all(&backend, &mut SimExporter);
    assert!(failures.is_empty(), "{failures:#?}");
    drop(backend);
    assert!(sim.ledger().is_clean(), "leaked: {}", sim.ledger());
}

/// The whole conformance suite over the simulator presenting a CUDA 11.4
/// driver (JetPack 5's): the entry points newer than 11.4 are absent, and
/// every check still passes, because nothing the suite needs is newer
/// (the launch checks that use `cuFuncGetParamInfo`, CUDA 12.4, are
/// skipped by the suite where the driver cannot check argument sizes).
#[test]
fn run_all_reports_no_failures_on_a_cuda_11_4_driver() {
    let sim = quiet(SimConfig::default().with_driver_version(SimConfig::CUDA_11_4));
    conformance::register_sim_kernels(&sim);
    let backend = sim.backend();
    assert!(backend.table().cuda.cuFuncGetParamInfo.is_none());
    let failures = conformance::run_all(&backend, &mut SimExporter);
    assert!(failures.is_empty(), "{failures:#?}");
    drop(backend);
    assert!(sim.ledger().is_clean(), "leaked: {}", sim.ledger());
}
