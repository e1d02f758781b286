//! `dist_async` stores: every key has an owner among the workers, which keeps the
//! key's value and optimizer state in a local store of its own (its share, `server`)
//! and applies each push as it arrives; a pull returns the owner's value at the time it
//! is served. A worker's store keeps a copy of each key (for the checks of its calls,
//! and to copy pulled values to its outs), sums its own values locally, and reaches the
//! owners through a [`Remote`].
//!
//! Ownership: a key of fewer elements than `MXNET_KVSTORE_BIGARRAY_BOUND` (default
//! 1,000,000) has one owner, `crc32(key) % workers`; a bigger one is split into one
//! contiguous part per worker, part `p` owned by `(crc32(key) + p) % workers` (MXNet's
//! servers split big arrays alike). Every worker computes the same owners.
//!
//! Messages: a request is `op, name, dtype, shape, bytes`; a reply is `0, bytes` or
//! `1, error kind, message`. An owner names a part of a split key `key` `"key\u{1}p"`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::data::{Entry, KVStore, Merger, Owners, Slot, Store};
use super::locks::Held;
use crate::context::Context;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::key::Key;
use crate::ndarray::NDArray;
use crate::optimizer::KeyState;
use crate::optimizer::Optimizer;
use crate::remote::{Handler, Remote};
use crate::updater::Updater;

const INIT: u8 = 1;
const PUSH: u8 = 2;
const PULL: u8 = 3;
/// A part's value and optimizer state, for a checkpoint.
const SNAPSHOT: u8 = 4;

/// The most bytes a transport adds to a request (`Remote::request`).
const FRAMING: usize = 16;

/// The most bytes of a piece in which [`Owners::broadcast`] sends (a whole commit may be
/// more than one message holds), and how many workers it sends a piece to at once: the
/// root holds at most that many copies of a piece.
const PIECE: usize = 64 << 20;
const AT_ONCE: usize = 8;

/// The separator of a split key's part names on its owners.
const PART: char = '\u{1}';

/// One part of a key: its owner, its elements, and its name on the owner.
struct Part {
    owner: usize,
    start: usize,
    len: usize,
    name: Key,
}

/// A `dist_async` store's link to the owners, and its own share of the keys.
pub(crate) struct Shards {
    transport: Arc<dyn Remote>,
    channel: u32,
    /// The parts this worker owns, in a local store.
    server: Arc<KVStore>,
    /// The buffers of this worker's own parts of split keys, for its own calls.
    own: Buffers,
    bound: usize,
    /// The channel of the workers' exchanges ([`Owners::exchange`]), the messages it
    /// received, and the number of the next exchange.
    mail: u32,
    mailbox: Arc<Mailbox>,
    exchanges: AtomicU64,
}

/// The messages of the workers' exchanges, by sender and exchange, until taken.
type Mailbox = Mutex<HashMap<(usize, u64), Vec<u8>>>;

fn dtype_code(d: DType) -> u8 {
    DType::ALL.iter().position(|&x| x == d).unwrap_or(0) as u8
}

/// A request: `op`, the part's `name`, and an array's dtype, shape and bytes.
fn request(op: u8, name: &Key, dtype: DType, shape: &[usize], bytes: &[u8]) -> Vec<u8> {
    // (16 bytes to spare: the transport's framing goes at the end.)
    let mut m = Vec::with_capacity(32 + name.as_str().len() + 8 * shape.len() + bytes.len());
    m.push(op);
    m.extend_from_slice(&(name.as_str().len() as u32).to_le_bytes());
    m.extend_from_slice(name.as_str().as_bytes());
    m.push(dtype_code(dtype));
    m.push(shape.len() as u8);
    for &d in shape {
        m.extend_from_slice(&(d as u64).to_le_bytes());
    }
    // The bytes start at a multiple of 8, so that an owner can read them in place.
    m.resize(m.len().next_multiple_of(8), 0);
    m.extend_from_slice(bytes);
    m
}

/// A request's array bytes, lent to the owner's store as a pushed value, used in place
/// (an updater may write it, as any pushed value); the request's buffer goes back to
/// `back` when the array is dropped.
struct Lent {
    message: Vec<u8>,
    start: usize,
    back: Arc<Mutex<Vec<u8>>>,
}

impl crate::ndarray::ForeignMemory for Lent {
    fn bytes(&self) -> &[u8] {
        &self.message[self.start..]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.message[self.start..]
    }
    /// The store's own memory: no other wrapper names it.
    fn shared(&self) -> bool {
        false
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        *self.back.lock() = std::mem::take(&mut self.message);
    }
}

/// A request's op, part name, dtype and shape, and where its array's bytes start.
fn header(message: &[u8]) -> Result<(u8, Key, DType, Vec<usize>, usize)> {
    let mut m = message;
    let op = take(&mut m, 1)?[0];
    let n = u32_of(take(&mut m, 4)?) as usize;
    let name = std::str::from_utf8(take(&mut m, n)?).map_err(|_| Error::Internal("dist_async: a bad name".into()))?;
    let name = Key::from(name);
    let dtype = *DType::ALL
        .get(usize::from(take(&mut m, 1)?[0]))
        .ok_or_else(|| Error::Internal("dist_async: a bad dtype".into()))?;
    let ndim = usize::from(take(&mut m, 1)?[0]);
    let shape = (0..ndim)
        .map(|_| take(&mut m, 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()) as usize))
        .collect::<Result<Vec<_>>>()?;
    let at = message.len() - m.len();
    take(&mut m, at.next_multiple_of(8) - at)?;
    Ok((op, name, dtype, shape, message.len() - m.len()))
}

/// The error of a call that `owner` refused for `key`, with its error `code` and
/// `message`.
fn refused(owner: usize, key: &Key, code: &str, message: &dyn std::fmt::Display) -> Error {
    Error::Backend {
        backend: "dist_async",
        message: format!("rank {owner}, the owner of key \"{key}\", refused the call ({code}): {message}"),
    }
}

