//! External memory: import, mapped buffers, mipmapped arrays.

use super::*;

pub(super) const MEM_OPAQUE_FD: u32 = 1;
pub(super) const MEM_NVSCIBUF: u32 = 8;
pub(super) const MEM_DMABUF_FD: u32 = 9;

/// The descriptor an fd import was handed: its number and the file it
/// referred to when the call began.
#[derive(Clone, Copy)]
pub(super) struct Handed {
    pub(super) fd: c_int,
    pub(super) id: FileId,
}

impl Handed {
    pub(super) fn at(fd: c_int) -> Option<Handed> {
        file_id(fd).map(|id| Handed { fd, id })
    }
}

pub(super) fn site(c: &Call) -> Site {
    Site {
        call_index: c.index,
        symbol: c.symbol,
    }
}

/// Closes the descriptor an import was handed, as the real driver does
/// (after a successful import; after a failed `OPAQUE_FD` memory import),
/// checked: a number that is no longer open or now names another file is
/// reported and left alone.
pub(super) fn close_handed(c: &Call, h: Handed) {
    let (_, diag) = checked_close(&c.inst.fds, site(c), h.fd, h.id, false);
    if let Some(d) = diag {
        c.diag(d.kind, d.message);
    }
}

/// How far a failed `OPAQUE_FD` memory import got; the measured fd effect
/// depends on it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Failed while checking the call (no current context, a bad parameter):
    /// the H200 left the fd open (probe `fd_import_probe.c`, 2026-11-23).
    Parameters,
    /// The parameters were valid and the import itself failed: the H200
    /// closed the fd (UNKNOWN for /dev/null, memfds, files, pipes, sockets).
    Import,
}

/// The stage an injected failure models, decided by its code the way the
/// measurement splits real failures (a choice derived from the probe):
/// INVALID_VALUE and INVALID_CONTEXT were only ever parameter failures (fd
/// kept); NOT_INITIALIZED / DEINITIALIZED happen before any parameter is
/// looked at (fd kept); every other code stands for a failure of the import
/// itself (fd closed).
pub(super) fn injected_stage(code: CUresult) -> Stage {
    if [
        INVALID_VALUE,
        INVALID_CONTEXT,
        NOT_INITIALIZED,
        DEINITIALIZED,
    ]
    .contains(&code)
    {
        Stage::Parameters
    } else {
        Stage::Import
    }
}

pub(crate) fn cuImportExternalMemory(
    c: &Call,
    out: CMut<CUexternalMemory>,
    desc: CPtr<CUDA_EXTERNAL_MEMORY_HANDLE_DESC>,
) -> CUresult {
    // Which fd the call was handed, read before anything can fail.
    let (kind, handed) = match desc.read_in() {
        Some(d) if d.type_.0 == MEM_OPAQUE_FD || d.type_.0 == MEM_DMABUF_FD => {
            // For fd kinds the union holds the descriptor.
            (d.type_.0, Handed::at(d.handle_fd()))
        }
        Some(d) => (d.type_.0, None),
        None => (0, None),
    };
    let mut stage = Stage::Parameters;
    let r = match c.inst.take_injected(c.index) {
        Some(code) => {
            stage = injected_stage(code);
            Err(code)
        }
        None => import_memory(c, out, desc, handed, &mut stage),
    };
    if let Some(h) = handed {
        // Success: the driver owns the fd and closes it (measured).
        // Failure of an OPAQUE_FD import: the H200 closed the fd only when
        // the parameters were valid and the import itself failed; parameter
        // errors (INVALID_VALUE) and INVALID_CONTEXT left it open (measured,
        // probe of 2026-11-23). DMABUF_FD failures (NOT_SUPPORTED,
        // INVALID_VALUE, measured) leave it open.
        if r.is_ok() || (kind == MEM_OPAQUE_FD && stage == Stage::Import) {
            close_handed(c, h);
        }
    }
    done(r)
}

