//! The `log` feature: the driver's decisions reach the application's logger,
//! each at its area's target (`tegra_interop::loader`, `::backend`, `::fd`,
//! `::drop`, `::nvsci`). A test logger collects every record; each test
//! looks for the records its own action must have produced.
//!
//! Built only with `--features log` (`required-features` in Cargo.toml):
//! `cargo test -p tegra-interop-driver --features log --test log_sim`.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::sync::{Mutex, MutexGuard, OnceLock};

use log::{Level, LevelFilter, Log, Metadata, Record};
use tegra_interop_core::nvsci::{SyncAttr, SyncAttrSet};
use tegra_interop_core::CuResult;
use tegra_interop_driver::error::fd_audit;
use tegra_interop_driver::nvsci::{FenceSource, SyncModule};
use tegra_interop_driver::{Backend, BackendKind, Context, Error, ExternalMemory};
use tegra_interop_sim::{export, NvSciRelease, Sim, SimConfig};

/// One collected record.
#[derive(Debug, Clone)]
struct Entry {
    level: Level,
    target: String,
    message: String,
}

/// Collects every record into a list.
struct Collector(Mutex<Vec<Entry>>);

impl Log for Collector {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &Record<'_>) {
        let entry = Entry {
            level: record.level(),
            target: record.target().to_owned(),
            message: record.args().to_string(),
        };
        match self.0.lock() {
            Ok(mut entries) => entries.push(entry),
            Err(poisoned) => poisoned.into_inner().push(entry),
        }
    }

    fn flush(&self) {}
}

static COLLECTOR: Collector = Collector(Mutex::new(Vec::new()));

/// Installs the collector once for the test binary.
fn logger() -> &'static Collector {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        log::set_logger(&COLLECTOR).unwrap();
        log::set_max_level(LevelFilter::Trace);
    });
    &COLLECTOR
}