/// `e` (a call on `key` that some owner refused), naming the owners that served their
/// part all the same: for a push, the parts of a split key that were applied.
fn parts_served(e: Error, key: &Key, served: &[usize]) -> Error {
    match (e, served) {
        (e, []) => e,
        (Error::Backend { backend, message }, served) => {
            let ranks: Vec<String> = served.iter().map(usize::to_string).collect();
            let message = format!("{message} (the part of key \"{key}\" on rank {} was served)", ranks.join(", rank "));
            Error::Backend { backend, message }
        }
        (e, _) => e,
    }
}

/// Reads `n` bytes off the front of `m`.
fn take<'m>(m: &mut &'m [u8], n: usize) -> Result<&'m [u8]> {
    if m.len() < n {
        return Err(Error::Internal("dist_async: a message is cut short".into()));
    }
    let (head, rest) = m.split_at(n);
    *m = rest;
    Ok(head)
}

fn u32_of(b: &[u8]) -> u32 {
    u32::from_le_bytes(b.try_into().unwrap_or_default())
}

/// A buffer per part, reused by every call that needs one (a fresh array per call would
/// cost an allocation and its page faults each time): an owner's for the parts of the
/// requests it cannot read in place (`init`s, misaligned pushes), which it serves one at
/// a time; a worker's for its own parts of split keys, which its calls on one key use
/// one at a time.
type Buffers = Mutex<HashMap<Key, NDArray>>;

/// `name`'s buffer in `buffers`, of `shape` and `dtype` (made, or remade on a change).
fn buffer(buffers: &Buffers, name: &Key, shape: &[usize], dtype: DType) -> Result<NDArray> {
    let mut b = buffers.lock();
    match b.get(name) {
        Some(a) if a.shape() == shape && a.dtype() == dtype => Ok(a.clone()),
        _ => {
            let a = NDArray::zeros_with(shape, dtype, Context::default())?;
            b.insert(name.clone(), a.clone());
            Ok(a)
        }
    }
}

/// What an owner does with a request, and its reply. A pushed array is read where it
/// is in `message` (lent to the store, and given back) when its bytes are aligned for
/// its dtype, else copied into the part's buffer.
fn serve(server: &KVStore, buffers: &Buffers, message: &mut Vec<u8>, limit: usize) -> Vec<u8> {
    let answer = (|| -> Result<Vec<u8>> {
        let (op, name, dtype, shape, start) = header(message)?;
        let copied = |message: &[u8]| -> Result<NDArray> {
            let a = buffer(buffers, &name, &shape, dtype)?;
            let mut w = a.write()?;
            let bytes = w.bytes_mut();
            if bytes.len() != message.len() - start {
                return Err(Error::Internal("dist_async: an array's bytes do not fit its shape".into()));
            }
            bytes.copy_from_slice(&message[start..]);
            w.finish()?;
            Ok(a)
        };
        match op {
            INIT => server.init(name.clone(), &copied(message)?).map(|_| vec![0]),
            PUSH => {
                let back = Arc::new(Mutex::new(Vec::new()));
                let lent = Lent { message: std::mem::take(message), start, back: Arc::clone(&back) };
                let lent = NDArray::from_foreign(&shape, dtype, Box::new(lent), true);
                let value = match lent {
                    Ok(v) => v,
                    // Not aligned (or not the shape's bytes): through the part's buffer.
                    Err(_) => {
                        *message = std::mem::take(&mut *back.lock());
                        copied(message)?
                    }
                };
                let pushed = server.push(name.clone(), &value, 0);
                drop(value);
                if message.is_empty() {
                    *message = std::mem::take(&mut *back.lock());
                }
                pushed.map(|_| vec![0])
            }
            PULL => with_slot(server, "pull", &name, |slot| {
                // The status byte first, as every answer; the bytes read where they are.
                let read = slot.value.read()?;
                let mut r = Vec::with_capacity(read.bytes().len() + 1);
                r.push(0);
                r.extend_from_slice(read.bytes());
                Ok(r)
            }),
            SNAPSHOT => with_slot(server, "save_checkpoint", &name, snapshot),
            _ => Err(Error::Internal(format!("dist_async: unknown request {op}"))),
        }
    })();
    match answer {
        // Every answer starts with its status byte, 0.
        Ok(r) if r.len() > limit => refusal(&too_big(r.len(), limit)),
        Ok(r) => r,
        Err(e) => refusal(&e),
    }
}

/// A reply that refuses a request with `e`: 1, the error's kind, its message.
fn refusal(e: &Error) -> Vec<u8> {
    let mut r = vec![1];
    let code = e.kind().code();
    r.extend_from_slice(&(code.len() as u32).to_le_bytes());
    r.extend_from_slice(code.as_bytes());
    r.extend_from_slice(e.to_string().as_bytes());
    r
}

/// The error of a message of `len` bytes, more than the transport's `limit`.
fn too_big(len: usize, limit: usize) -> Error {
    Error::Unsupported {
        what: format!("a dist_async message of {len} bytes"),
        hint: format!(
            "the transport carries at most {limit} bytes in one message (one MPI message's count): a key's part, \
             with its optimizer state for a checkpoint or a commit, must fit (a key split across more workers has \
             smaller parts)"
        ),
    }
}

/// `f` of `name`'s slot on the owner's share `server` (its value and state), read in
/// place under the key's lock (after the pushes applied before), for `op`.
fn with_slot<T>(server: &KVStore, op: &'static str, name: &Key, f: impl FnOnce(&Slot) -> Result<T>) -> Result<T> {
    let entry = server.store.found(op, name)?;
    let held = Held::new(op, &server.store, &[&entry])?;
    f(&held.read(op, &[&entry])?[0])
}

/// The next array's bytes of a snapshot (see [`PartOf::encode`]).
fn get_bytes<'m>(m: &mut &'m [u8]) -> Result<&'m [u8]> {
    let n = u64::from_le_bytes(take(m, 8)?.try_into().unwrap_or_default()) as usize;
    take(m, n)
}

/// A part's value and optimizer state on its owner (its `slot`), as its answer to a
/// gather ([`PartOf::encode`]).
fn snapshot(slot: &Slot) -> Result<Vec<u8>> {
    PartOf::read(slot, |part| Ok(part.encode()))
}

/// An updater on the owners' local stores: the user's, given each key as the user wrote
/// it (a part of a split key as its key).
struct PartUpdater(Arc<dyn Updater>);

