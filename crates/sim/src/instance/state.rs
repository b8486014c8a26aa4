//! [`State`]: everything one simulator owns, kept behind its lock, with
//! the queries made on it (device ranges and copies in and out of them,
//! the teardown of a context's objects, reaping of finished streams, and
//! the [`Ledger`] summary). No unsafe code.

#![deny(unsafe_code)]

use std::collections::{BTreeMap, HashMap};

use super::{
    AllocKind, AllocObj, ArrayObj, BufObjectEntry, Ctx, EventObj, FuncObj, GoneWhy, MemObj, MipObj,
    ModuleObj, Primary, ProgramObj, SemObj, StreamObj, SyncObjectEntry,
};
use crate::shm::Region;
use crate::stream::Worker;
use crate::Ledger;

/// Everything a simulator owns, behind one lock.
#[derive(Default)]
pub(crate) struct State {
    pub(crate) initialized: bool,
    pub(crate) contexts: HashMap<u64, Ctx>,
    pub(crate) primaries: Vec<Primary>,
    pub(crate) streams: HashMap<u64, StreamObj>,
    /// The NULL stream of each context, made on first use.
    pub(crate) null_streams: HashMap<u64, Worker>,
    /// Destroyed streams still finishing their work.
    /// Workers of destroyed streams, with their context: their queued work
    /// still runs (as on the real driver) and context synchronisation waits for it.
    pub(crate) retired: Vec<(u64, Worker)>,
    pub(crate) memories: HashMap<u64, MemObj>,
    pub(crate) allocations: BTreeMap<u64, AllocObj>,
    pub(crate) mipmaps: HashMap<u64, MipObj>,
    pub(crate) arrays: HashMap<u64, ArrayObj>,
    pub(crate) semaphores: HashMap<u64, SemObj>,
    /// Handles (and device addresses) that were live once, and why they
    /// are not any more (bounded: see `GoneMap`).
    pub(crate) gone: crate::journal::GoneMap,
    pub(crate) sync_objects: HashMap<usize, SyncObjectEntry>,
    pub(crate) buf_objects: HashMap<usize, BufObjectEntry>,
    /// The NvSci part (modules, attribute lists, objects, endpoints).
    pub(crate) nvsci: crate::nvsci::NvSciState,
    /// EGL images made by `Sim::create_egl_image`, by handle.
    pub(crate) egl_images: HashMap<usize, crate::cuda::EglImageObj>,
    /// Registered EGL images (`CUgraphicsResource`).
    pub(crate) egl_resources: HashMap<u64, crate::cuda::EglResObj>,
    /// EGLStreams made by `Sim::create_egl_stream` and CUDA's connections.
    pub(crate) egl_streams: crate::cuda::EglStreams,
    /// Events by handle.
    pub(crate) events: HashMap<u64, EventObj>,
    /// Loaded modules by handle.
    pub(crate) modules: HashMap<u64, ModuleObj>,
    /// Functions of loaded modules by handle.
    pub(crate) functions: HashMap<u64, FuncObj>,
    /// NVRTC programs by handle.
    pub(crate) programs: HashMap<u64, ProgramObj>,
    /// Kernels registered with `Sim::register_kernel`.
    pub(crate) kernels: crate::kernels::Registry,
}

impl State {
    /// Enters a live device-address range (an allocation, or a mapping of an
    /// import or of a registered graphics resource) at device address `at`,
    /// backed by `region`; the address stops being "gone" if an earlier range
    /// had it. Returns the address as a device pointer.
    pub(crate) fn add_allocation(
        &mut self,
        at: *mut u8,
        ctx: u64,
        len: usize,
        kind: AllocKind,
        region: Region,
    ) -> u64 {
        let p = at as usize as u64;
        self.gone.remove(&p);
        self.allocations.insert(
            p,
            AllocObj {
                ctx,
                len,
                kind,
                _region: region,
            },
        );
        p
    }