pub(super) fn import_memory(
    c: &Call,
    out: CMut<CUexternalMemory>,
    desc: CPtr<CUDA_EXTERNAL_MEMORY_HANDLE_DESC>,
    handed: Option<Handed>,
    stage: &mut Stage,
) -> R {
    {
        let desc = desc.read_in().ok_or(INVALID_VALUE)?;
        let mut st = c.state();
        init(&st)?;
        // Measured: no current context -> INVALID_CONTEXT, checked before
        // the fd is looked at (the fd stays open).
        let ctx = current_ctx(c, &st)?;
        if out.is_null() {
            return Err(INVALID_VALUE);
        }
        let kind = desc.type_.0;
        // Measured for OPAQUE_FD and DMABUF_FD: size 0, an unknown flag bit,
        // a non-zero reserved word -> INVALID_VALUE, before the kind is
        // served (DMABUF_FD answers NOT_SUPPORTED only for valid parameters).
        if desc.size == 0
            || desc.flags & !CUDA_EXTERNAL_MEMORY_DEDICATED != 0
            || desc.reserved.iter().any(|r| *r != 0)
        {
            return Err(INVALID_VALUE);
        }
        let (fd, file_len, nvscibuf) = match kind {
            MEM_OPAQUE_FD | MEM_DMABUF_FD => {
                // Measured on the H200: every DMABUF_FD import with valid
                // parameters answered NOT_SUPPORTED and left the fd open.
                // Accepting it is an opt-in, unmeasured choice
                // (`SimConfig::dmabuf_import`).
                if kind == MEM_DMABUF_FD && !c.inst.config.dmabuf_import {
                    return Err(NOT_SUPPORTED);
                }
                // The parameters are valid: from here on a failed OPAQUE_FD
                // import closes the fd (measured).
                *stage = Stage::Import;
                // For fd kinds the union holds the descriptor.
                let raw = desc.handle_fd();
                let len = match shm::inspect_fd(raw) {
                    // The real driver answers fd = -1 or a closed number
                    // with UNKNOWN (measured).
                    FdInfo::Bad => return Err(UNKNOWN),
                    FdInfo::NotAFile => {
                        c.diag(
                            D::Misuse,
                            format!(
                                "fd {raw} is not exported GPU memory (not even a regular file)"
                            ),
                        );
                        // Measured for OPAQUE_FD: /dev/null, a pipe, a socket
                        // -> UNKNOWN (and the fd closed). DMABUF_FD (opt-in
                        // only): INVALID_VALUE, chosen.
                        return Err(if kind == MEM_OPAQUE_FD {
                            UNKNOWN
                        } else {
                            INVALID_VALUE
                        });
                    }
                    FdInfo::File(len) => len,
                };
                if handed.map(|h| h.fd) != Some(raw) {
                    // The number was closed or swapped between reading the
                    // descriptor and now (another thread): refuse.
                    return Err(UNKNOWN);
                }
                if kind == MEM_OPAQUE_FD
                    && !with_handed(raw, |b| {
                        shm::is_exported_memfd(b, shm::EXPORTED_MEMORY_NAME)
                    })
                {
                    // Measured: a memfd or a regular file that is not a GPU
                    // allocation -> UNKNOWN, fd closed. Only memory made by
                    // `export::memory` stands for a GPU allocation here.
                    c.diag(
                        D::Misuse,
                        format!(
                            "fd {raw} is a file but not memory exported by the simulator's exporter \
                             (export::memory); the real driver answers UNKNOWN and closes the fd"
                        ),
                    );
                    return Err(UNKNOWN);
                }
                let keep = with_handed(raw, |b| TrackedFd::dup(&c.inst.fds, site(c), b))
                    .map_err(|_| OPERATING_SYSTEM)?;
                (keep, len, false)
            }
            MEM_NVSCIBUF => {
                // For NVSCIBUF the union holds the object pointer.
                let obj = desc.handle_nvscibuf();
                if obj == 0 {
                    return Err(INVALID_VALUE);
                }
                let Some(e) = st.buf_objects.get(&obj) else {
                    if !c.inst.config.nvsci {
                        return Err(NOT_SUPPORTED);
                    }
                    c.diag(
                        D::UnknownHandle,
                        format!("{obj:#x} is not an NvSciBuf object of this simulator"),
                    );
                    return Err(INVALID_VALUE);
                };
                let keep = TrackedFd::dup(&c.inst.fds, site(c), e.fd.as_fd())
                    .map_err(|_| OPERATING_SYSTEM)?;
                (keep, e.size, true)
            }
            2..=7 => {
                // Measured for OPAQUE_WIN32 (2): NOT_SUPPORTED, the fd in the
                // union untouched; the KMT and D3D kinds answer the same
                // (chosen alike, unmeasured).
                c.diag(D::Misuse, format!("memory handle type {kind} is a Windows handle type; not available on Linux"));
                return Err(NOT_SUPPORTED);
            }
            // Measured: type 0 and an unknown type (42) -> INVALID_VALUE.
            _ => return Err(INVALID_VALUE),
        };
        if desc.size > file_len {
            c.diag(
                D::ImportSizeMismatch,
                format!(
                    "import declares {} bytes but the exporter's allocation has {file_len}; the real driver accepts \
                     this; bytes past {file_len} are private zero pages here (not shared)",
                    desc.size
                ),
            );
        }
        let h = new_handle(Tag::Memory);
        st.memories.insert(
            h,
            MemObj {
                ctx,
                fd,
                file_len,
                size: desc.size,
                nvscibuf,
            },
        );
        put(
            out,
            core::ptr::without_provenance_mut::<core::ffi::c_void>(h as usize).cast(),
        )
    }
}