impl Updater for PartUpdater {
    fn update(&self, key: &Key, index: usize, merged: &NDArray, stored: &NDArray) -> Result<()> {
        match key.as_str().split_once(PART) {
            Some((whole, _)) => self.0.update(&Key::from(whole), index, merged, stored),
            None => self.0.update(key, index, merged, stored),
        }
    }
}

impl Shards {
    /// Joins `transport` with a new channel, served by a new local store of this
    /// worker's parts.
    pub(crate) fn new(transport: Arc<dyn Remote>) -> Result<Self> {
        let bound = crate::settings::bigarray_bound()?;
        let server = Arc::new(KVStore::internal_local()?);
        let served = Arc::clone(&server);
        let buffers: Arc<Buffers> = Arc::new(Mutex::new(HashMap::new()));
        let limit = transport.max_message();
        let handler: Handler = Arc::new(move |_from: usize, m: &mut Vec<u8>| serve(&served, &buffers, m, limit));
        let channel = transport.serve(handler)?;
        // An exchange's message is its number, then the sender's bytes.
        let mailbox: Arc<Mailbox> = Arc::default();
        let posted = Arc::clone(&mailbox);
        let mail: Handler = Arc::new(move |from: usize, m: &mut Vec<u8>| {
            let Some(number) = m.get(..8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))) else {
                return vec![1];
            };
            let mut message = std::mem::take(m);
            message.drain(..8);
            posted.lock().insert((from, number), message);
            vec![0]
        });
        let mail = transport.serve(mail)?;
        let own = Mutex::new(HashMap::new());
        Ok(Shards { transport, channel, server, own, bound, mail, mailbox, exchanges: AtomicU64::new(0) })
    }

    /// Sends `bytes` to each worker of `to` as the next exchange's message (named `step`),
    /// and waits at a barrier: then every worker's messages of it have arrived. Its number.
    fn post(&self, step: &str, to: Vec<usize>, bytes: &[u8]) -> Result<u64> {
        let number = self.exchanges.fetch_add(1, Ordering::Relaxed);
        let message = || {
            // The number, the name's length and the name, then the bytes (with room for
            // the transport's framing).
            let mut m = Vec::with_capacity(8 + 4 + step.len() + bytes.len() + 16);
            m.extend_from_slice(&number.to_le_bytes());
            m.extend_from_slice(&(step.len() as u32).to_le_bytes());
            m.extend_from_slice(step.as_bytes());
            m.extend_from_slice(bytes);
            m
        };
        for batch in to.chunks(AT_ONCE) {
            let requests: Vec<(usize, Vec<u8>)> = batch.iter().map(|&r| (r, message())).collect();
            self.fits(&requests)?;
            let replies = self.transport.requests(self.mail, requests)?;
            if replies.iter().any(|r| r.first() != Some(&0)) {
                return Err(Error::Internal("dist_async: a worker could not take an exchange's message".into()));
            }
        }
        self.transport.barrier()?;
        Ok(number)
    }

    /// Whether each request fits in one message of the transport (with its framing).
    fn fits(&self, requests: &[(usize, Vec<u8>)]) -> Result<()> {
        let limit = self.transport.max_message();
        match requests.iter().map(|(_, r)| r.len() + FRAMING).find(|&n| n > limit) {
            Some(n) => Err(too_big(n, limit)),
            None => Ok(()),
        }
    }

    /// Worker `from`'s message of exchange `number`, which must be named `step`.
    fn take(&self, step: &str, from: usize, number: u64) -> Result<Vec<u8>> {
        let out_of_step = |theirs: &str| {
            Error::invalid_argument(format!(
                "dist_async: rank {} is at {step:?} where rank {from} is at {theirs}: the ranks' calls differ (every \
                 rank must make the same collective calls, commits and barriers in the same order, with the same \
                 job name)",
                self.rank()
            ))
        };
        let mut message = self.mailbox.lock().remove(&(from, number)).ok_or_else(|| out_of_step("another call"))?;
        let name_len = message.get(..4).map_or(usize::MAX, |b| u32::from_le_bytes(b.try_into().expect("4")) as usize);
        let name = message.get(4..4usize.saturating_add(name_len)).ok_or_else(|| out_of_step("another call"))?;
        if name != step.as_bytes() {
            return Err(out_of_step(&format!("{:?}", String::from_utf8_lossy(name))));
        }
        message.drain(..4 + name_len);
        Ok(message)
    }

    /// The parts of `key`, of `size` elements.
    fn parts(&self, key: &Key, size: usize) -> Vec<Part> {
        let workers = self.size().max(1);
        let home = crc32fast::hash(key.as_str().as_bytes()) as usize % workers;
        if size < self.bound || workers == 1 {
            return vec![Part { owner: home, start: 0, len: size, name: key.clone() }];
        }
        (0..workers)
            .map(|p| {
                let (start, end) = (size * p / workers, size * (p + 1) / workers);
                let name = Key::from(format!("{key}{PART}{p}"));
                Part { owner: (home + p) % workers, start, len: end - start, name }
            })
            .collect()
    }

    /// Sends each `(owner, request)` (all in flight at once where the transport can)
    /// and returns the replies' bytes, or the first owner's error.
    fn call(&self, key: &Key, requests: Vec<(usize, Vec<u8>)>, meanwhile: &mut dyn FnMut()) -> Result<Vec<Vec<u8>>> {
        self.fits(&requests)?;
        let owners: Vec<usize> = requests.iter().map(|(o, _)| *o).collect();
        let replies = self.transport.requests_while(self.channel, requests, meanwhile)?;
        // Every owner served its request: the first refusal is the call's error, and
        // the owners that did not refuse are named (a split key's parts they applied).
        let (mut first, mut served) = (None, Vec::new());
        for (owner, reply) in owners.iter().zip(&replies) {
            let mut r = reply.as_slice();
            if take(&mut r, 1)?[0] == 0 {
                served.push(*owner);
            } else if first.is_none() {
                let n = u32_of(take(&mut r, 4)?) as usize;
                let code = String::from_utf8_lossy(take(&mut r, n)?).into_owned();
                first = Some(refused(*owner, key, &code, &String::from_utf8_lossy(r)));
            }
        }
        match first {
            Some(e) => Err(parts_served(e, key, &served)),
            // Each reply without its status byte is read from index 1 on.
            None => Ok(replies),
        }
    }

    /// Sends `value`'s parts to their owners with `op` (INIT or PUSH). A part this
    /// worker owns goes straight to its share (no message, and the whole key's value
    /// itself where the key is not split), while the others' requests are in flight.
    fn send(&self, op: u8, key: &Key, value: &NDArray) -> Result<()> {
        let parts = self.parts(key, value.size());
        let whole = |part: &Part| part.len == value.size();
        let read = value.read()?;
        let bytes = read.bytes();
        let esize = value.dtype().size();
        let mut requests = Vec::with_capacity(parts.len());
        let mut own = None;
        for part in &parts {
            let range = part.start * esize..(part.start + part.len) * esize;
            if part.owner == self.rank() {
                own = Some(match whole(part) {
                    true => (part, value.clone()),
                    false => (part, self.own_buffer(part, value.dtype(), &bytes[range])?),
                });
                continue;
            }
            let shape = match whole(part) {
                true => value.shape().to_vec(),
                false => vec![part.len],
            };
            requests.push((part.owner, request(op, &part.name, value.dtype(), &shape, &bytes[range])));
        }
        drop(read);
        let own = own.map(|(part, array)| {
            move || {
                super::locks::nested_call(|| match op {
                    INIT => self.server.init(part.name.clone(), &array),
                    _ => self.server.push(part.name.clone(), &array, 0),
                })
            }
        });
        self.call_with(key, requests, own).map(drop)
    }

    /// A buffer of this worker's own part `part` of a split key, holding `bytes`.
    fn own_buffer(&self, part: &Part, dtype: DType, bytes: &[u8]) -> Result<NDArray> {
        let a = buffer(&self.own, &part.name, &[part.len], dtype)?;
        let mut w = a.overwrite()?;
        w.bytes_mut().copy_from_slice(bytes);
        w.finish()?;
        Ok(a)
    }

    /// [`Shards::call`] of `requests`, with `own` (this worker's part, served by its own
    /// share) run meanwhile; the error of `own` is reported as an owner's refusal.
    fn call_with(
        &self,
        key: &Key,
        requests: Vec<(usize, Vec<u8>)>,
        own: Option<impl FnOnce() -> Result<()>>,
    ) -> Result<Vec<Vec<u8>>> {
        let refused = |e: Error| refused(self.rank(), key, e.kind().code(), &e);
        // (Before any part is applied: a part too big to send refuses the whole call.)
        self.fits(&requests)?;
        let Some(own) = own else { return self.call(key, requests, &mut || {}) };
        let owners: Vec<usize> = requests.iter().map(|(o, _)| *o).collect();
        if requests.is_empty() {
            return own().map_err(refused).map(|()| Vec::new());
        }
        // This worker's own part is applied here while the others' travel.
        let (mut own, mut mine) = (Some(own), Ok(()));
        let replies = self.call(key, requests, &mut || {
            if let Some(f) = own.take() {
                mine = f();
            }
        });
        // (A transport that failed, or never ran `meanwhile`.)
        if let Some(f) = own.take() {
            mine = f();
        }
        match (mine, replies) {
            (Ok(()), Err(e)) => Err(parts_served(e, key, &[self.rank()])),
            (Err(e), Ok(_)) => Err(parts_served(refused(e), key, &owners)),
            // Both refused: both are said (the other owners' refusal names the parts
            // that were served all the same).
            (Err(e), Err(others)) => Err(match refused(e) {
                Error::Backend { backend, message } => {
                    Error::Backend { backend, message: format!("{message}; {others}") }
                }
                e => e,
            }),
            (Ok(()), replies) => replies,
        }
    }
}

