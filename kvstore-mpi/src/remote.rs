//! `dist_async` over MPI: the job as a [`Remote`]. Each process has one serving thread
//! that answers the requests of every rank (its own included) to its `dist_async`
//! stores' shares, one after another, while the process's own calls go on.
//!
//! Threading: MPI stays at `MPI_THREAD_SERIALIZED` (what `dist_sync` uses): every MPI
//! call of the serving thread and of the callers is a short non-blocking one (send,
//! probe, test) made under the process's MPI lock, which is released between them, so
//! a caller waiting for a reply never keeps the serving thread from answering another
//! rank. Requests and replies travel on two communicators of their own (duplicates of
//! the world), apart from `dist_sync`'s: a request is the store's bytes with the channel
//! after them (no copy: the store leaves room), sent with a tag unique among the
//! process's requests in flight; its reply comes back on the other communicator with
//! the same tag. The serving thread receives into one buffer, reused.
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
use mpi::request::Request;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use parking_lot::Mutex;

use crate::group::MpiGroup;
use crate::runtime::{abort_job, locked};

/// Request tags (each request's own, its reply's too) start here and cycle below
/// `FIRST_TAG + TAGS` (MPI guarantees tags up to 32767).
const FIRST_TAG: u32 = 1;
const TAGS: u32 = 32_000;

/// The communicators of `dist_async`'s requests and replies (duplicates of the world,
/// made when MPI starts).
pub(crate) struct Comm(pub(crate) SimpleCommunicator, pub(crate) SimpleCommunicator);

// SAFETY: the communicator is used only by MPI calls made under the process's MPI lock
// (`locked`): MPI runs at MPI_THREAD_SERIALIZED, so no two threads call MPI at once.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

pub(crate) static COMM: OnceLock<Comm> = OnceLock::new();

fn comms() -> Result<&'static Comm> {
    COMM.get().ok_or_else(|| Error::Internal("mpi: dist_async's communicators are missing".into()))
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
/// As [`crate::group()`].
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
fn wait_for<'a, D: ?Sized, S: mpi::request::Scope<'a>>(
    mut request: Request<'a, D, S>,
    deadline: &dyn Fn(),
) -> Result<()> {
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

/// Sends `bytes` to `to` with `tag` on `comm`, waiting for the send as [`wait_for`]
/// does.
fn send(comm: &SimpleCommunicator, to: usize, tag: i32, bytes: &[u8], deadline: &dyn Fn()) -> Result<()> {
    mpi::request::scope(|scope| {
        let request = locked(|| comm.process_at_rank(to as i32).immediate_send_with_tag(scope, bytes, tag))?;
        wait_for(request, deadline)
    })
}

/// The reply with `tag` from `from`, if it has arrived (received as [`receive`] does).
fn try_reply(from: usize, tag: i32) -> Result<Option<Vec<u8>>> {
    let replies = &comms()?.1;
    let Some((message, n, ..)) = locked(|| replies.process_at_rank(from as i32).immediate_matched_probe_with_tag(tag))?
        .map(|(message, status)| matched(message, &status))
    else {
        return Ok(None);
    };
    let mut reply = vec![0u8; n];
    receive(message, &mut reply)?;
    Ok(Some(reply))
}

/// The next request, if one has arrived, received into `buf` (grown as needed): its
/// length, sender and tag.
fn try_request(buf: &mut Vec<u8>) -> Result<Option<(usize, usize, i32)>> {
    let requests = &comms()?.0;
    let Some((message, n, from, tag)) =
        locked(|| requests.any_process().immediate_matched_probe())?.map(|(message, status)| matched(message, &status))
    else {
        return Ok(None);
    };
    if buf.len() < n {
        buf.resize(n, 0);
    }
    receive(message, &mut buf[..n])?;
    Ok(Some((n, from, tag)))
}

/// A probed message, its length in bytes, sender and tag.
fn matched(
    message: mpi::point_to_point::Message,
    status: &mpi::point_to_point::Status,
) -> (mpi::point_to_point::Message, usize, usize, i32) {
    let n = usize::try_from(status.count(u8::equivalent_datatype())).unwrap_or(0);
    (message, n, status.source_rank() as usize, status.tag())
}

/// Receives the probed `message` into `buf`, waiting as [`wait_for`] does: a big message
/// arrives while the lock is free for this process's other MPI calls (a rank's own
/// requests go out while its serving thread takes another rank's in).
fn receive(message: mpi::point_to_point::Message, buf: &mut [u8]) -> Result<()> {
    mpi::request::scope(|scope| {
        let request = locked(|| message.immediate_matched_receive_into(scope, buf))?;
        wait_for(request, &|| {})
    })
}

/// What a timeout's message adds where this process has both `dist_sync` and
/// `dist_async` stores (it made a `dist_sync` call and serves `dist_async` requests): a
/// rank inside a blocking `dist_sync` call answers no `dist_async` request, so a rank
/// that waits for one of its replies never reaches that call.
pub(crate) fn serving_hint() -> &'static str {
    let serving = REMOTE.get().is_some_and(|r| r.server.lock().is_some());
    match serving && crate::runtime::SYNC_CALLS.load(Ordering::Relaxed) {
        true => {
            "; this job has dist_sync and dist_async stores: a rank inside a blocking dist_sync call answers no \
             dist_async request, so a rank waiting for its reply never reaches that call (end every rank's \
             dist_async calls, with the dist_async store's barrier, before a dist_sync call: docs/dist-async.md)"
        }
        false => "",
    }
}

