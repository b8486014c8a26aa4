//! EGLStreams with CUDA at both ends (`cuEGLStreamConsumer*`,
//! `cuEGLStreamProducer*`).
//!
//! The simulator has no EGL library: a test makes a stream with
//! [`Sim::create_egl_stream`](crate::Sim::create_egl_stream) (the role of
//! `eglCreateStreamKHR`) and hands [`SimEglStream::as_raw`] to the driver;
//! [`SimEglStream::state`] answers what `eglQueryStreamKHR` would.
//!
//! What is modelled, and its source ("measured": the H200, driver 580.159,
//! crates/testkit/tests/gpu_egl_stream.rs; "header": cudaEGL.h; "chosen":
//! neither, the simulator's own answer):
//! - states: CREATED, CONNECTING after the consumer connects, EMPTY after
//!   the producer connects, NEW_FRAME_AVAILABLE while a presented frame
//!   waits, OLD_FRAME_AVAILABLE once frames were acquired and none waits,
//!   DISCONNECTED once either end left (measured);
//! - a producer connecting before the consumer gets UNKNOWN (measured); a
//!   producer in the consumer's own context works (measured);
//! - FIFO of length n: frames are acquired oldest first (measured); a
//!   present to a full FIFO is not measured and is refused (UNKNOWN, with an
//!   `Unimplemented` diagnostic); mailbox: a present replaces the waiting
//!   frame, which goes straight back to the producer (measured);
//! - the consumer sees a copy: its plane pointer differs from the
//!   producer's buffer and holds the presented bytes (measured); an NV12
//!   (YUV420_SEMIPLANAR) present is acquired as YVU420_SEMIPLANAR, two
//!   planes, same pitch (measured on an H100, driver 580.159); the copy is
//!   taken when the present's stream work is done (chosen: when the driver
//!   copies was not measured). Only pitch frames of one RGBA-family plane or
//!   NV12 are accepted (others: UNKNOWN, not simulated);
//! - an acquire with nothing to take waits for its timeout, then takes the
//!   last released frame again if there is one, it is not held and the
//!   producer is still connected (header: EGL_SUPPORT_REUSE_NV is on by
//!   default; measured), else times out. The
//!   H200 answered a timeout with LAUNCH_TIMEOUT in one run and UNKNOWN in
//!   another (measured): the simulator alternates, UNKNOWN first, so a
//!   client must handle both;
//! - releasing a frame: of the released frames the most recently acquired
//!   one is kept by the stream for reuse, any other goes back to the
//!   producer, whatever the order of the releases (measured: two frames
//!   acquired in order, released newest first, and only the older came
//!   back);
//! - `ReturnFrame`: the oldest frame back, else UNKNOWN before anything was
//!   presented and LAUNCH_TIMEOUT after (measured), with the producer's own
//!   description (measured: the producer's pointer); the LAUNCH_TIMEOUT
//!   answer comes after about 2 ms (measured: the pipeline's producer,
//!   draining returns after every frame, lost 2.15 ms per frame);
//! - the producer may leave while the consumer holds a frame; the frame
//!   stays usable until released, later acquires time out (measured);
//!   acquiring a frame that was presented but not taken before the producer
//!   left is not measured and is refused (UNKNOWN);
//! - a consumer that disconnects while holding frames, a second consumer or
//!   producer, a present after the consumer left: not measured, refused
//!   (UNKNOWN, diagnostic);
//! - NULL connection pointers and unknown streams or connections:
//!   INVALID_HANDLE (header lists it); no current context: INVALID_CONTEXT
//!   (header); connect flags other than SYSMEM/VIDMEM: INVALID_VALUE
//!   (chosen). Every step runs on the host at once, after waiting for the
//!   stream's earlier work (chosen: conservative stream order).

use std::collections::{HashMap, VecDeque};

use super::*;

mod consumer;
mod producer;

pub(crate) use consumer::*;
pub(crate) use producer::*;

/// How long a `ReturnFrame` with nothing to return takes (measured on an
/// H100, driver 580.159: about 2 ms per call; see the pipeline's `egl.rs`).
const EMPTY_RETURN_WAIT: std::time::Duration = std::time::Duration::from_millis(2);

/// How a simulated EGLStream hands frames over (`EGL_STREAM_FIFO_LENGTH_KHR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EglStreamMode {
    /// FIFO of this many frames (at least 1).
    Fifo(u32),
    /// Mailbox: a new frame replaces one not acquired yet (FIFO length 0).
    Mailbox,
}