/// A `dist_async` store's owners are its shards.
impl Owners for Shards {
    fn rank(&self) -> usize {
        self.transport.rank()
    }

    fn size(&self) -> usize {
        self.transport.size()
    }

    /// Initialises `key` on its owners with `value` (one worker does, rank 0).
    fn init(&self, key: &Key, value: &NDArray) -> Result<()> {
        self.send(INIT, key, value)
    }

    /// Pushes `sum` (this worker's sum of its values of `key`) to the owners.
    fn push(&self, key: &Key, sum: &NDArray) -> Result<()> {
        self.send(PUSH, key, sum)
    }

    /// Writes the owners' value of `key` into `into` (of the key's shape and dtype).
    fn pull(&self, key: &Key, into: &NDArray) -> Result<()> {
        let esize = into.dtype().size();
        let all = self.parts(key, into.size());
        // This worker's own part comes from its share: where the key is not split,
        // straight into `into`; else through the part's buffer.
        let (own, parts): (Vec<Part>, Vec<Part>) = all.into_iter().partition(|p| p.owner == self.rank());
        let own = own.into_iter().next();
        let own_buffer = match &own {
            Some(part) if part.len != into.size() => Some(buffer(&self.own, &part.name, &[part.len], into.dtype())?),
            _ => None,
        };
        let requests: Vec<(usize, Vec<u8>)> =
            parts.iter().map(|p| (p.owner, request(PULL, &p.name, into.dtype(), &[], &[]))).collect();
        let pull_own = own.as_ref().map(|part| {
            || super::locks::nested_call(|| self.server.pull(part.name.clone(), own_buffer.as_ref().unwrap_or(into), 0))
        });
        let got = self.call_with(key, requests, pull_own)?;
        if parts.is_empty() && own_buffer.is_none() {
            return Ok(());
        }
        for (part, reply) in parts.iter().zip(&got) {
            let bytes = &reply[1..];
            if bytes.len() != part.len * esize {
                return Err(Error::Internal(format!(
                    "dist_async: rank {} sent {} bytes of key \"{key}\", not {}",
                    part.owner,
                    bytes.len(),
                    part.len * esize
                )));
            }
        }
        let mut w = into.overwrite()?;
        let out = w.bytes_mut();
        for (part, reply) in parts.iter().zip(&got) {
            out[part.start * esize..(part.start + part.len) * esize].copy_from_slice(&reply[1..]);
        }
        if let (Some(part), Some(b)) = (&own, &own_buffer) {
            out[part.start * esize..(part.start + part.len) * esize].copy_from_slice(b.read()?.bytes());
        }
        w.finish()
    }