    /// The simulator's own mapping that holds the device range
    /// `[addr, addr + n)`: a live allocation or mapped buffer, or the memory
    /// of a mapped mipmapped array.
    pub(crate) fn device_region(&self, addr: u64, n: usize) -> Option<&Region> {
        let a = usize::try_from(addr).ok()?;
        if let Some((_, obj)) = self.allocations.range(..=addr).next_back() {
            // Pinned host memory without DEVICEMAP is not device memory.
            if matches!(obj.kind, AllocKind::Host { mapped: false, .. }) {
                return None;
            }
            if obj._region.contains(a, n) {
                return Some(&obj._region);
            }
        }
        self.mipmaps
            .values()
            .map(|m| &m._region)
            .find(|r| r.contains(a, n))
    }

    /// Whether `[addr, addr + n)` lies inside one live allocation, by the
    /// allocation's own length (not its page-rounded mapping): device
    /// memory, a mapped import, or device-mapped pinned host memory (pinned
    /// memory without DEVICEMAP too when `host_side`, for the host side of
    /// a copy).
    pub(crate) fn live_range(&self, addr: u64, n: usize, host_side: bool) -> bool {
        let Some((start, a)) = self.allocations.range(..=addr).next_back() else {
            return false;
        };
        if !host_side && matches!(a.kind, AllocKind::Host { mapped: false, .. }) {
            return false;
        }
        let end = start.saturating_add(a.len as u64);
        addr.checked_add(n as u64).is_some_and(|e| e <= end)
    }

    /// Copies `n` bytes from `src` to `dst` for a queued copy whose sides
    /// were checked with [`State::live_range`] (pinned host memory without
    /// DEVICEMAP allowed: a copy's host side); `false` when either range is
    /// not simulator memory.
    pub(crate) fn copy_between(&self, src: u64, dst: u64, n: usize) -> bool {
        let region = |addr: u64| -> Option<&Region> {
            let a = usize::try_from(addr).ok()?;
            let (_, obj) = self.allocations.range(..=addr).next_back()?;
            obj._region.contains(a, n).then_some(&obj._region)
        };
        let mut buf = vec![0u8; n];
        match (region(src), region(dst)) {
            (Some(s), Some(d)) => {
                s.read_at(src as usize, &mut buf) && d.write_at(dst as usize, &buf)
            }
            _ => false,
        }
    }

    /// Copies device memory at `addr` into `out`; `false` when the range
    /// is not simulator memory.
    pub(crate) fn device_read(&self, addr: u64, out: &mut [u8]) -> bool {
        self.device_region(addr, out.len())
            .is_some_and(|r| r.read_at(addr as usize, out))
    }

    /// Copies `data` to device memory at `addr`; `false` when the range is
    /// not simulator memory.
    pub(crate) fn device_write(&self, addr: u64, data: &[u8]) -> bool {
        self.device_region(addr, data.len())
            .is_some_and(|r| r.write_at(addr as usize, data))
    }

    /// Sets `n` bytes of device memory at `addr` to `v`; `false` when the
    /// range is not simulator memory.
    pub(crate) fn device_fill(&self, addr: u64, v: u8, n: usize) -> bool {
        self.device_region(addr, n)
            .is_some_and(|r| r.fill_at(addr as usize, v, n))
    }