/// `EGL_STREAM_STATE_KHR` of a simulated stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EglStreamState {
    /// Made, no consumer yet.
    Created,
    /// A consumer connected, no producer yet.
    Connecting,
    /// Both ends connected, nothing presented yet.
    Empty,
    /// A presented frame waits for the consumer.
    NewFrameAvailable,
    /// Frames were acquired; none waits.
    OldFrameAvailable,
    /// An end disconnected.
    Disconnected,
}

/// A `CUeglFrame` as plain data (the C struct holds raw pointers, which
/// the simulator's state, shared between threads, cannot).
#[derive(Clone, Copy)]
struct FrameDesc {
    words: [usize; 3],
    width: u32,
    height: u32,
    depth: u32,
    pitch: u32,
    planes: u32,
    channels: u32,
    kind: CUeglFrameType,
    color: CUeglColorFormat,
    format: CUarray_format,
}

impl FrameDesc {
    fn of(f: &CUeglFrame) -> FrameDesc {
        FrameDesc {
            words: crate::cmem::egl_plane_words(f),
            width: f.width,
            height: f.height,
            depth: f.depth,
            pitch: f.pitch,
            planes: f.planeCount,
            channels: f.numChannels,
            kind: f.frameType,
            color: f.eglColorFormat,
            format: f.cuFormat,
        }
    }

    fn frame(&self) -> CUeglFrame {
        let mut f = CUeglFrame {
            width: self.width,
            height: self.height,
            depth: self.depth,
            pitch: self.pitch,
            planeCount: self.planes,
            numChannels: self.channels,
            frameType: self.kind,
            eglColorFormat: self.color,
            cuFormat: self.format,
            ..CUeglFrame::default()
        };
        crate::cmem::set_egl_plane_words(&mut f, self.words);
        f
    }
}

/// A frame in the stream: what the producer presented and the consumer's
/// copy of its planes.
struct Presented {
    producer: FrameDesc,
    /// Device address of the consumer's copy (an allocation of the
    /// consumer's context); its planes keep the producer's offsets.
    copy: u64,
    /// Bytes of plane `i` start at `copy + offsets[i]`.
    offsets: [u64; 3],
    /// When the consumer last acquired it (the stream's acquire count).
    acquired: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Created,
    Connecting,
    Connected,
    Disconnected,
}

/// One simulated `EGLStreamKHR`.
pub(crate) struct EglStreamObj {
    mode: EglStreamMode,
    phase: Phase,
    consumer: Option<(u64, u64)>,
    producer: Option<(u64, u64, u32, u32)>,
    waiting: VecDeque<Presented>,
    /// Acquired frames by resource handle, in acquire order.
    held: Vec<(u64, Presented)>,
    /// The last released frame, kept for reuse.
    kept: Option<Presented>,
    /// Frames back for the producer.
    returned: VecDeque<FrameDesc>,
    presented_any: bool,
    /// Plane addresses of every frame presented while the producer is
    /// connected (the header: none may be freed before it disconnects).
    presented: std::collections::HashSet<usize>,
    acquired_any: bool,
    /// Acquires so far (orders the frames the consumer held).
    acquires: u64,
    timeouts: u64,
}

impl EglStreamObj {
    /// The consumer now holds `p` under resource handle `res`.
    fn hold(&mut self, res: u64, mut p: Presented) {
        self.acquires += 1;
        p.acquired = self.acquires;
        self.held.push((res, p));
    }
}

/// The simulator's EGLStream records: streams by handle, connections (by
/// handle) to their stream.
#[derive(Default)]
pub(crate) struct EglStreams {
    streams: HashMap<usize, EglStreamObj>,
    connections: HashMap<u64, usize>,
}

impl EglStreams {
    /// Connections not disconnected (for the ledger).
    pub(crate) fn live_connections(&self) -> usize {
        self.streams
            .values()
            .map(|s| usize::from(s.consumer.is_some()) + usize::from(s.producer.is_some()))
            .sum()
    }

    /// Frames acquired and not released (graphics resources, for the
    /// ledger).
    pub(crate) fn held_frames(&self) -> usize {
        self.streams.values().map(|s| s.held.len()).sum()
    }

    /// Whether `addr` is a plane of a frame presented by a producer that is
    /// still connected.
    pub(crate) fn presents(&self, addr: u64) -> bool {
        self.streams
            .values()
            .any(|s| s.producer.is_some() && s.presented.contains(&(addr as usize)))
    }
}

static NEXT_STREAM: AtomicUsize = AtomicUsize::new(0x5e9a_0000);

/// An EGLStream made by [`Sim::create_egl_stream`](crate::Sim::create_egl_stream).
pub struct SimEglStream {
    inner: Arc<Instance>,
    handle: usize,
}