/// What both mappings of an import check first, in this order: the descriptor is readable,
/// the driver initialised, a context current, `out` non-NULL. Returns the descriptor and the
/// locked state.
///
fn open_mapping<'c, D: Plain, O>(
    c: &'c Call,
    out: CMut<O>,
    desc: CPtr<D>,
) -> R<(D, std::sync::MutexGuard<'c, State>)> {
    let desc = get(desc)?;
    let st = c.state();
    init(&st)?;
    current_ctx(c, &st)?;
    if out.is_null() {
        return Err(INVALID_VALUE);
    }
    Ok((desc, st))
}

pub(crate) fn cuExternalMemoryGetMappedBuffer(
    c: &Call,
    out: CMut<CUdeviceptr>,
    ext: Handle<CUexternalMemory>,
    desc: CPtr<CUDA_EXTERNAL_MEMORY_BUFFER_DESC>,
) -> CUresult {
    let h = ext.addr() as u64;
    let r = (|| {
        let (desc, mut st) = open_mapping(c, out, desc)?;
        let Some(mem) = st.memories.get(&h) else {
            return Err(not_live(c, &st, "external memory", h, false, INVALID_VALUE));
        };
        if desc.flags != 0 || desc.size == 0 || desc.reserved.iter().any(|r| *r != 0) {
            return Err(INVALID_VALUE);
        }
        let end = desc.offset.checked_add(desc.size).ok_or(INVALID_VALUE)?;
        if end > mem.size {
            return Err(INVALID_VALUE);
        }
        if end > mem.file_len {
            c.diag(
                D::ImportSizeMismatch,
                format!(
                    "mapping {}..{end} reaches past the exporter's {} bytes; that tail is private zero memory",
                    desc.offset, mem.file_len
                ),
            );
        }
        let len = usize::try_from(desc.size).map_err(|_| INVALID_VALUE)?;
        let (region, ptr) = Region::map_file_device(mem.fd.as_fd(), mem.file_len, desc.offset, len)
            .map_err(|_| OUT_OF_MEMORY)?;
        let ctx = mem.ctx;
        let p = st.add_allocation(ptr, ctx, len, AllocKind::Mapped, region);
        put(out, p)
    })();
    done(r)
}

pub(super) fn element_size(format: u32) -> Option<usize> {
    match format {
        1 | 8 => Some(1),
        2 | 9 | 16 => Some(2),
        3 | 10 | 32 => Some(4),
        _ => None,
    }
}

