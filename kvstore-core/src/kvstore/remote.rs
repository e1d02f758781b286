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

use std::sync::Arc;

use super::KVStore;
use crate::context::Context;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::key::Key;
use crate::ndarray::NDArray;
use crate::optimizer::Optimizer;
use crate::remote::{Handler, Remote};
use crate::updater::Updater;

/// MXNet's variable for the size (in elements) from which a key is split across
/// owners.
pub(crate) const BOUND_VAR: &str = "MXNET_KVSTORE_BIGARRAY_BOUND";
const DEFAULT_BOUND: usize = 1_000_000;

const INIT: u8 = 1;
const PUSH: u8 = 2;
const PULL: u8 = 3;

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
    bound: usize,
}

/// The split bound from the environment (unset or empty: MXNet's default).
fn bound_from_env() -> Result<usize> {
    match std::env::var(BOUND_VAR) {
        Ok(v) if !v.trim().is_empty() => v.trim().parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| {
            Error::invalid_argument(format!("{BOUND_VAR}={v:?}: expected a number of elements above 0"))
        }),
        _ => Ok(DEFAULT_BOUND),
    }
}

fn dtype_code(d: DType) -> u8 {
    DType::ALL.iter().position(|&x| x == d).unwrap_or(0) as u8
}

/// A request: `op`, the part's `name`, and an array's dtype, shape and bytes.
fn request(op: u8, name: &Key, dtype: DType, shape: &[usize], bytes: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(16 + name.as_str().len() + 8 * shape.len() + bytes.len());
    m.push(op);
    m.extend_from_slice(&(name.as_str().len() as u32).to_le_bytes());
    m.extend_from_slice(name.as_str().as_bytes());
    m.push(dtype_code(dtype));
    m.push(shape.len() as u8);
    for &d in shape {
        m.extend_from_slice(&(d as u64).to_le_bytes());
    }
    m.extend_from_slice(bytes);
    m
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

/// What an owner does with a request, and its reply.
fn serve(server: &KVStore, mut m: &[u8]) -> Vec<u8> {
    let answer = (|| -> Result<Vec<u8>> {
        let op = take(&mut m, 1)?[0];
        let n = u32_of(take(&mut m, 4)?) as usize;
        let name =
            std::str::from_utf8(take(&mut m, n)?).map_err(|_| Error::Internal("dist_async: a bad name".into()))?;
        let name = Key::from(name);
        let dtype = *DType::ALL
            .get(usize::from(take(&mut m, 1)?[0]))
            .ok_or_else(|| Error::Internal("dist_async: a bad dtype".into()))?;
        let ndim = usize::from(take(&mut m, 1)?[0]);
        let shape = (0..ndim)
            .map(|_| take(&mut m, 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()) as usize))
            .collect::<Result<Vec<_>>>()?;
        let array = || -> Result<NDArray> {
            let a = NDArray::zeros_with(&shape, dtype, Context::default())?;
            let mut w = a.write()?;
            let bytes = w.bytes_mut();
            if bytes.len() != m.len() {
                return Err(Error::Internal("dist_async: an array's bytes do not fit its shape".into()));
            }
            bytes.copy_from_slice(m);
            w.finish()?;
            Ok(a)
        };
        match op {
            INIT => server.init(name, &array()?).map(|_| Vec::new()),
            PUSH => server.push(name, &array()?, 0).map(|_| Vec::new()),
            PULL => {
                let value = server.pull_new(name, 0)?;
                let bytes = value.read()?.bytes().to_vec();
                Ok(bytes)
            }
            _ => Err(Error::Internal(format!("dist_async: unknown request {op}"))),
        }
    })();
    match answer {
        Ok(bytes) => {
            let mut r = Vec::with_capacity(bytes.len() + 1);
            r.push(0);
            r.extend_from_slice(&bytes);
            r
        }
        Err(e) => {
            let mut r = vec![1];
            let code = e.kind().code();
            r.extend_from_slice(&(code.len() as u32).to_le_bytes());
            r.extend_from_slice(code.as_bytes());
            r.extend_from_slice(e.to_string().as_bytes());
            r
        }
    }
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
        let bound = bound_from_env()?;
        let server = Arc::new(KVStore::create("local")?);
        let served = Arc::clone(&server);
        let handler: Handler = Arc::new(move |_from: usize, m: &[u8]| serve(&served, m));
        let channel = transport.serve(handler)?;
        Ok(Shards { transport, channel, server, bound })
    }

    pub(crate) fn rank(&self) -> usize {
        self.transport.rank()
    }

    pub(crate) fn size(&self) -> usize {
        self.transport.size()
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
    fn call(&self, key: &Key, requests: &[(usize, Vec<u8>)]) -> Result<Vec<Vec<u8>>> {
        let replies = self.transport.requests(self.channel, requests)?;
        requests
            .iter()
            .zip(replies)
            .map(|((owner, _), reply)| {
                let mut r = reply.as_slice();
                match take(&mut r, 1)?[0] {
                    0 => Ok(r.to_vec()),
                    _ => {
                        let n = u32_of(take(&mut r, 4)?) as usize;
                        let code = String::from_utf8_lossy(take(&mut r, n)?).into_owned();
                        let message = String::from_utf8_lossy(r);
                        Err(Error::Backend {
                            backend: "dist_async",
                            message: format!(
                                "rank {owner}, the owner of key \"{key}\", refused the call ({code}): {message}"
                            ),
                        })
                    }
                }
            })
            .collect()
    }

    /// Sends `value`'s parts to their owners with `op` (INIT or PUSH).
    fn send(&self, op: u8, key: &Key, value: &NDArray) -> Result<()> {
        let read = value.read()?;
        let bytes = read.bytes();
        let esize = value.dtype().size();
        let requests: Vec<(usize, Vec<u8>)> = self
            .parts(key, value.size())
            .into_iter()
            .map(|part| {
                let shape = match part.len == value.size() {
                    true => value.shape().to_vec(),
                    false => vec![part.len],
                };
                let range = part.start * esize..(part.start + part.len) * esize;
                (part.owner, request(op, &part.name, value.dtype(), &shape, &bytes[range]))
            })
            .collect();
        drop(read);
        self.call(key, &requests).map(drop)
    }

    /// Initialises `key` on its owners with `value` (one worker does, rank 0).
    pub(crate) fn init(&self, key: &Key, value: &NDArray) -> Result<()> {
        self.send(INIT, key, value)
    }

    /// Pushes `sum` (this worker's sum of its values of `key`) to the owners.
    pub(crate) fn push(&self, key: &Key, sum: &NDArray) -> Result<()> {
        self.send(PUSH, key, sum)
    }

    /// Writes the owners' value of `key` into `into` (of the key's shape and dtype).
    pub(crate) fn pull(&self, key: &Key, into: &NDArray) -> Result<()> {
        let esize = into.dtype().size();
        let parts = self.parts(key, into.size());
        let requests: Vec<(usize, Vec<u8>)> =
            parts.iter().map(|p| (p.owner, request(PULL, &p.name, into.dtype(), &[], &[]))).collect();
        let got = self.call(key, &requests)?;
        for (part, bytes) in parts.iter().zip(&got) {
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
        for (part, bytes) in parts.iter().zip(got) {
            out[part.start * esize..(part.start + part.len) * esize].copy_from_slice(&bytes);
        }
        w.finish()
    }

    /// Installs `optimizer` on this worker's share.
    pub(crate) fn set_optimizer(&self, optimizer: Optimizer) -> Result<()> {
        self.server.set_optimizer(optimizer)
    }

    /// Installs `updater` on this worker's share (it gets each key as the user wrote it).
    pub(crate) fn set_updater(&self, updater: Arc<dyn Updater>) -> Result<()> {
        self.server.set_updater(PartUpdater(updater))
    }

    pub(crate) fn clear_updater(&self) -> Result<()> {
        self.server.clear_updater()
    }

    pub(crate) fn optimizer_name(&self) -> Option<&'static str> {
        self.server.optimizer_name()
    }

    /// Waits until every worker has called it (answering requests meanwhile).
    pub(crate) fn barrier(&self) -> Result<()> {
        self.transport.barrier()
    }
}

impl KVStore {
    /// Refuses `op` on a `dist_async` store, which does not have it yet.
    pub(super) fn not_async(&self, op: &str) -> Result<()> {
        match self.store.remote {
            Some(_) => Err(Error::Unsupported {
                what: format!("{op} on a {} store", self.kind()),
                hint: "dist_async stores do not have it yet: use dist_sync".to_string(),
            }),
            None => Ok(()),
        }
    }
}