    /// Waits until every worker has called it (answering requests meanwhile).
    fn barrier(&self) -> Result<()> {
        self.transport.barrier()
    }

    /// Every worker's `mine` for the exchange named `step`, in rank order: a collective
    /// (every worker calls it at the same point) by requests, for a `dist_async` store's
    /// commits (the `kvstore-commit` crate). Each worker sends its bytes to every other, then
    /// they meet at a barrier; a worker whose exchange there had another name (its calls
    /// are not the others') is an error.
    fn exchange(&self, step: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let (me, n) = (self.rank(), self.size());
        let number = self.post(step, (0..n).filter(|&r| r != me).collect(), mine)?;
        (0..n).map(|r| if r == me { Ok(mine.to_vec()) } else { self.take(step, r, number) }).collect()
    }

    /// Worker `root`'s bytes on every worker (`mine`: the root's; the others' is not
    /// read): a collective, as [`Owners::exchange`]. They go in pieces of at most
    /// [`PIECE`] bytes (less where the transport's messages are smaller), after their
    /// length.
    fn broadcast(&self, step: &str, mine: Vec<u8>, root: usize) -> Result<Vec<u8>> {
        let (me, n) = (self.rank(), self.size());
        let to = || if me == root { (0..n).filter(|&r| r != me).collect() } else { Vec::new() };
        let number = self.post(step, to(), &(mine.len() as u64).to_le_bytes())?;
        let len = match me == root {
            true => mine.len(),
            false => {
                let len = self.take(step, root, number)?;
                let len = len.get(..8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
                let len =
                    len.ok_or_else(|| Error::Internal("dist_async: a broadcast's length is not 8 bytes".into()))?;
                usize::try_from(len).map_err(|_| Error::Internal(format!("dist_async: a broadcast of {len} bytes")))?
            }
        };
        let mut got = Vec::new();
        // (Room for the exchange's number and name, and the transport's framing.)
        let piece_len = PIECE.min(self.transport.max_message().saturating_sub(FRAMING + 12 + step.len())).max(1);
        for at in (0..len).step_by(piece_len) {
            let piece = mine.get(at..len.min(at + piece_len)).unwrap_or_default();
            let number = self.post(step, to(), piece)?;
            if me != root {
                got.extend_from_slice(&self.take(step, root, number)?);
            }
        }
        if me == root { Ok(mine) } else { Ok(got) }
    }

    /// This worker's share: the local store of the parts it owns.
    fn share(&self) -> &Store {
        &self.server.store
    }

    /// Installs `optimizer` on this worker's share.
    fn set_optimizer(&self, optimizer: Optimizer) -> Result<()> {
        self.server.set_optimizer(optimizer)
    }

    /// Installs `updater` on this worker's share (it gets each key as the user wrote it).
    fn set_updater(&self, updater: Arc<dyn Updater>) -> Result<()> {
        self.server.set_updater(PartUpdater(updater))
    }

    fn clear_updater(&self) -> Result<()> {
        self.server.clear_updater()
    }

    fn optimizer_name(&self) -> Option<&'static str> {
        self.server.optimizer_name()
    }

    /// This worker's share's optimizer state (its store-wide counters: the updates the
    /// share applied, the schedule's progress, the rule's shared values) as JSON bytes,
    /// for its commits' record; empty without an optimizer.
    fn optimizer_state(&self) -> Vec<u8> {
        match &*self.server.store.merger.read() {
            Merger::Optimizer(rt) => crate::optimizer::states::runtime_json(rt).to_string().into_bytes(),
            _ => Vec::new(),
        }
    }

    /// Restores this worker's share's optimizer state from [`Owners::optimizer_state`]'s
    /// bytes, onto the optimizer the share has (a commit's, just installed).
    fn restore_optimizer_state(&self, context: &str, bytes: &[u8]) -> Result<()> {
        let bad = |why: String| Error::Io {
            context: context.to_string(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, format!("its optimizer state: {why}")),
        };
        let json: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        let saved = crate::optimizer::states::runtime_from_json(&json, &bad)?.snapshot();
        if let Merger::Optimizer(rt) = &*self.server.store.merger.read() {
            rt.check_snapshot(&saved, context)?;
            rt.restore(saved);
        }
        Ok(())
    }

    /// The whole store as its keys' owners hold it, in a local store: every key's value
    /// and optimizer state, gathered from their owners, with the optimizer. (The caller
    /// makes sure no push runs meanwhile.)
    fn gathered(&self, entries: &[Arc<Entry>], kept: Option<KVStore>) -> Result<KVStore> {
        let copy = KVStore::internal_local()?;
        // The gathered arrays become the copy's (no copy of them).
        let add = |e: &Arc<Entry>, g: Gathered| {
            let mut slot = Slot::new(g.value, 0);
            slot.opt = g.state;
            // A row-sparse key of a loaded file stays row-sparse in the next one
            // (this store has no row-sparse calls, but others that load it do). (Read
            // recursively: a commit holds the keys already.)
            slot.row_sparse = e.value.read_recursive().row_sparse;
            let mut table = copy.store.table.write();
            slot.order = table.take_order();
            copy.store.add_entry(&mut table, e.key.clone(), slot);
        };
        // Each key's parts are put together while the next key's are on their way (its
        // owners copying them out meanwhile).
        let mut waiting: Option<(&Arc<Entry>, Asked)> = None;
        for e in entries {
            // The kept copy's arrays of the key, written over (their memory in place).
            let reused = kept.as_ref().and_then(|k| k.store.find(&e.key)).map(|k| {
                let slot = k.value.read();
                let state = slot.opt.as_ref().map(|st| KeyState {
                    count: st.count,
                    states: st.states.clone(),
                    master: st.master.clone(),
                });
                Gathered { value: slot.value.clone(), state }
            });
            let mut previous = waiting.take();
            let mut filled = Ok(());
            let asked = self.ask(&e.key, e.shape(), e.dtype, reused, &mut || {
                if let Some((e, asked)) = previous.take() {
                    filled = self.fill(&e.key, e.shape(), e.dtype, asked).map(|g| add(e, g));
                }
            });
            filled?;
            // (A transport that did not run `meanwhile`, or a call refused before it.)
            if let Some((e, asked)) = previous {
                add(e, self.fill(&e.key, e.shape(), e.dtype, asked)?);
            }
            waiting = Some((e, asked?));
        }
        if let Some((e, asked)) = waiting {
            add(e, self.fill(&e.key, e.shape(), e.dtype, asked)?);
        }
        *copy.store.merger.write() = self.server.store.merger.read().clone();
        Ok(copy)
    }

