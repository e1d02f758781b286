//! `dist_async` over MPI: the job as a [`Remote`]. Each process has one serving thread
//! that answers the requests of every rank (its own included) to its `dist_async`
//! stores' shares, one after another, while the process's own calls go on.
//!
//! Threading: MPI stays at `MPI_THREAD_SERIALIZED` (what `dist_sync` uses): every MPI
//! call of the serving thread and of the callers is a short non-blocking one (send,
//! probe, test) made under the process's MPI lock, which is released between them, so
//! a caller waiting for a reply never keeps the serving thread from answering another
//! rank. The messages travel on a communicator of their own (a duplicate of the world),
//! apart from `dist_sync`'s. A request is `channel, reply tag, bytes` (tag
//! [`REQUEST_TAG`]); its reply comes back with the reply tag, which is unique among the
//! process's requests in flight.
//!
//! A rank that waits longer than the job's timeout (`KVSTORE_TIMEOUT`) for a reply or at
//! a barrier ends the job, naming the rank it waited for. [`crate::finalize`] keeps
//! serving until every rank has come to its own finalize, so that a rank that finished
//! its calls does not strand another's pulls.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use kvstore_core::backend::{Collective, Handler, Remote};
use kvstore_core::{Error, Result};
use mpi::point_to_point::MatchedReceiveVec;
use mpi::request::Request;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use parking_lot::Mutex;

use crate::group::{MpiGroup, abort_job, locked};

/// The tag of requests; replies use tags from [`FIRST_REPLY_TAG`] on.
const REQUEST_TAG: i32 = 11;
const FIRST_REPLY_TAG: u32 = 100;
/// Reply tags cycle below this (MPI guarantees tags up to 32767).
const REPLY_TAGS: u32 = 32_000;

/// The communicator of `dist_async` messages (a duplicate of the world, made when MPI
/// starts).
pub(crate) struct Comm(pub(crate) SimpleCommunicator);

// SAFETY: the communicator is used only by MPI calls made under the process's MPI lock
// (`locked`): MPI runs at MPI_THREAD_SERIALIZED, so no two threads call MPI at once.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

pub(crate) static COMM: OnceLock<Comm> = OnceLock::new();

fn comm() -> Result<&'static SimpleCommunicator> {
    COMM.get().map(|c| &c.0).ok_or_else(|| Error::Internal("mpi: dist_async's communicator is missing".into()))
}

/// The process's `dist_async` transport.
pub struct MpiRemote {
    group: Arc<MpiGroup>,
    handlers: Arc<Mutex<Vec<Handler>>>,
    next_tag: AtomicU32,
    /// The serving thread, once a store serves.
    server: Mutex<Option<std::thread::JoinHandle<()>>>,
    stop: Arc<AtomicBool>,
}

static REMOTE: OnceLock<Arc<MpiRemote>> = OnceLock::new();

/// The job's `dist_async` transport, initialising MPI on first use.
///
/// # Errors
/// As [`crate::group`].
pub fn remote() -> Result<Arc<MpiRemote>> {
    let group = crate::group()?;
    Ok(Arc::clone(REMOTE.get_or_init(|| {
        Arc::new(MpiRemote {
            group,
            handlers: Arc::new(Mutex::new(Vec::new())),
            next_tag: AtomicU32::new(0),
            server: Mutex::new(None),
            stop: Arc::new(AtomicBool::new(false)),
        })
    })))
}

/// A pause between two tests of something not done yet: yields at first, then sleeps
/// a little longer each time (up to 50 us), so that a waiting thread costs little.
struct Backoff(u32);

impl Backoff {
    fn new() -> Self {
        Backoff(0)
    }

    fn pause(&mut self) {
        self.0 = self.0.saturating_add(1);
        match self.0 {
            0..=64 => std::thread::yield_now(),
            n => std::thread::sleep(Duration::from_micros(u64::from((n - 64).min(50)))),
        }
    }
}

/// Waits for `request` by testing it under the MPI lock (released between tests).
fn wait_for<'a, S: mpi::request::Scope<'a>>(mut request: Request<'a, [u8], S>, deadline: &dyn Fn()) -> Result<()> {
    let mut backoff = Backoff::new();
    loop {
        match locked(|| request.test())? {
            Ok(_) => return Ok(()),
            Err(pending) => request = pending,
        }
        deadline();
        backoff.pause();
    }
}

