//! Simulated streams: one worker thread per stream runs the enqueued work
//! in order, asynchronously to the caller.

#![deny(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A unit of stream work. It gets the stream so that long waits can poll
/// [`StreamCore::cancelled`].
pub(crate) type Job = Box<dyn FnOnce(&StreamCore) + Send + 'static>;

struct Queue {
    jobs: VecDeque<Job>,
    /// Enqueued and not yet finished (includes the running job).
    pending: usize,
    closing: bool,
}

/// The shared part of a stream.
pub(crate) struct StreamCore {
    queue: Mutex<Queue>,
    changed: Condvar,
    cancel: AtomicBool,
}

fn lock(m: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl StreamCore {
    /// Whether the stream was torn down and running work should stop.
    pub(crate) fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }

    /// Work enqueued and not finished.
    pub(crate) fn pending(&self) -> usize {
        lock(&self.queue).pending
    }

    /// Appends work.
    pub(crate) fn enqueue(&self, job: Job) {
        let mut q = lock(&self.queue);
        q.jobs.push_back(job);
        q.pending += 1;
        self.changed.notify_all();
    }

    /// Waits until all work is done or `timeout` passes; `true` when idle.
    pub(crate) fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut q = lock(&self.queue);
        while q.pending > 0 {
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left,
                    _ => return false,
                },
                None => Duration::from_secs(3600),
            };
            q = match self.changed.wait_timeout(q, left) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        true
    }

    /// Lets the worker finish what is queued and exit.
    pub(crate) fn close(&self) {
        lock(&self.queue).closing = true;
        self.changed.notify_all();
    }

    /// Drops queued work, tells running work to stop, and closes.
    pub(crate) fn abort(&self) {
        self.cancel.store(true, Ordering::Release);
        let dropped: Vec<Job> = {
            let mut q = lock(&self.queue);
            let n = q.jobs.len();
            q.pending -= n;
            q.closing = true;
            q.jobs.drain(..).collect()
        };
        drop(dropped);
        self.changed.notify_all();
    }

    fn run(self: Arc<Self>) {
        loop {
            let job = {
                let mut q = lock(&self.queue);
                loop {
                    if let Some(j) = q.jobs.pop_front() {
                        break Some(j);
                    }
                    if q.closing {
                        break None;
                    }
                    q = match self.changed.wait(q) {
                        Ok(g) => g,
                        Err(e) => e.into_inner(),
                    };
                }
            };
            let Some(job) = job else { return };
            // A panicking job must not kill the worker (its pending count
            // would never drop); the panic is swallowed here.
            let me = &*self;
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(me)));
            let mut q = lock(&self.queue);
            q.pending = q.pending.saturating_sub(1);
            drop(q);
            self.changed.notify_all();
        }
    }
}

/// A stream's core plus its worker thread.
pub(crate) struct Worker {
    pub(crate) core: Arc<StreamCore>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts a worker.
    pub(crate) fn start(name: String) -> std::io::Result<Worker> {
        let core = Arc::new(StreamCore {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                pending: 0,
                closing: false,
            }),
            changed: Condvar::new(),
            cancel: AtomicBool::new(false),
        });
        let c = Arc::clone(&core);
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || c.run())?;
        Ok(Worker {
            core,
            thread: Some(thread),
        })
    }

    /// Whether the thread has exited.
    pub(crate) fn finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.core.abort();
        if let Some(t) = self.thread.take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}