    /// Puts this worker's parts of `key` (its whole `value` and `state`, as loaded) into
    /// its share: their names there.
    fn restore_key(&self, key: &Key, value: &NDArray, state: Option<&KeyState>) -> Result<Vec<Key>> {
        let me = self.rank();
        let mut names = Vec::new();
        let esize = value.dtype().size();
        let read = value.read()?;
        for part in self.parts(key, value.size()).into_iter().filter(|p| p.owner == me) {
            let whole = part.len == value.size();
            let shape = if whole { value.shape().to_vec() } else { vec![part.len] };
            let slice = |a: &NDArray, size: usize| -> Result<NDArray> {
                let out = NDArray::zeros_with(&shape, a.dtype(), Context::default())?;
                let bytes = a.read()?;
                out.write()?
                    .bytes_mut()
                    .copy_from_slice(&bytes.bytes()[part.start * size..(part.start + part.len) * size]);
                Ok(out)
            };
            let mine = NDArray::zeros_with(&shape, value.dtype(), Context::default())?;
            mine.write()?
                .bytes_mut()
                .copy_from_slice(&read.bytes()[part.start * esize..(part.start + part.len) * esize]);
            let state = state
                .map(|st| -> Result<KeyState> {
                    Ok(KeyState {
                        count: st.count,
                        states: st.states.iter().map(|a| slice(a, a.dtype().size())).collect::<Result<_>>()?,
                        master: st.master.as_ref().map(|m| slice(m, 4)).transpose()?,
                    })
                })
                .transpose()?;
            let store = &self.server.store;
            let existing = store.find(&part.name);
            let entry = match existing {
                Some(e) => e,
                None => {
                    self.server.init(part.name.clone(), &mine)?;
                    store
                        .find(&part.name)
                        .ok_or_else(|| Error::Internal(format!("dist_async: part \"{}\" vanished", part.name)))?
                }
            };
            let held = Held::new("load_checkpoint", store, &[&entry])?;
            let mut guards = held.write("load_checkpoint", &[&entry])?;
            let slot: &mut Slot = &mut guards[0];
            if slot.value.shape() != mine.shape() || slot.value.dtype() != mine.dtype() {
                return Err(Error::ShapeMismatch {
                    context: format!("load_checkpoint: part {} of key \"{key}\"", part.name),
                    key: Some(key.clone()),
                    expected: slot.value.shape().to_vec(),
                    got: mine.shape().to_vec(),
                });
            }
            slot.value.copy_from(&mine)?;
            slot.opt = state;
            slot.merge = None;
            slot.spare = None;
            names.push(part.name);
        }
        Ok(names)
    }
}

/// One key of a checkpoint as the owners hold it, put together: its value and, when
/// its owners have one, its optimizer state.
struct Gathered {
    value: NDArray,
    state: Option<KeyState>,
}

/// A key's parts asked of their owners ([`Shards::ask`]): the replies, in the order of
/// its parts that others own, and the arrays of an earlier gather to fill.
struct Asked {
    parts: Vec<Part>,
    theirs: Vec<Vec<u8>>,
    kept: Option<Gathered>,
}

/// One part of a key as its owner holds it: the value's bytes and its optimizer state's.
struct PartOf<'a> {
    value: &'a [u8],
    state: Option<PartState<'a>>,
}

/// A part's optimizer state: the update count, the state arrays' bytes and the master
/// copy's.
type PartState<'a> = (u64, Vec<&'a [u8]>, Option<&'a [u8]>);

impl<'a> PartOf<'a> {
    /// The part as its owner answers (after the status byte, 0): each array's bytes after
    /// their length; the value, then (if it has one) 1, the update count, the number of
    /// state arrays, the state arrays and the master copy (1 and its bytes, or 0); else 0.
    /// Sized before it is written: grown as it went, the buffer of a part of megabytes was
    /// copied at each doubling, into memory that faulted page by page.
    fn encode(&self) -> Vec<u8> {
        let sized = |b: &[u8]| 8 + b.len();
        let state = self.state.as_ref().map_or(0, |(_, states, master)| {
            8 + 4 + states.iter().map(|b| sized(b)).sum::<usize>() + 1 + master.map_or(0, sized)
        });
        let mut out = Vec::with_capacity(1 + sized(self.value) + 1 + state);
        let put = |out: &mut Vec<u8>, b: &[u8]| {
            out.extend_from_slice(&(b.len() as u64).to_le_bytes());
            out.extend_from_slice(b);
        };
        out.push(0);
        put(&mut out, self.value);
        match &self.state {
            None => out.push(0),
            Some((count, states, master)) => {
                out.push(1);
                out.extend_from_slice(&count.to_le_bytes());
                out.extend_from_slice(&(states.len() as u32).to_le_bytes());
                for b in states {
                    put(&mut out, b);
                }
                match master {
                    None => out.push(0),
                    Some(b) => {
                        out.push(1);
                        put(&mut out, b);
                    }
                }
            }
        }
        out
    }

    /// A part from its owner's reply ([`PartOf::encode`]'s bytes, after the status byte).
    fn parse(mut m: &'a [u8]) -> Result<Self> {
        let value = get_bytes(&mut m)?;
        if take(&mut m, 1)?[0] == 0 {
            return Ok(PartOf { value, state: None });
        }
        let count = u64::from_le_bytes(take(&mut m, 8)?.try_into().unwrap_or_default());
        let n = u32_of(take(&mut m, 4)?) as usize;
        let states = (0..n).map(|_| get_bytes(&mut m)).collect::<Result<_>>()?;
        let master = match take(&mut m, 1)?[0] {
            1 => Some(get_bytes(&mut m)?),
            _ => None,
        };
        Ok(PartOf { value, state: Some((count, states, master)) })
    }