/// Sends `bytes` to `to` with `tag`, waiting for the send as [`wait_for`] does.
fn send(to: usize, tag: i32, bytes: &[u8], deadline: &dyn Fn()) -> Result<()> {
    let comm = comm()?;
    mpi::request::scope(|scope| {
        let request = locked(|| comm.process_at_rank(to as i32).immediate_send_with_tag(scope, bytes, tag))?;
        wait_for(request, deadline)
    })
}

/// The next message from `from` (any rank: `None`) with `tag`, if one has arrived:
/// its bytes and sender.
fn try_receive(from: Option<usize>, tag: i32) -> Result<Option<(Vec<u8>, usize)>> {
    let comm = comm()?;
    locked(|| {
        let probed = match from {
            Some(r) => comm.process_at_rank(r as i32).immediate_matched_probe_with_tag(tag),
            None => comm.any_process().immediate_matched_probe_with_tag(tag),
        };
        probed.map(|matched| {
            let (bytes, status) = matched.matched_receive_vec::<u8>();
            (bytes, status.source_rank() as usize)
        })
    })
}

/// [`MpiRemote::finish`] of the process's transport, if it was made.
pub(crate) fn finish() -> Result<()> {
    REMOTE.get().map_or(Ok(()), |r| r.finish())
}

impl MpiRemote {
    /// A check to call while waiting for `what` from `rank`: past the job's timeout, it
    /// ends the job naming them.
    fn deadline(&self, what: String) -> impl Fn() + '_ {
        let start = Instant::now();
        move || {
            let timeout = self.group.timeout();
            if start.elapsed() > timeout {
                eprintln!(
                    "kvstore-mpi: rank {} waited {:.0} s for {what} (KVSTORE_TIMEOUT): ending the MPI job",
                    self.group.rank(),
                    timeout.as_secs_f64()
                );
                abort_job(crate::group::watchdog::WATCHDOG_EXIT);
            }
        }
    }

    /// Starts the serving thread (once).
    fn start_serving(&self) -> Result<()> {
        let mut server = self.server.lock();
        if server.is_some() {
            return Ok(());
        }
        let (handlers, stop) = (Arc::clone(&self.handlers), Arc::clone(&self.stop));
        let thread = std::thread::Builder::new()
            .name("kvstore-mpi-serve".into())
            .spawn(move || serve(&handlers, &stop))
            .map_err(|e| Error::ResourceExhausted {
                what: "starting the dist_async serving thread".into(),
                detail: e.to_string(),
            })?;
        *server = Some(thread);
        Ok(())
    }

    /// Waits, serving, until every rank has come here; then stops the serving thread.
    /// Called by [`crate::finalize`].
    pub(crate) fn finish(&self) -> Result<()> {
        if self.server.lock().is_none() {
            return Ok(());
        }
        self.barrier()?;
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.server.lock().take() {
            let _ = thread.join();
        }
        Ok(())
    }
}

/// The serving thread: answers each request with its channel's handler, in arrival
/// order, until `stop`.
fn serve(handlers: &Mutex<Vec<Handler>>, stop: &AtomicBool) {
    let mut backoff = Backoff::new();
    while !stop.load(Ordering::SeqCst) {
        let received = match try_receive(None, REQUEST_TAG) {
            Ok(r) => r,
            // MPI was finalised under it: nothing more to serve.
            Err(_) => return,
        };
        let Some((bytes, from)) = received else {
            backoff.pause();
            continue;
        };
        backoff = Backoff::new();
        if bytes.len() < 8 {
            continue;
        }
        let channel = u32::from_le_bytes(bytes[0..4].try_into().unwrap_or_default()) as usize;
        let tag = u32::from_le_bytes(bytes[4..8].try_into().unwrap_or_default()) as i32;
        let handler = handlers.lock().get(channel).cloned();
        let reply = match handler {
            Some(h) => h(from, &bytes[8..]),
            None => {
                let message =
                    format!("rank {from} asked for dist_async store {channel}, which this rank does not have");
                let mut r = vec![1];
                r.extend_from_slice(&(8u32).to_le_bytes());
                r.extend_from_slice(b"INTERNAL");
                r.extend_from_slice(message.as_bytes());
                r
            }
        };
        // A reply is waited for without a deadline: the rank that asked waits for it.
        if send(from, tag, &reply, &|| {}).is_err() {
            return;
        }
    }
}

