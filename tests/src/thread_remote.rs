//! A `dist_async` transport of threads in one process ([`ThreadHub`]): each thread is a
//! worker with its own stores, and each worker has a serving thread that answers the
//! requests sent to it one after another (as kvstore-mpi's serving thread does). It
//! runs the `dist_async` semantics without MPI.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use kvstore_core::backend::{Handler, Remote};
use kvstore_core::{Error, KVStore, Result};

/// The workers of one `dist_async` job, as threads.
pub struct ThreadHub {
    size: usize,
    /// Arrivals at the current barrier, and the barrier's number.
    barrier: Mutex<(usize, u64)>,
    arrived: Condvar,
    /// Set when a worker panicked: barriers fail instead of waiting for it for ever.
    broken: AtomicBool,
    /// Per worker, the handler of each of its channels, in the order it served them.
    handlers: Mutex<Vec<Vec<Handler>>>,
    /// Per worker, its serving thread's queue, once it serves.
    queues: Mutex<Vec<Option<Sender<Job>>>>,
    /// The most bytes of one message (`Remote::max_message`; no bound by default).
    max_message: AtomicUsize,
}

/// A request for a serving thread: the channel, the sender's rank, the request, and
/// where the reply goes.
type Job = (u32, usize, Vec<u8>, Sender<Vec<u8>>);

/// One worker's view of a [`ThreadHub`].
pub struct HubMember {
    hub: Arc<ThreadHub>,
    rank: usize,
}

impl ThreadHub {
    pub fn new(size: usize) -> Arc<Self> {
        Arc::new(ThreadHub {
            size,
            barrier: Mutex::new((0, 0)),
            arrived: Condvar::new(),
            broken: AtomicBool::new(false),
            handlers: Mutex::new(vec![Vec::new(); size]),
            queues: Mutex::new(vec![None; size]),
            max_message: AtomicUsize::new(usize::MAX),
        })
    }

    /// Bounds the bytes of one message, as a transport does (MPI: 2 GiB).
    pub fn set_max_message(&self, bytes: usize) {
        self.max_message.store(bytes, Ordering::SeqCst);
    }

    pub fn member(self: &Arc<Self>, rank: usize) -> Arc<HubMember> {
        Arc::new(HubMember { hub: Arc::clone(self), rank })
    }
}

impl Remote for HubMember {
    fn name(&self) -> &'static str {
        "threads"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.hub.size
    }

    fn max_message(&self) -> usize {
        self.hub.max_message.load(Ordering::SeqCst)
    }

    fn serve(&self, handler: Handler) -> Result<u32> {
        let mut handlers = self.hub.handlers.lock().expect("handlers");
        handlers[self.rank].push(handler);
        let channel = (handlers[self.rank].len() - 1) as u32;
        drop(handlers);
        let mut queues = self.hub.queues.lock().expect("queues");
        if queues[self.rank].is_none() {
            let (tx, rx) = mpsc::channel::<Job>();
            let hub = Arc::downgrade(&self.hub);
            let rank = self.rank;
            std::thread::Builder::new()
                .name(format!("serve-{rank}"))
                .spawn(move || {
                    while let Ok((channel, from, mut request, reply)) = rx.recv() {
                        let Some(hub) = hub.upgrade() else { return };
                        let handler = hub.handlers.lock().expect("handlers")[rank][channel as usize].clone();
                        let _ = reply.send(handler(from, &mut request));
                    }
                })
                .expect("a serving thread");
            queues[self.rank] = Some(tx);
        }
        Ok(channel)
    }

    fn request(&self, to: usize, channel: u32, request: Vec<u8>) -> Result<Vec<u8>> {
        let broken = |message: String| Error::Backend { backend: "threads", message };
        let deadline = Instant::now() + Duration::from_secs(60);
        // The owner may not serve the channel yet (it has not made its store).
        let queue = loop {
            let served = self.hub.handlers.lock().expect("handlers")[to].len() > channel as usize;
            let queue = self.hub.queues.lock().expect("queues")[to].clone();
            if let (true, Some(q)) = (served, queue) {
                break q;
            }
            if Instant::now() > deadline {
                return Err(broken(format!("rank {to} never served channel {channel}")));
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let (tx, rx) = mpsc::channel();
        queue
            .send((channel, self.rank, request.to_vec(), tx))
            .map_err(|_| broken(format!("rank {to} stopped serving")))?;
        rx.recv().map_err(|_| broken(format!("rank {to} dropped a request")))
    }

    fn barrier(&self) -> Result<()> {
        let hub = &self.hub;
        let mut state = hub.barrier.lock().expect("barrier");
        let generation = state.1;
        state.0 += 1;
        if state.0 == hub.size {
            *state = (0, generation + 1);
            hub.arrived.notify_all();
            return Ok(());
        }
        while state.1 == generation {
            if hub.broken.load(Ordering::SeqCst) {
                return Err(Error::Backend { backend: "threads", message: "another worker panicked".into() });
            }
            state = hub.arrived.wait_timeout(state, Duration::from_millis(50)).expect("barrier").0;
        }
        Ok(())
    }
}

/// A `dist_async` store of the worker `member`.
pub fn async_store(member: &Arc<HubMember>) -> KVStore {
    async_store_of("dist_async", member)
}

/// A store of `kind` (`dist_async` or `dist_async_device`) of the worker `member`.
fn async_store_of(kind: &str, member: &Arc<HubMember>) -> KVStore {
    let remote: Arc<dyn Remote> = Arc::clone(member) as _;
    KVStore::builder(kind).num_threads(1).remote(remote).build().expect(kind)
}

/// Runs `worker(rank, store)` on `size` threads, each with a `dist_async` store of one
/// [`ThreadHub`], and returns their results in rank order.
pub fn run_async_workers<T: Send + 'static>(
    size: usize,
    worker: impl Fn(usize, KVStore) -> T + Send + Sync + 'static,
) -> Vec<T> {
    run_async_kind_workers("dist_async", size, worker)
}

/// [`run_async_workers`] with stores of `kind` (`dist_async` or `dist_async_device`).
pub fn run_async_kind_workers<T: Send + 'static>(
    kind: &'static str,
    size: usize,
    worker: impl Fn(usize, KVStore) -> T + Send + Sync + 'static,
) -> Vec<T> {
    run_async_workers_on(kind, ThreadHub::new(size), worker)
}

/// [`run_async_kind_workers`] on the workers of `hub`.
pub fn run_async_workers_on<T: Send + 'static>(
    kind: &'static str,
    hub: Arc<ThreadHub>,
    worker: impl Fn(usize, KVStore) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let size = hub.size;
    let worker = Arc::new(worker);
    let handles: Vec<_> = (0..size)
        .map(|rank| {
            let (member, worker) = (hub.member(rank), Arc::clone(&worker));
            std::thread::spawn(move || {
                let kv = async_store_of(kind, &member);
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker(rank, kv)));
                if run.is_err() {
                    member.hub.broken.store(true, Ordering::SeqCst);
                }
                run
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().expect("worker thread")).collect();
    results.into_iter().map(|r| r.unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
}