    /// This worker's own part, read from its slot (no copy of it first), handed to `f`.
    fn read<T>(slot: &Slot, f: impl FnOnce(&PartOf<'_>) -> Result<T>) -> Result<T> {
        let value = slot.value.read()?;
        let Some(st) = &slot.opt else { return f(&PartOf { value: value.bytes(), state: None }) };
        let states = st.states.iter().map(NDArray::read).collect::<Result<Vec<_>>>()?;
        let master = st.master.as_ref().map(NDArray::read).transpose()?;
        f(&PartOf {
            value: value.bytes(),
            state: Some((st.count, states.iter().map(|s| s.bytes()).collect(), master.as_ref().map(|m| m.bytes()))),
        })
    }
}

impl Shards {
    /// Asks `key`'s owners for their parts (its value and optimizer state), running
    /// `meanwhile` while the requests are on their way; [`Shards::fill`] puts the replies
    /// together, into `kept`'s arrays where they fit (the key as an earlier gather made
    /// it).
    fn ask(
        &self,
        key: &Key,
        shape: &[usize],
        dtype: DType,
        kept: Option<Gathered>,
        meanwhile: &mut dyn FnMut(),
    ) -> Result<Asked> {
        let parts = self.parts(key, shape.iter().product());
        // The others' parts requested; this worker's own read from its share directly.
        let me = self.rank();
        let requests: Vec<(usize, Vec<u8>)> = parts
            .iter()
            .filter(|p| p.owner != me)
            .map(|p| (p.owner, request(SNAPSHOT, &p.name, dtype, &[], &[])))
            .collect();
        let theirs = self.call(key, requests, meanwhile)?;
        Ok(Asked { parts, theirs, kept })
    }

    /// `key`'s value and optimizer state put together from its owners' parts (each in
    /// its range of the key's shape; a split key's update count is its parts' largest).
    fn fill(&self, key: &Key, shape: &[usize], dtype: DType, asked: Asked) -> Result<Gathered> {
        let Asked { parts, theirs, kept } = asked;
        let fits = |a: &NDArray, dtype: DType| a.shape() == shape && a.dtype() == dtype;
        let (value, mut spare) = match kept {
            Some(k) if fits(&k.value, dtype) => (k.value, k.state),
            _ => (NDArray::zeros_with(shape, dtype, Context::default())?, None),
        };
        let me = self.rank();
        let mut theirs = theirs.into_iter();
        let state_dtype = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
        let mut state: Option<KeyState> = None;
        let bad = || Error::Internal(format!("dist_async: the owners' states of key \"{key}\" do not fit together"));
        // A part's bytes into their range, which must hold exactly as many.
        let put = |to: Option<&mut [u8]>, from: &[u8]| match to {
            Some(to) if to.len() == from.len() => {
                to.copy_from_slice(from);
                Ok(())
            }
            _ => Err(bad()),
        };
        // The parts whose owner has no state, or no master copy: their ranges of those
        // arrays are zeros (and with no master copy in any part, the key has none).
        let (mut stateless, mut masterless, mut with_master) = (Vec::new(), Vec::new(), false);
        {
            let mut w = value.overwrite()?;
            let out = w.bytes_mut();
            let esize = dtype.size();
            for part in &parts {
                let range = part.start * esize..(part.start + part.len) * esize;
                let mut fill = |part_of: &PartOf<'_>| -> Result<()> {
                    put(out.get_mut(range.clone()), part_of.value)?;
                    let Some((count, states, master)) = &part_of.state else {
                        stateless.push(part.start..part.start + part.len);
                        return Ok(());
                    };
                    let st = match &mut state {
                        Some(st) => st,
                        None => state.insert(match spare.take() {
                            // The kept arrays, when they are as many, of the same kind.
                            Some(k)
                                if k.states.len() == states.len() && k.states.iter().all(|a| fits(a, state_dtype)) =>
                            {
                                KeyState {
                                    count: 0,
                                    states: k.states,
                                    master: k.master.filter(|m| fits(m, DType::F32)),
                                }
                            }
                            _ => KeyState {
                                count: 0,
                                states: (0..states.len())
                                    .map(|_| NDArray::zeros_with(shape, state_dtype, Context::default()))
                                    .collect::<Result<_>>()?,
                                master: None,
                            },
                        }),
                    };
                    if st.states.len() != states.len() {
                        return Err(bad());
                    }
                    st.count = st.count.max(*count);
                    let ssize = state_dtype.size();
                    let srange = part.start * ssize..(part.start + part.len) * ssize;
                    for (a, bytes) in st.states.iter().zip(states) {
                        put(a.write()?.bytes_mut().get_mut(srange.clone()), bytes)?;
                    }
                    let Some(bytes) = master else {
                        masterless.push(part.start..part.start + part.len);
                        return Ok(());
                    };
                    with_master = true;
                    let master = match &mut st.master {
                        Some(a) => a,
                        None => st.master.insert(NDArray::zeros_with(shape, DType::F32, Context::default())?),
                    };
                    let frange = part.start * 4..(part.start + part.len) * 4;
                    put(master.write()?.bytes_mut().get_mut(frange), bytes)?;
                    Ok(())
                };
                if part.owner == me {
                    with_slot(&self.server, "save_checkpoint", &part.name, |slot| PartOf::read(slot, &mut fill))?;
                } else {
                    let reply =
                        theirs.next().ok_or_else(|| Error::Internal(format!("dist_async: no reply for \"{key}\"")))?;
                    fill(&PartOf::parse(&reply[1..])?)?;
                }
            }
            w.finish()?;
        }
        // Kept arrays hold an earlier gather's values: the ranges no part wrote are zeroed,
        // as new arrays are.
        if let Some(st) = &mut state {
            if !with_master {
                st.master = None;
            }
            let zero = |a: &NDArray, range: &std::ops::Range<usize>| -> Result<()> {
                let size = a.dtype().size();
                a.write()?.bytes_mut()[range.start * size..range.end * size].fill(0);
                Ok(())
            };
            for range in &stateless {
                for a in st.states.iter().chain(&st.master) {
                    zero(a, range)?;
                }
            }
            if let Some(master) = &st.master {
                for range in &masterless {
                    zero(master, range)?;
                }
            }
        }
        Ok(Gathered { value, state })
    }
}