/// [`MpiRemote::finish`] of the process's transport, if it was made.
pub(crate) fn finish() -> Result<()> {
    REMOTE.get().map_or(Ok(()), |r| r.finish())
}

impl MpiRemote {
    /// Ends the job: this rank waited the job's timeout for `what`.
    fn give_up(&self, what: &str) {
        kvstore_core::say!(
            "kvstore-mpi: rank {} waited {:.0} s for {what} (KVSTORE_TIMEOUT): ending the MPI job{}{}",
            self.group.rank(),
            self.group.timeout().as_secs_f64(),
            serving_hint(),
            kvstore_core::timeline::flight_note(true)
        );
        abort_job(crate::watchdog::WATCHDOG_EXIT);
    }

    /// A check to call while waiting for `what`: past the job's timeout, it ends the job
    /// naming it.
    fn deadline(&self, what: String) -> impl Fn() + '_ {
        let start = Instant::now();
        move || {
            if start.elapsed() > self.group.timeout() {
                self.give_up(&what);
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
/// order, until `stop`. A request for a channel this rank does not serve yet (another
/// rank made its store first) waits, in order, until it does.
fn serve(handlers: &Mutex<Vec<Handler>>, stop: &AtomicBool) {
    let Ok(comms) = comms() else { return };
    let mut buf = Vec::new();
    let mut waiting: std::collections::VecDeque<(usize, i32, Vec<u8>)> = std::collections::VecDeque::new();
    let mut backoff = Backoff::new();
    // The request without its channel (the buffer may come back changed, or empty).
    let answer = |from: usize, tag: i32, request: &mut Vec<u8>, handler: &Handler| -> Result<()> {
        request.truncate(request.len().saturating_sub(4));
        let recording = kvstore_core::timeline::recording();
        let start = if recording { kvstore_core::timeline::now() } else { 0 };
        let asked = request.len() as u64;
        let reply = handler(from, request);
        // A reply is waited for without a deadline: the rank that asked waits for it.
        let sent = send(&comms.1, from, tag, &reply, &|| {});
        // The serving thread's work on the timeline: each request answered.
        if recording {
            use kvstore_core::timeline::{self, Arg};
            let args = vec![
                ("from", Arg::U(from as u64)),
                ("bytes_in", Arg::U(asked)),
                ("bytes_out", Arg::U(reply.len() as u64)),
            ];
            timeline::complete("serve", "serve", start, timeline::now(), args);
        }
        sent
    };
    let channel_of = |request: &[u8]| u32::from_le_bytes(request[request.len() - 4..].try_into().unwrap_or_default());
    while !stop.load(Ordering::SeqCst) {
        // The requests that waited for a channel served now, first, in order (those of
        // a channel still missing wait on; requests to other channels do not wait for them).
        if !waiting.is_empty() {
            let mut still = std::collections::VecDeque::new();
            for (from, tag, mut request) in waiting.drain(..) {
                match handlers.lock().get(channel_of(&request) as usize).cloned() {
                    Some(h) => {
                        if answer(from, tag, &mut request, &h).is_err() {
                            return;
                        }
                    }
                    None => still.push_back((from, tag, request)),
                }
            }
            waiting = still;
        }
        let received = match try_request(&mut buf) {
            Ok(r) => r,
            // MPI was finalised under it: nothing more to serve.
            Err(_) => return,
        };
        let Some((n, from, tag)) = received else {
            backoff.pause();
            continue;
        };
        backoff = Backoff::new();
        if n < 4 {
            continue;
        }
        let channel = channel_of(&buf[..n]);
        let handler = handlers.lock().get(channel as usize).cloned();
        match handler {
            // (Behind the requests to its channel that still wait, if any.)
            Some(h) if !waiting.iter().any(|(_, _, r)| channel_of(r) == channel) => {
                buf.truncate(n);
                if answer(from, tag, &mut buf, &h).is_err() {
                    return;
                }
            }
            _ => waiting.push_back((from, tag, buf[..n].to_vec())),
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

    fn max_message(&self) -> usize {
        // One MPI message: a count of bytes in a C int.
        i32::MAX as usize
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

    fn requests(&self, channel: u32, requests: Vec<(usize, Vec<u8>)>) -> Result<Vec<Vec<u8>>> {
        self.requests_while(channel, requests, &mut || {})
    }

    fn requests_while(
        &self,
        channel: u32,
        requests: Vec<(usize, Vec<u8>)>,
        meanwhile: &mut dyn FnMut(),
    ) -> Result<Vec<Vec<u8>>> {
        // Every request in flight at once: the sends started together, `meanwhile` run,
        // then each reply taken as it arrives.
        let messages: Vec<(usize, i32, Vec<u8>)> = requests
            .into_iter()
            .map(|(to, mut message)| {
                message.extend_from_slice(&channel.to_le_bytes());
                let tag = FIRST_TAG + self.next_tag.fetch_add(1, Ordering::Relaxed) % TAGS;
                (to, tag as i32, message)
            })
            .collect();
        let comms = comms()?;
        let start = Instant::now();
        let mut replies: Vec<Option<Vec<u8>>> = vec![None; messages.len()];
        mpi::request::scope(|scope| -> Result<()> {
            let mut sends = Vec::with_capacity(messages.len());
            for (to, tag, message) in &messages {
                let send =
                    locked(|| comms.0.process_at_rank(*to as i32).immediate_send_with_tag(scope, &message[..], *tag))?;
                sends.push(Some(send));
            }
            meanwhile();
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
                        match try_reply(*to, *tag)? {
                            Some(bytes) => *reply = Some(bytes),
                            None => busy = true,
                        }
                    }
                }
                if !busy {
                    return Ok(());
                }
                if start.elapsed() > self.group.timeout() {
                    let mut waiting: Vec<usize> =
                        messages.iter().zip(&replies).filter(|(_, r)| r.is_none()).map(|((to, ..), _)| *to).collect();
                    waiting.dedup();
                    let names: Vec<String> = waiting.iter().map(usize::to_string).collect();
                    let who = format!("{} {}", if waiting.len() == 1 { "rank" } else { "ranks" }, names.join(", "));
                    self.give_up(&format!("{who} to answer a dist_async request"));
                }
                backoff.pause();
            }
        })?;
        Ok(replies.into_iter().map(Option::unwrap_or_default).collect())
    }

    fn request(&self, to: usize, channel: u32, request: Vec<u8>) -> Result<Vec<u8>> {
        let mut replies = self.requests(channel, vec![(to, request)])?;
        Ok(replies.pop().unwrap_or_default())
    }

    fn barrier(&self) -> Result<()> {
        let comm = &comms()?.0;
        let request = locked(|| comm.immediate_barrier())?;
        wait_for(request, &self.deadline("every rank at a dist_async barrier".to_string()))
    }

    fn set_timeout(&self, timeout: Duration) {
        self.group.set_timeout(timeout);
    }
}