impl Remote for MpiRemote {
    fn name(&self) -> &'static str {
        "mpi"
    }

    fn rank(&self) -> usize {
        self.group.rank()
    }

    fn size(&self) -> usize {
        self.group.size()
    }

    fn serve(&self, handler: Handler) -> Result<u32> {
        let channel = {
            let mut handlers = self.handlers.lock();
            handlers.push(handler);
            (handlers.len() - 1) as u32
        };
        self.start_serving()?;
        Ok(channel)
    }

    fn requests(&self, channel: u32, requests: &[(usize, Vec<u8>)]) -> Result<Vec<Vec<u8>>> {
        if requests.len() < 2 {
            return requests.iter().map(|(to, r)| self.request(*to, channel, r)).collect();
        }
        // Every request in flight at once: the sends started together, then each reply
        // taken as it arrives.
        let messages: Vec<(usize, i32, Vec<u8>)> = requests
            .iter()
            .map(|(to, request)| {
                let tag = FIRST_REPLY_TAG + self.next_tag.fetch_add(1, Ordering::Relaxed) % REPLY_TAGS;
                let mut message = Vec::with_capacity(8 + request.len());
                message.extend_from_slice(&channel.to_le_bytes());
                message.extend_from_slice(&tag.to_le_bytes());
                message.extend_from_slice(request);
                (*to, tag as i32, message)
            })
            .collect();
        let comm = comm()?;
        let deadline = self.deadline("an owner to answer a dist_async request".to_string());
        let mut replies: Vec<Option<Vec<u8>>> = vec![None; messages.len()];
        mpi::request::scope(|scope| -> Result<()> {
            let mut sends = Vec::with_capacity(messages.len());
            for (to, _, message) in &messages {
                let send = locked(|| {
                    comm.process_at_rank(*to as i32).immediate_send_with_tag(scope, &message[..], REQUEST_TAG)
                })?;
                sends.push(Some(send));
            }
            let mut backoff = Backoff::new();
            loop {
                let mut busy = false;
                for slot in sends.iter_mut() {
                    if let Some(send) = slot.take() {
                        match locked(|| send.test())? {
                            Ok(_) => {}
                            Err(pending) => {
                                *slot = Some(pending);
                                busy = true;
                            }
                        }
                    }
                }
                for ((to, tag, _), reply) in messages.iter().zip(replies.iter_mut()) {
                    if reply.is_none() {
                        match try_receive(Some(*to), *tag)? {
                            Some((bytes, _)) => *reply = Some(bytes),
                            None => busy = true,
                        }
                    }
                }
                if !busy {
                    return Ok(());
                }
                deadline();
                backoff.pause();
            }
        })?;
        Ok(replies.into_iter().map(Option::unwrap_or_default).collect())
    }

    fn request(&self, to: usize, channel: u32, request: &[u8]) -> Result<Vec<u8>> {
        let tag = FIRST_REPLY_TAG + self.next_tag.fetch_add(1, Ordering::Relaxed) % REPLY_TAGS;
        let mut message = Vec::with_capacity(8 + request.len());
        message.extend_from_slice(&channel.to_le_bytes());
        message.extend_from_slice(&tag.to_le_bytes());
        message.extend_from_slice(request);
        let deadline = self.deadline(format!("rank {to} to answer a dist_async request"));
        send(to, REQUEST_TAG, &message, &deadline)?;
        let mut backoff = Backoff::new();
        loop {
            if let Some((reply, _)) = try_receive(Some(to), tag as i32)? {
                return Ok(reply);
            }
            deadline();
            backoff.pause();
        }
    }

    fn barrier(&self) -> Result<()> {
        let comm = comm()?;
        let mut request = locked(|| comm.immediate_barrier())?;
        let deadline = self.deadline("every rank at a dist_async barrier".to_string());
        let mut backoff = Backoff::new();
        loop {
            match locked(|| request.test())? {
                Ok(_) => return Ok(()),
                Err(pending) => request = pending,
            }
            deadline();
            backoff.pause();
        }
    }

    fn set_timeout(&self, timeout: Duration) {
        self.group.set_timeout(timeout);
    }
}