impl Collector {
    /// The records so far at `target` whose message contains every one of
    /// `parts`.
    fn find(&self, target: &str, parts: &[&str]) -> Vec<Entry> {
        let entries = match self.0.lock() {
            Ok(e) => e.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        entries
            .into_iter()
            .filter(|e| e.target == target && parts.iter().all(|p| e.message.contains(p)))
            .collect()
    }

    /// Every record so far, for failure messages.
    fn all(&self) -> Vec<Entry> {
        match self.0.lock() {
            Ok(e) => e.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

/// The fd audit counters are process-wide: tests that read them hold this.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn the_loader_logs_whether_libcuda_loaded_and_why_not() {
    let log = logger();
    match Backend::real() {
        Err(Error::DriverNotFound { library, message }) => {
            // This machine has no NVIDIA driver (CI): the failure is logged
            // as a warning at the loader's target, with the loader's reason.
            assert_eq!(library, "libcuda.so.1");
            assert!(!message.is_empty());
            let found = log.find(
                "tegra_interop::loader",
                &["libcuda.so.1", "not loaded", &message],
            );
            assert_eq!(found.len(), 1, "{:#?}", log.all());
            assert_eq!(found[0].level, Level::Warn);
        }
        Ok(backend) => {
            // A machine with a driver: the library loaded, its entry points
            // counted, and the backend chosen is the real one.
            assert_eq!(backend.kind(), BackendKind::Real);
            let loaded = log.find("tegra_interop::loader", &["libcuda.so.1: loaded"]);
            assert!(!loaded.is_empty(), "{:#?}", log.all());
            let resolved = log.find(
                "tegra_interop::loader",
                &["CudaApi: ", "entry points resolved"],
            );
            assert!(!resolved.is_empty(), "{:#?}", log.all());
            let chosen = log.find("tegra_interop::backend", &["BackendKind::Real"]);
            assert!(!chosen.is_empty(), "{:#?}", log.all());
        }
        Err(other) => {
            // The driver loaded but cuInit failed (a driver without a
            // device): logged at the backend's target.
            let found = log.find("tegra_interop::backend", &["cuInit(0) failed"]);
            assert!(!found.is_empty(), "{other}: {:#?}", log.all());
        }
    }
}

#[test]
fn the_backend_choice_is_logged() {
    let log = logger();
    let sim = Sim::new().unwrap();
    let backend = sim.backend();
    assert_eq!(backend.kind(), BackendKind::Table);
    let found = log.find(
        "tegra_interop::backend",
        &[&format!("{:?}", backend.name()), "BackendKind::Table"],
    );
    assert!(!found.is_empty(), "{:#?}", log.all());
    assert_eq!(found[0].level, Level::Info);
}

#[test]
fn a_failed_import_logs_what_became_of_the_duplicate_fd() {
    let log = logger();
    let _g = serial();
    let sim = Sim::new().unwrap();
    let backend = sim.backend();
    let ctx = Context::primary(backend.clone(), 0).unwrap();
    for (nth, (code, outcome)) in [
        // The measured driver closes the fd after a failed import itself
        // (the simulator does the same for such codes): gone.
        (CuResult::OUT_OF_MEMORY, "(gone)"),
        // After a parameter error it keeps it: the duplicate is still ours
        // and is closed (or, where kcmp cannot be asked, left: unproven).
        (CuResult::INVALID_VALUE, "(closed)"),
    ]
    .into_iter()
    .enumerate()
    {
        let (fd, _m) = export::memory(4096).unwrap();
        // The nth import of this simulator is the nth of this loop.
        sim.fail_symbol("cuImportExternalMemory", nth as u64, code.0);
        let before = fd_audit();
        let before_records = log.find("tegra_interop::fd", &[]).len();
        let err = ExternalMemory::opaque_fd(&ctx, fd, 4096).unwrap_err();
        assert_eq!(err.error.code(), Some(code));
        let after = fd_audit();
        // The record names the outcome the audit counted.
        let counted = if after.gone > before.gone {
            "(gone)"
        } else if after.closed > before.closed {
            "(closed)"
        } else if after.reused > before.reused {
            "(reused)"
        } else if after.unproven > before.unproven {
            "(unproven)"
        } else {
            panic!("the failed import counted nothing: {before:?} -> {after:?}");
        };
        if counted != "(unproven)" {
            assert_eq!(counted, outcome, "{code:?}: {before:?} -> {after:?}");
        }
        let records = log.find("tegra_interop::fd", &[]);
        let new = &records[before_records..];
        assert_eq!(new.len(), 1, "{code:?}: {new:#?}");
        assert!(new[0].message.contains("failed import"), "{new:#?}");
        assert!(new[0].message.ends_with(counted), "{new:#?}");
        sim.clear_failures();
    }
}

#[test]
fn an_error_kept_by_drop_is_logged() {
    let log = logger();
    let sim = Sim::new().unwrap();
    let backend = sim.backend();
    let ctx = Context::primary(backend.clone(), 0).unwrap();
    let (fd, _m) = export::memory(4096).unwrap();
    let memory = ExternalMemory::opaque_fd(&ctx, fd, 4096).unwrap();
    sim.fail_symbol("cuDestroyExternalMemory", 0, CuResult::INVALID_HANDLE.0);
    drop(memory);
    let kept = backend.take_drop_errors();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let text = kept[0].to_string();
    let found = log.find(
        "tegra_interop::drop",
        &[
            &format!("{:?}", backend.name()),
            "a Drop could not release",
            &text,
        ],
    );
    assert_eq!(found.len(), 1, "{:#?}", log.all());
    assert_eq!(found[0].level, Level::Warn);
    // Taking the errors is logged too.
    let taken = log.find(
        "tegra_interop::drop",
        &[&format!("{:?}", backend.name()), "1 Drop error(s) taken"],
    );
    assert_eq!(taken.len(), 1, "{:#?}", log.all());
}

#[test]
fn nvsci_version_gating_is_logged() {
    let log = logger();
    let mut cfg = SimConfig::tegra();
    // DRIVE OS 5.2.6: NvSciSync 2.0, without RequireDeterministicFences and
    // without FenceUpdateFence.
    cfg.nvsci_release = NvSciRelease::V5_2_6;
    let sim = Sim::with_config(cfg.with_diagnostic_echo(false)).unwrap();
    let backend = sim.backend();
    let syncs = SyncModule::open(&backend).unwrap();
    let name = format!("{:?}", backend.name());
    let version = syncs.version().to_string();

    let opened = log.find(
        "tegra_interop::nvsci",
        &["NvSciSync module opened", &name, &version],
    );
    assert_eq!(opened.len(), 1, "{:#?}", log.all());

    let mut det = SyncAttrSet::<1>::new();
    det.set(SyncAttr::RequireDeterministicFences(true)).unwrap();
    let err = syncs.attr_list(&det).unwrap_err();
    assert!(matches!(err, Error::NotInLibraryVersion { .. }), "{err:?}");
    let refused = log.find(
        "tegra_interop::nvsci",
        &[
            &format!("NvSciSync {version} lacks"),
            "NvSciSyncAttrKey_RequireDeterministicFences",
            "NotInLibraryVersion",
        ],
    );
    assert!(!refused.is_empty(), "{:#?}", log.all());

    assert_eq!(syncs.fence_source(), FenceSource::Received);
    let source = log.find(
        "tegra_interop::nvsci",
        &[&format!("NvSciSync {version}: fence source received")],
    );
    assert!(!source.is_empty(), "{:#?}", log.all());
}