impl std::fmt::Debug for SimEglStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimEglStream")
            .field("handle", &self.handle)
            .finish()
    }
}

impl SimEglStream {
    /// The `EGLStreamKHR` to connect CUDA to.
    pub fn as_raw(&self) -> EGLStreamKHR {
        self.handle as EGLStreamKHR
    }

    /// What `eglQueryStreamKHR(EGL_STREAM_STATE_KHR)` would answer.
    pub fn state(&self) -> EglStreamState {
        let st = self.inner.lock_state();
        let Some(s) = st.egl_streams.streams.get(&self.handle) else {
            return EglStreamState::Disconnected;
        };
        match s.phase {
            Phase::Created => EglStreamState::Created,
            Phase::Connecting => EglStreamState::Connecting,
            Phase::Disconnected => EglStreamState::Disconnected,
            Phase::Connected if !s.waiting.is_empty() => EglStreamState::NewFrameAvailable,
            Phase::Connected if s.acquired_any => EglStreamState::OldFrameAvailable,
            Phase::Connected => EglStreamState::Empty,
        }
    }
}

impl Drop for SimEglStream {
    /// `eglDestroyStreamKHR`: a stream CUDA is still connected to is a
    /// misuse (what the real library does then is not known); the copies it
    /// holds are freed either way.
    fn drop(&mut self) {
        let inst = &self.inner;
        let connected = {
            let mut st = inst.lock_state();
            match st.egl_streams.streams.remove(&self.handle) {
                Some(s) => {
                    let copies: Vec<u64> = s
                        .waiting
                        .iter()
                        .chain(s.held.iter().map(|(_, p)| p))
                        .chain(s.kept.iter())
                        .map(|p| p.copy)
                        .collect();
                    for copy in copies {
                        free_copy(&mut st, copy);
                    }
                    s.consumer.is_some() || s.producer.is_some()
                }
                None => false,
            }
        };
        if connected {
            inst.diag(
                None,
                "eglDestroyStreamKHR",
                D::Misuse,
                "an EGLStream destroyed while CUDA was still connected to it (disconnect first)"
                    .into(),
            );
        }
    }
}

impl crate::Sim {
    /// Makes an EGLStream (the simulator's stand-in for
    /// `eglCreateStreamKHR`); `None` for a FIFO of length 0 (use
    /// [`EglStreamMode::Mailbox`]).
    pub fn create_egl_stream(&self, mode: EglStreamMode) -> Option<SimEglStream> {
        if mode == EglStreamMode::Fifo(0) {
            return None;
        }
        let handle = NEXT_STREAM.fetch_add(0x100, Ordering::Relaxed);
        self.inner.lock_state().egl_streams.streams.insert(
            handle,
            EglStreamObj {
                mode,
                phase: Phase::Created,
                consumer: None,
                producer: None,
                waiting: VecDeque::new(),
                held: Vec::new(),
                kept: None,
                returned: VecDeque::new(),
                presented_any: false,
                presented: Default::default(),
                acquired_any: false,
                acquires: 0,
                timeouts: 0,
            },
        );
        Some(SimEglStream {
            inner: Arc::clone(&self.inner),
            handle,
        })
    }
}

/// The stream a live connection belongs to (gone when its `SimEglStream`
/// was dropped: INVALID_HANDLE).
fn stream_obj(st: &State, s: usize) -> R<&EglStreamObj> {
    st.egl_streams.streams.get(&s).ok_or(INVALID_HANDLE)
}

/// Refused as not measured on real hardware: UNKNOWN with a diagnostic.
fn unmeasured(c: &Call, what: &str) -> CUresult {
    c.diag(
        D::Unimplemented,
        format!("{what}: not measured on real hardware, so the simulator refuses it"),
    );
    UNKNOWN
}

fn stream_of(c: &Call, st: &State, stream: Handle<EGLStreamKHR>) -> R<usize> {
    let h = stream.addr();
    if st.egl_streams.streams.contains_key(&h) {
        return Ok(h);
    }
    c.diag(
        D::UnknownHandle,
        format!("{h:#x} is not an EGLStream of this simulator"),
    );
    Err(INVALID_HANDLE)
}

/// The connection a `CUeglStreamConnection*` argument names: its handle and
/// stream.
fn connection(c: &Call, st: &State, conn: CMut<CUeglStreamConnection>) -> R<(u64, usize)> {
    let h = conn.read().ok_or(INVALID_HANDLE)? as usize as u64;
    match st.egl_streams.connections.get(&h) {
        Some(s) => Ok((h, *s)),
        None => Err(not_live(
            c,
            st,
            "EGLStream connection",
            h,
            false,
            INVALID_HANDLE,
        )),
    }
}