    /// Removes every object of context `ctx` as the real driver frees them
    /// when the context goes; later use is reported with `why`.
    pub(crate) fn drop_context_objects(&mut self, ctx: u64, why: GoneWhy) {
        let streams: Vec<u64> = self
            .streams
            .iter()
            .filter(|(_, s)| s.ctx == ctx)
            .map(|(h, _)| *h)
            .collect();
        for h in streams {
            self.streams.remove(&h);
            self.gone.insert(h, why);
        }
        self.null_streams.remove(&ctx);
        let mems: Vec<u64> = self
            .memories
            .iter()
            .filter(|(_, m)| m.ctx == ctx)
            .map(|(h, _)| *h)
            .collect();
        for h in mems {
            self.memories.remove(&h);
            self.gone.insert(h, why);
        }
        let allocs: Vec<u64> = self
            .allocations
            .iter()
            .filter(|(_, a)| a.ctx == ctx)
            .map(|(h, _)| *h)
            .collect();
        for h in allocs {
            self.allocations.remove(&h);
            self.gone.insert(h, why);
        }
        let mips: Vec<u64> = self
            .mipmaps
            .iter()
            .filter(|(_, m)| m.ctx == ctx)
            .map(|(h, _)| *h)
            .collect();
        for h in mips {
            if let Some(m) = self.mipmaps.remove(&h) {
                for l in m.levels {
                    self.arrays.remove(&l);
                    self.gone.insert(l, why);
                }
            }
            self.gone.insert(h, why);
        }
        let sems: Vec<u64> = self
            .semaphores
            .iter()
            .filter(|(_, s)| s.ctx == ctx)
            .map(|(h, _)| *h)
            .collect();
        for h in sems {
            self.semaphores.remove(&h);
            self.gone.insert(h, why);
        }
        let events: Vec<u64> = self
            .events
            .iter()
            .filter(|(_, e)| e.ctx == ctx)
            .map(|(h, _)| *h)
            .collect();
        for h in events {
            self.events.remove(&h);
            self.gone.insert(h, why);
        }
        let modules: Vec<u64> = self
            .modules
            .iter()
            .filter(|(_, m)| m.ctx == ctx)
            .map(|(h, _)| *h)
            .collect();
        for h in modules {
            self.drop_module(h, why);
        }
    }

    /// Removes module `h` and its functions; later use is reported with `why`.
    pub(crate) fn drop_module(&mut self, h: u64, why: GoneWhy) {
        self.modules.remove(&h);
        self.gone.insert(h, why);
        let funcs: Vec<u64> = self
            .functions
            .iter()
            .filter(|(_, f)| f.module == h)
            .map(|(f, _)| *f)
            .collect();
        for f in funcs {
            self.functions.remove(&f);
            self.gone.insert(f, why);
        }
    }

    /// Drops finished retired workers.
    pub(crate) fn reap(&mut self) {
        self.retired
            .retain(|(_, w)| !(w.finished() && w.core.pending() == 0));
    }

    pub(crate) fn ledger(&self) -> Ledger {
        let pending = self
            .streams
            .values()
            .map(|s| s.worker.core.pending())
            .sum::<usize>()
            + self
                .null_streams
                .values()
                .map(|w| w.core.pending())
                .sum::<usize>()
            + self
                .retired
                .iter()
                .map(|(_, w)| w.core.pending())
                .sum::<usize>();
        let fds =
            self.memories.len() + self.semaphores.values().filter(|s| s._fd.is_some()).count();
        Ledger {
            live_contexts: self.contexts.values().filter(|c| !c.primary).count(),
            primary_context_refs: self.primaries.iter().map(|p| p.refcount as usize).sum(),
            live_streams: self.streams.len(),
            live_memories: self.memories.len(),
            live_mappings: self
                .allocations
                .values()
                .filter(|a| matches!(a.kind, AllocKind::Mapped))
                .count()
                + self.mipmaps.len(),
            live_allocations: self
                .allocations
                .values()
                .filter(|a| matches!(a.kind, AllocKind::Alloc))
                .count(),
            live_host_allocations: self
                .allocations
                .values()
                .filter(|a| matches!(a.kind, AllocKind::Host { .. }))
                .count(),
            live_events: self.events.len(),
            live_modules: self.modules.len(),
            live_programs: self.programs.len(),
            live_semaphores: self.semaphores.len(),
            live_graphics_resources: self.egl_resources.len() + self.egl_streams.held_frames(),
            live_egl_connections: self.egl_streams.live_connections(),
            open_fds: fds,
            pending_work: pending,
        }
    }
}
