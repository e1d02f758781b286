//! [`CommDevice`], the `device` store's `Comm`: mirrors `CommDevice` in MXNet's
//! `src/kvstore/comm.h`. At a key's first push of values from devices it gives the key
//! the device, among those its values come from, that holds the fewest bytes of keys so
//! far, biggest keys first (MXNet's `CommDevice::InitMergeBuffer`); the store moves the
//! key there, and from then on the key's sums (the device backend's kernel), updates
//! and pulls run from that device. Values pushed from other devices are copied to the
//! key's device (peer to peer) into buffers kept per key, so the kernel sums inputs
//! that are all in place. On cpu contexts it sums exactly as [`CommCpu`].

use std::collections::HashMap;

use parking_lot::Mutex;

use super::{BroadcastJob, Comm, CommCpu, PushKey, ReduceJob};
use crate::context::Context;
use crate::error::Result;
use crate::ndarray::NDArray;

/// The `device` store's `Comm`: places keys on the devices of their values and sums
/// them there.
pub struct CommDevice {
    /// The sums and copies themselves: the backend's kernels when every array is on a
    /// device, the host loops otherwise.
    host: CommCpu,
    /// The bytes of keys given to each device so far.
    load: Mutex<HashMap<Context, usize>>,
}

/// What a `CommDevice` keeps in a key's [`KeyBuffers`](super::KeyBuffers).
#[derive(Default)]
struct DeviceKey {
    /// The key has been given its device.
    placed: bool,
    /// Copies on the key's device of the values pushed from other devices, one per
    /// position, made at first use and reused.
    peers: Vec<Option<NDArray>>,
}

impl CommDevice {
    /// A `CommDevice` whose host work runs on the process's shared pool (`threads` 0)
    /// or on a pool of its own of `threads` threads.
    ///
    /// # Errors
    /// [`Error::ResourceExhausted`](crate::Error::ResourceExhausted) if the operating
    /// system refuses to start the threads.
    pub fn new(threads: usize) -> Result<Self> {
        Ok(CommDevice { host: CommCpu::new(threads)?.without_host_staging(), load: Mutex::new(HashMap::new()) })
    }
}

impl Comm for CommDevice {
    fn name(&self) -> &'static str {
        "device"
    }

    fn reduce(&self, jobs: &[ReduceJob<'_>]) -> Result<()> {
        self.host.reduce(jobs)
    }

    fn broadcast(&self, jobs: &[BroadcastJob<'_>]) -> Result<()> {
        self.host.broadcast(jobs)
    }

    /// The first push of a key with values on devices gives it the least loaded of
    /// those devices; a key counts as placed from then on (if the store then fails to
    /// move it, which only a failing device does, it stays where it was and is summed
    /// there).
    fn place(&self, keys: &mut [PushKey<'_, '_>]) -> Result<Vec<Option<Context>>> {
        let mut homes = vec![None; keys.len()];
        let bytes = |k: &PushKey<'_, '_>| k.values.first().map_or(0, |a| a.size() * a.dtype().size());
        let mut new: Vec<usize> = (0..keys.len())
            .filter(|&i| {
                let k = &mut keys[i];
                !k.buffers.get_or_insert_with(DeviceKey::default).placed && k.values.iter().any(|a| a.on_device())
            })
            .collect();
        if new.is_empty() {
            return Ok(homes);
        }
        new.sort_by_key(|&i| std::cmp::Reverse(bytes(&keys[i])));
        let mut load = self.load.lock();
        for i in new {
            let devices = keys[i].values.iter().map(|a| a.context()).filter(|c| !c.is_cpu());
            let Some(home) = devices.min_by_key(|c| (load.get(c).copied().unwrap_or(0), c.device_id())) else {
                continue;
            };
            keys[i].buffers.get_or_insert_with(DeviceKey::default).placed = true;
            *load.entry(home).or_insert(0) += bytes(&keys[i]);
            homes[i] = Some(home);
        }
        Ok(homes)
    }

    /// Values on devices other than the key's are copied to the key's device into the
    /// key's peer buffers; the sum then reads every input where it is.
    fn stage(&self, key: &mut PushKey<'_, '_>) -> Result<Option<Vec<NDArray>>> {
        let home = key.value.context();
        let foreign = |a: &NDArray| a.on_device() && a.context() != home;
        if home.is_cpu() || !key.values.iter().any(|a| foreign(a)) {
            return Ok(None);
        }
        let peers = &mut key.buffers.get_or_insert_with(DeviceKey::default).peers;
        let mut out = Vec::with_capacity(key.values.len());
        for (j, &a) in key.values.iter().enumerate() {
            if !foreign(a) {
                out.push(a.clone());
                continue;
            }
            if peers.len() <= j {
                peers.resize(j + 1, None);
            }
            let buf = match &peers[j] {
                Some(b) if b.context() == home && b.shape() == a.shape() && b.dtype() == a.dtype() => b.clone(),
                _ => peers[j].insert(NDArray::zeros_with(a.shape(), a.dtype(), home)?).clone(),
            };
            buf.copy_from(a)?;
            out.push(buf);
        }
        Ok(Some(out))
    }
}