/// The stream behind a `CUstream*` argument (NULL pointer or NULL stream:
/// the current context's NULL stream).
fn stream_core(c: &Call, st: &mut State, s: CMut<CUstream>) -> R<Arc<StreamCore>> {
    let h = s.read().map_or(0, |p| p as usize as u64);
    resolve_stream_addr(c, st, h).map(|(_, core)| core)
}

/// The bytes of each plane of a pitch frame the simulator accepts.
fn plane_lens(f: &CUeglFrame) -> Option<Vec<usize>> {
    let rows = f.height as usize;
    let pitch = f.pitch as usize;
    let rgba_family = [
        CUeglColorFormat::CU_EGL_COLOR_FORMAT_RGBA,
        CUeglColorFormat::CU_EGL_COLOR_FORMAT_ARGB,
        CUeglColorFormat::CU_EGL_COLOR_FORMAT_ABGR,
        CUeglColorFormat::CU_EGL_COLOR_FORMAT_BGRA,
    ];
    if f.frameType != CUeglFrameType::CU_EGL_FRAME_TYPE_PITCH || pitch == 0 || rows == 0 {
        return None;
    }
    if f.planeCount == 1 && rgba_family.contains(&f.eglColorFormat) {
        return Some(vec![pitch * rows]);
    }
    if f.planeCount == 2
        && f.eglColorFormat == CUeglColorFormat::CU_EGL_COLOR_FORMAT_YUV420_SEMIPLANAR
    {
        return Some(vec![pitch * rows, pitch * rows.div_ceil(2)]);
    }
    None
}

/// What both connects check first: an initialised driver, a current
/// context, an out-pointer, a known stream. Gives the context and stream.
fn connect_prelude(
    c: &Call,
    st: &State,
    conn: CMut<CUeglStreamConnection>,
    stream: Handle<EGLStreamKHR>,
) -> R<(u64, usize)> {
    init(st)?;
    let ctx = current_ctx(c, st)?;
    if conn.is_null() {
        return Err(INVALID_HANDLE);
    }
    Ok((ctx, stream_of(c, st, stream)?))
}

/// A new connection to stream `s`, written to `conn`.
fn record_connection(st: &mut State, s: usize, conn: CMut<CUeglStreamConnection>) -> u64 {
    let h = new_handle(Tag::EglConnection);
    st.egl_streams.connections.insert(h, s);
    conn.write(core::ptr::without_provenance_mut::<core::ffi::c_void>(h as usize).cast());
    h
}

/// Frees the consumer's copy of a frame.
fn free_copy(st: &mut State, copy: u64) {
    if st.allocations.remove(&copy).is_some() {
        st.gone.insert(copy, GoneWhy::Destroyed);
    }
}

/// The connection `conn` names, checked to be the consumer (`consumer`)
/// or the producer of its stream: its handle and stream.
fn own_end(
    c: &Call,
    st: &State,
    conn: CMut<CUeglStreamConnection>,
    consumer: bool,
) -> R<(u64, usize)> {
    init(st)?;
    let (h, s) = connection(c, st, conn)?;
    let obj = stream_obj(st, s)?;
    let mine = if consumer {
        obj.consumer.map(|x| x.0)
    } else {
        obj.producer.map(|x| x.0)
    };
    if mine != Some(h) {
        return Err(INVALID_HANDLE);
    }
    Ok((h, s))
}

/// Ends a connection: the stream is disconnected; the copies the stream
/// kept are freed once both ends left.
fn disconnect(c: &Call, conn: CMut<CUeglStreamConnection>, consumer: bool) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        let (h, s) = own_end(c, &st, conn, consumer)?;
        let Some(obj) = st.egl_streams.streams.get_mut(&s) else {
            return Err(INVALID_HANDLE);
        };
        if consumer && !obj.held.is_empty() {
            return Err(unmeasured(
                c,
                "a consumer disconnecting while it holds frames",
            ));
        }
        if consumer {
            obj.consumer = None;
        } else {
            obj.producer = None;
            obj.presented.clear();
        }
        obj.phase = Phase::Disconnected;
        let mut freed = Vec::new();
        if obj.consumer.is_none() && obj.producer.is_none() {
            freed.extend(obj.waiting.drain(..).map(|p| p.copy));
            freed.extend(obj.kept.take().map(|p| p.copy));
        }
        st.egl_streams.connections.remove(&h);
        st.gone.insert(h, GoneWhy::Destroyed);
        for copy in freed {
            free_copy(&mut st, copy);
        }
        conn.write(core::ptr::null_mut());
        Ok(())
    })();
    done(r)
}