impl super::data::Store {
    /// Puts a whole store read from a file (`file`, checked whole by
    /// [`checkpoint::read`](super::checkpoint::read)) into this one: the file's optimizer
    /// on this worker's share (or assignment; a file saved with a custom updater keeps
    /// the share's), then one key at a time, copied out of the file, the parts this
    /// worker owns put in its share and this worker's copy of the value kept, before the
    /// next key is copied out (a worker holds the file and one key, never a second copy
    /// of the store); keys this store lacks are made.
    pub(super) fn install_loaded(&self, remote: &dyn Owners, file: super::checkpoint::Layout<'_>) -> Result<()> {
        let (merger, keys) = file.split();
        let replaced = merger.is_some();
        if let Some(merger) = merger {
            *remote.share().merger.write() = merger;
        }
        let mut installed = std::collections::HashSet::new();
        for k in &keys {
            let super::checkpoint::SavedKey { key, value, state, row_sparse } = k.arrays()?;
            installed.extend(remote.restore_key(&key, &value, state.as_ref())?);
            drop(state);
            // This worker's copy of the key (made when new).
            let mut table = self.table.write();
            match self.entry(&table, &key) {
                // The key's storage type is the file's: `stype` says it, and the
                // store's next checkpoint keeps it.
                Some(mine) => {
                    let mut slot = mine.value.write();
                    let got = (value.shape(), value.dtype());
                    super::plan::check_like(|| "load_checkpoint".to_string(), &key, mine.like(), got)?;
                    slot.row_sparse = row_sparse;
                }
                None => {
                    let order = table.take_order();
                    let mut slot = Slot::new(value, order);
                    slot.row_sparse = row_sparse;
                    self.add_entry(&mut table, key, slot);
                }
            }
        }
        // A new optimizer (or assignment): the share's parts that the file lacks keep
        // their values, and their optimizer state starts afresh, as in every store kind.
        if replaced {
            for entry in remote.share().entries().iter().filter(|e| !installed.contains(&e.key)) {
                entry.value.write().opt = None;
            }
        }
        Ok(())
    }
}

/// This worker's keys held (read) for a gather of the whole store from the owners (a
/// checkpoint's, a commit's), taken before the workers meet and kept until it ends: a
/// call of another thread, which holds its keys while the owners serve it, then ends
/// before the gather or begins after it. (The gather reads them recursively.)
pub(super) fn held_for_gather(entries: &[Arc<super::data::Entry>]) -> Vec<parking_lot::RwLockReadGuard<'_, Slot>> {
    entries.iter().map(|e| e.value.read()).collect()
}

impl super::data::Store {
    /// `save_checkpoint` of a `dist_async` store: (every worker's calls done) rank 0
    /// gathers every key's value and state from their owners and writes the file (the
    /// format of every store kind's checkpoints: any kind, any number of workers, loads
    /// it), then every worker returns.
    pub(super) fn save_checkpoint_async(&self, remote: &dyn Owners, path: &std::path::Path) -> Result<()> {
        let entries = self.entries();
        let _held = held_for_gather(&entries);
        remote.barrier()?;
        let saved = match remote.rank() {
            0 => remote.gathered(&self.entries(), None).and_then(|copy| copy.save_checkpoint(path)),
            _ => Ok(()),
        };
        let met = remote.barrier();
        saved?;
        met
    }

    /// `load_checkpoint` of a `dist_async` store: every worker reads the file (a
    /// checkpoint of any store kind), installs its optimizer on its share and puts the
    /// parts it owns there; keys the store lacks are made; then every worker waits for
    /// the others.
    pub(super) fn load_checkpoint_async(&self, remote: &dyn Owners, path: &std::path::Path) -> Result<()> {
        let context = format!("load_checkpoint from {}", crate::optimizer::states::shown(path));
        let bytes = crate::optimizer::states::read_file(path, &context);
        let loaded = bytes.and_then(|bytes| {
            let file = super::checkpoint::read(&bytes, &context)?;
            self.install_loaded(remote, file)
        });
        let met = remote.barrier();
        loaded?;
        met
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share() -> (KVStore, Buffers) {
        let server = KVStore::create("local").unwrap();
        server.init("k", &NDArray::from_vec(&[4], vec![1.0f32; 4]).unwrap()).unwrap();
        (server, Mutex::new(HashMap::new()))
    }

    /// A pushed array is read where it is in the request, and the request's buffer
    /// comes back to the transport (the same allocation, for the next request).
    #[test]
    fn a_push_reads_the_request_in_place_and_gives_it_back() {
        let (server, buffers) = share();
        let bytes: Vec<u8> = [2.0f32, 3.0, 4.0, 5.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut message = request(PUSH, &Key::from("k"), DType::F32, &[4], &bytes);
        let (ptr, len) = (message.as_ptr(), message.len());
        assert_eq!(serve(&server, &buffers, &mut message, usize::MAX), vec![0]);
        assert_eq!((message.as_ptr(), message.len()), (ptr, len), "the request's buffer comes back");
        assert!(buffers.lock().is_empty(), "no copy through a part buffer");
        assert_eq!(server.pull_new("k", 0).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0, 5.0]);
        // A pull's reply reads the value in place too: status byte, then the bytes.
        let mut pull = request(PULL, &Key::from("k"), DType::F32, &[], &[]);
        assert_eq!(serve(&server, &buffers, &mut pull, usize::MAX), [&[0u8][..], &bytes].concat());
    }

    /// A push whose bytes do not fit its shape is refused, the key keeps its value,
    /// and the request's buffer comes back.
    #[test]
    fn a_push_of_the_wrong_length_is_refused_and_changes_nothing() {
        let (server, buffers) = share();
        let mut message = request(PUSH, &Key::from("k"), DType::F32, &[4], &[0u8; 12]);
        let len = message.len();
        let reply = serve(&server, &buffers, &mut message, usize::MAX);
        assert_eq!(reply[0], 1, "an error reply");
        assert!(String::from_utf8_lossy(&reply).contains("do not fit its shape"));
        assert_eq!(message.len(), len);
        assert_eq!(server.pull_new("k", 0).unwrap().to_vec::<f32>().unwrap(), vec![1.0; 4]);
    }
}
