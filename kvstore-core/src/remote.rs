//! The transport of `dist_async` stores. Core names no transport: `kvstore-mpi`
//! implements [`Remote`] over MPI (a serving thread per process), and tests implement it
//! with threads. Each key of a `dist_async` store has an owner among the workers, which
//! keeps its value and optimizer state and applies pushes as they arrive (MXNet's
//! parameter servers, here one per worker); workers reach owners through a `Remote`.

use std::sync::Arc;

use crate::error::Result;

/// What a worker answers the requests of the others with: `handler(from, request)`
/// gives the reply. The request is the bytes the other worker sent (without the
/// transport's framing), in a buffer the handler may read in place and leave changed
/// (the store lends it to a push, and gives it back; a transport reuses it, or makes a
/// new one where it was taken). Requests of one worker to one channel are answered in
/// the order they were sent.
pub type Handler = Arc<dyn Fn(usize, &mut Vec<u8>) -> Vec<u8> + Send + Sync>;

/// Request and reply between the workers of a job, and a barrier.
///
/// Every worker creates its `dist_async` stores in the same order: the `n`-th store of
/// each worker serves on the same channel ([`Remote::serve`] numbers them alike).
pub trait Remote: Send + Sync {
    /// A short name for messages (`"mpi"`).
    fn name(&self) -> &'static str;

    /// This worker's rank, in `0..size()`.
    fn rank(&self) -> usize;

    /// The number of workers.
    fn size(&self) -> usize;

    /// Starts answering requests on a new channel with `handler` (in the background,
    /// while this worker's own calls go on), and returns the channel's number.
    ///
    /// # Errors
    /// [`crate::Error::Backend`] if the transport cannot serve (it is finalised).
    fn serve(&self, handler: Handler) -> Result<u32>;

    /// Sends `request` to worker `to`'s handler of `channel` and returns its reply (the
    /// transport may add its framing to the request's end: it has room for 16 bytes);
    /// `to` may be this worker (its serving thread answers then too: the calling thread
    /// may hold keys of a store; the store serves its own worker's parts itself).
    ///
    /// # Errors
    /// [`crate::Error::Backend`] if the group is broken.
    fn request(&self, to: usize, channel: u32, request: Vec<u8>) -> Result<Vec<u8>>;

    /// Sends each `(to, request)` of `requests` on `channel` and returns their replies, in
    /// order: the parts of a key go to their owners together. The default sends them one
    /// after another; a transport may have them in flight at once.
    ///
    /// # Errors
    /// As [`Remote::request`].
    fn requests(&self, channel: u32, requests: Vec<(usize, Vec<u8>)>) -> Result<Vec<Vec<u8>>> {
        requests.into_iter().map(|(to, r)| self.request(to, channel, r)).collect()
    }

    /// [`Remote::requests`], running `meanwhile` (this worker's own share of the work)
    /// while they are in flight: the default runs it first, then sends them; a transport
    /// that sends without waiting runs it once they are sent.
    ///
    /// # Errors
    /// As [`Remote::request`].
    fn requests_while(
        &self,
        channel: u32,
        requests: Vec<(usize, Vec<u8>)>,
        meanwhile: &mut dyn FnMut(),
    ) -> Result<Vec<Vec<u8>>> {
        meanwhile();
        self.requests(channel, requests)
    }

    /// Waits until every worker has called it, answering requests meanwhile.
    ///
    /// # Errors
    /// [`crate::Error::Backend`] if the group is broken.
    fn barrier(&self) -> Result<()>;

    /// The most bytes one request or one reply may hold, the transport's framing
    /// included (kvstore-mpi: an MPI count, 2^31 - 1 bytes). A bigger one is refused with
    /// an error by the store, at either end, before it is sent.
    fn max_message(&self) -> usize {
        usize::MAX
    }

    /// Sets how long a request may wait for its reply before the job ends
    /// ([`crate::KVStoreBuilder::timeout`]); a transport without a watchdog ignores it.
    fn set_timeout(&self, timeout: std::time::Duration) {
        let _ = timeout;
    }
}