pub(crate) fn cuExternalMemoryGetMappedMipmappedArray(
    c: &Call,
    out: CMut<CUmipmappedArray>,
    ext: Handle<CUexternalMemory>,
    desc: CPtr<CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC>,
) -> CUresult {
    let h = ext.addr() as u64;
    let r = (|| {
        let (desc, mut st) = open_mapping(c, out, desc)?;
        let Some(mem) = st.memories.get(&h) else {
            return Err(not_live(c, &st, "external memory", h, false, INVALID_VALUE));
        };
        let a = desc.arrayDesc;
        if desc.reserved.iter().any(|r| *r != 0) || a.Width == 0 || desc.numLevels == 0 {
            return Err(INVALID_VALUE);
        }
        if mem.nvscibuf && desc.numLevels != 1 {
            return Err(INVALID_VALUE);
        }
        let Some(elem) = element_size(a.Format.0) else {
            c.diag(
                D::Unimplemented,
                format!("array format {} is not simulated", a.Format.0),
            );
            return Err(INVALID_VALUE);
        };
        if !matches!(a.NumChannels, 1 | 2 | 4) {
            return Err(INVALID_VALUE);
        }
        let layered = a.Flags & CUDA_ARRAY3D_LAYERED != 0;
        let (w0, h0, d0) = (a.Width, a.Height.max(1), a.Depth.max(1));
        let biggest = if layered {
            w0.max(h0)
        } else {
            w0.max(h0).max(d0)
        };
        let max_levels = usize::BITS - biggest.leading_zeros();
        if desc.numLevels > max_levels {
            return Err(INVALID_VALUE);
        }
        // Levels are packed one after the other, rows tightly (a linear
        // layout; a real GPU uses an opaque tiled one).
        let mut levels = Vec::new();
        let mut total = 0usize;
        for l in 0..desc.numLevels {
            let w = (w0 >> l).max(1);
            let hh = (h0 >> l).max(1);
            let d = if layered { d0 } else { (d0 >> l).max(1) };
            let row = w
                .checked_mul(elem * a.NumChannels as usize)
                .ok_or(INVALID_VALUE)?;
            let bytes = row
                .checked_mul(hh)
                .and_then(|x| x.checked_mul(d))
                .ok_or(INVALID_VALUE)?;
            levels.push((total, row, hh, d));
            total = total.checked_add(bytes).ok_or(INVALID_VALUE)?;
        }
        let end = desc.offset.checked_add(total as u64).ok_or(INVALID_VALUE)?;
        if end > mem.size {
            return Err(INVALID_VALUE);
        }
        if end > mem.file_len {
            c.diag(
                D::ImportSizeMismatch,
                format!("mipmapped array reaches past the exporter's {} bytes; that tail is private zero memory", mem.file_len),
            );
        }
        let (region, base) =
            Region::map_file_device(mem.fd.as_fd(), mem.file_len, desc.offset, total)
                .map_err(|_| OUT_OF_MEMORY)?;
        let ctx = mem.ctx;
        let mh = new_handle(Tag::Mipmap);
        let mut handles = Vec::new();
        for (off, row, hh, d) in levels {
            let ah = new_handle(Tag::Array);
            st.arrays.insert(
                ah,
                ArrayObj {
                    ptr: base as usize + off,
                    row_bytes: row,
                    height: hh,
                    depth: d,
                },
            );
            handles.push(ah);
        }
        st.mipmaps.insert(
            mh,
            MipObj {
                ctx,
                levels: handles,
                _region: region,
            },
        );
        put(
            out,
            core::ptr::without_provenance_mut::<core::ffi::c_void>(mh as usize).cast(),
        )
    })();
    done(r)
}

pub(crate) fn cuMipmappedArrayGetLevel(
    c: &Call,
    out: CMut<CUarray>,
    mip: Handle<CUmipmappedArray>,
    level: c_uint,
) -> CUresult {
    let h = mip.addr() as u64;
    let r = (|| {
        let st = c.state();
        init(&st)?;
        let Some(m) = st.mipmaps.get(&h) else {
            return Err(not_live(
                c,
                &st,
                "mipmapped array",
                h,
                false,
                INVALID_HANDLE,
            ));
        };
        let a = *m.levels.get(level as usize).ok_or(INVALID_VALUE)?;
        put(
            out,
            core::ptr::without_provenance_mut::<core::ffi::c_void>(a as usize).cast(),
        )
    })();
    done(r)
}

pub(crate) fn cuMipmappedArrayDestroy(c: &Call, mip: Handle<CUmipmappedArray>) -> CUresult {
    let h = mip.addr() as u64;
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        match st.mipmaps.remove(&h) {
            Some(m) => {
                for l in m.levels {
                    st.arrays.remove(&l);
                    st.gone.insert(l, GoneWhy::Destroyed);
                }
                st.gone.insert(h, GoneWhy::Destroyed);
                Ok(())
            }
            None => Err(not_live(c, &st, "mipmapped array", h, true, INVALID_HANDLE)),
        }
    })();
    done(r)
}

pub(crate) fn cuDestroyExternalMemory(c: &Call, ext: Handle<CUexternalMemory>) -> CUresult {
    let h = ext.addr() as u64;
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        if h == 0 {
            return Err(INVALID_VALUE);
        }
        match st.memories.remove(&h) {
            // Mappings made from it stay valid (freed by their own calls).
            Some(m) => {
                drop(m);
                st.gone.insert(h, GoneWhy::Destroyed);
                Ok(())
            }
            None => Err(not_live(c, &st, "external memory", h, true, INVALID_VALUE)),
        }
    })();
    done(r)
}
