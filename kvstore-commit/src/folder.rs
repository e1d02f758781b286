//! The folder of a job's store and what it holds: the commits' format, how the ranks
//! write one together and read one back, and the store's [`Durable`] made of it (the
//! crate's docs say where the folder is and what a commit promises).

use std::fs::{DirBuilder, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use kvstore_core::backend::ranks as named;
use kvstore_core::backend::{Durable, MAX_RECORD, Peers, Said, Seam, Snapshot, word};
use kvstore_core::{Error, KVStore, Restored, Result, say};

use crate::{Claim, done_step};

const MAGIC: &[u8; 8] = b"KVSTCMT4";
/// The header: magic, step, rank, ranks, the lengths of extra, the checkpoint, the
/// residuals and the optimizer state, CRC; then the checkpoint and the writing rank's
/// own [`Record`]: its extra bytes, its gradient-compression residuals
/// ([`encode_residuals`]) and its share's optimizer state (`dist_async`).
const HEADER: usize = 8 + 8 + 4 + 4 + 8 + 8 + 8 + 8 + 4;
/// How many marked commits are kept.
const KEEP: usize = 2;

fn io(context: impl std::fmt::Display, source: std::io::Error) -> Error {
    Error::Io { context: context.to_string(), source }
}

fn refused(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::invalid_argument(format!("the commits at {}: {why}; nothing was used", path.display()))
}

/// This process's user: the owner of its `/proc/self`.
pub(crate) fn uid() -> Result<u32> {
    std::fs::metadata("/proc/self").map(|m| m.uid()).map_err(|e| io("this process's user (/proc/self)", e))
}

/// Makes `path` a folder of the user's alone, or checks that it is one: not a link, owned
/// by `uid`, no access for others.
fn own_folder(path: &Path, uid: u32) -> Result<()> {
    match DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(format!("the commits' folder {}", path.display()), e)),
    }
    let m = std::fs::symlink_metadata(path).map_err(|e| io(format!("the commits' folder {}", path.display()), e))?;
    if !m.file_type().is_dir() {
        return Err(refused(path, "not a folder"));
    }
    if m.uid() != uid {
        return Err(refused(path, format!("the folder belongs to user {}, not to this job's user {uid}", m.uid())));
    }
    if m.mode() & 0o077 != 0 {
        return Err(refused(path, format!("others may use the folder (mode {:o}, not 700)", m.mode() & 0o777)));
    }
    Ok(())
}

/// Which commit a rank writes ([`Folder::write_commit`]): its step, the rank, the job's
/// ranks, whether the host's first rank writes the whole copy alone (a `dist_async`
/// store's, which only that rank gathers) rather than each of the host's ranks a share,
/// and the rank's share's optimizer state (a `dist_async` store's, else empty).
#[derive(Clone, Copy)]
struct Writing<'a> {
    step: u64,
    rank: usize,
    ranks: usize,
    alone: bool,
    optimizer: &'a [u8],
}

/// What [`Folder::newest`] found: the newest marked commit with a whole copy (its step
/// and bytes), and the newer marked one passed over, if any.
type Found = (Option<(u64, Vec<u8>)>, Option<Passed>);

/// A newer marked commit passed over because no copy of it is whole: its step, and why.
type Passed = (u64, String);

/// The folder of a job's store.
#[derive(Debug)]
pub(crate) struct Folder {
    path: PathBuf,
    uid: u32,
    /// The ranks whose folder this same folder is (their host's `/dev/shm`), in order,
    /// found at the first commit ([`Folder::host`]).
    host: std::sync::OnceLock<Vec<usize>>,
    /// A `dist_async` store's last gathered copy, on the first rank of a host: the next
    /// commit gathers into its arrays (their memory in place, as the spare file's), where
    /// new arrays of hundreds of megabytes faulted in page by page at every commit.
    gathered: parking_lot::Mutex<Option<KVStore>>,
    /// The store's number, given back if its build fails.
    claim: Claim,
}

impl Folder {
    /// The folder `name` of the job's folder `jobs` ([`crate::job_folder`]), each made
    /// if need be, the user's alone (else refused, never used).
    pub(crate) fn open(jobs: &Path, name: &str, claim: Claim) -> Result<Folder> {
        let uid = uid()?;
        own_folder(jobs, uid)?;
        let path = jobs.join(name);
        own_folder(&path, uid)?;
        let (host, gathered) = (std::sync::OnceLock::new(), parking_lot::Mutex::new(None));
        Ok(Folder { path, uid, host, gathered, claim })
    }

    fn file(&self, step: u64, rank: usize, ranks: usize) -> PathBuf {
        self.path.join(format!("step-{step:020}-rank-{rank:06}-of-{ranks:06}.commit"))
    }

    /// Rank `rank`'s own `extra` of `step`, beside its host's copy written by another rank.
    fn extra_file(&self, step: u64, rank: usize, ranks: usize) -> PathBuf {
        self.path.join(format!("step-{step:020}-rank-{rank:06}-of-{ranks:06}.extra"))
    }

    /// The ranks that share this folder (on one host), this rank among them, in order:
    /// every rank says which folder it has (its device and inode), once. (A rank that
    /// cannot tell is alone: its writes will say why.)
    fn host(&self, group: Option<Peers<'_>>) -> Result<&[usize]> {
        if let Some(host) = self.host.get() {
            return Ok(host);
        }
        let Some(group) = group else { return Ok(self.host.get_or_init(|| vec![0])) };
        // The machine too (its boot's id): two machines' fresh mounts may number alike.
        // (Every rank's record of one length: 16 bytes, then the boot's id in 40.)
        let mut boot = std::fs::read("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        boot.resize(40, 0);
        let mine = match std::fs::metadata(&self.path) {
            Ok(m) => [&m.dev().to_le_bytes()[..], &m.ino().to_le_bytes(), &boot].concat(),
            Err(_) => [&[0xff; 8][..], &(group.rank() as u64).to_le_bytes(), &[0; 40]].concat(),
        };
        let all = group.exchange("commit-folders", &mine)?;
        Ok(self.host.get_or_init(|| (0..all.len()).filter(|&r| all[r] == mine).collect()))
    }

    fn done(&self, step: u64) -> PathBuf {
        self.path.join(format!("step-{step:020}.done"))
    }

    /// Writes `bytes` to `path` under a temporary name (the user's alone), then renames.
    fn write(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let temp = self.path.join(format!(".{name}.{}", std::process::id()));
        let context = || format!("the commit {}", path.display());
        let _ = std::fs::remove_file(&temp);
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
            .and_then(|mut f| f.write_all(bytes))
            .and_then(|()| std::fs::rename(&temp, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        written.map_err(|e| io(context(), e))
    }

    /// This rank's spare file: the file of a commit that [`Folder::prune`] removed, kept
    /// for the next commit to write over, whose memory is then in place already (a new
    /// file of `/dev/shm` costs a page fault per page: the commit took three times as long).
    fn spare(&self, rank: usize) -> PathBuf {
        self.path.join(format!(".spare-rank-{rank:06}"))
    }

    /// Writes the commit of `step` of this rank's host: one copy, `step-S-rank-L-of-N.commit`
    /// (L the host's first rank), written by the host's ranks together, each a share of
    /// the tensors (by bytes), in one pass: each copied into the file and hashed as it
    /// goes. The first rank makes the file (writing over its spare), and once the others
    /// wrote their shares and sent their tensors' checksums (each share's sample checked
    /// against the same bytes of its own memory: every rank holds the same), writes the
    /// headers (reserved first: their lengths do not depend on the hashes)
    /// and its `extra`, and renames the file; each other rank writes its `extra` apart
    /// (`.extra`). With `at.alone`, the first rank writes the whole copy and the others
    /// only their `extra` (their `snap` is of an empty store). What fails is this rank's
    /// failure (every rank hears of it); the ranks' exchanges are made whatever failed.
    fn write_commit(
        &self,
        group: Option<Peers<'_>>,
        at: Writing<'_>,
        extra: &[u8],
        snap: std::result::Result<&Snapshot<'_>, &Error>,
    ) -> Result<()> {
        const PIECE: usize = 256 << 10;
        const MAPPED_PIECE: usize = 64 << 10;
        // The sample the first rank checks of each other rank's share: 4 KiB of every MiB.
        const SAMPLE_STRIDE: usize = 1 << 20;
        const SAMPLE_BYTES: usize = 4 << 10;
        let Writing { step, rank, ranks, alone, optimizer } = at;
        let host = self.host(group)?.to_vec();
        // An exchange of records of one length on every rank.
        let exchange = |step_name: &str, mine: &[u8]| -> Result<Vec<Vec<u8>>> {
            group.map_or_else(|| Ok(vec![mine.to_vec()]), |g| g.exchange(step_name, mine))
        };
        // Each exchange: whether this rank's part went well, and two numbers (the first:
        // its process id and step; then its share's sample CRC and its number of tensors).
        let said = |step_name: &str, ok: bool, a: u64, b: u64| -> Result<Vec<Vec<u8>>> {
            exchange(step_name, &[&[u8::from(ok)][..], &a.to_le_bytes(), &b.to_le_bytes()].concat())
        };
        let number = |record: Option<&Vec<u8>>, i: usize| record.map_or(0, |b| word(b, 1 + 8 * i));
        let snap = match snap {
            Ok(snap) => snap,
            Err(e) => {
                // This rank could not even start: it says so at each step of the others.
                said("commit-file", false, 0, step)?;
                said("commit-shares", false, 0, 0)?;
                return Err(e.clone());
            }
        };
        let (first, share) = (host[0], host.iter().position(|&r| r == rank).unwrap_or(0));
        let sharers = if alone { 1 } else { host.len() };
        // This rank's own, beside its extra (each rank's differ).
        let residuals = encode_residuals(snap.residuals());
        let own = Record { extra: extra.to_vec(), residuals, optimizer: optimizer.to_vec(), ranks };
        let path = self.file(step, first, ranks);
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let temp = |pid: u64| self.path.join(format!(".{name}.{pid}"));
        let me = u64::from(std::process::id());
        let n = snap.count();
        let reserved = match snap.header(&vec![crc32fast::Hasher::new(); n]) {
            Ok(header) => header.len(),
            Err(e) => return self.write_commit(group, at, extra, Err(&e)),
        };
        let data_len = snap.data_len();
        let begins = snap.offsets();
        // A snapshot in parts (the optimizer state on its owners): each rank writes its
        // own part of each such tensor, so every owner must be on this host.
        let in_parts = (0..n).any(|i| snap.parts(i).is_some());
        if in_parts && (alone || group.is_some_and(|g| g.size() != host.len())) {
            let e = Error::Internal("commit: a snapshot in parts is written by every rank on one host".into());
            return self.write_commit(group, at, extra, Err(&e));
        }
        // Each whole tensor's writer: the host's ranks take those tensors' bytes in turn
        // (`usize::MAX` for a tensor in parts, which no one rank writes).
        let mut whole_at = vec![0; n];
        let mut whole_len = 0;
        for &i in snap.file_order().iter().filter(|&&i| snap.parts(i).is_none()) {
            whole_at[i] = whole_len;
            whole_len += snap.len(i);
        }
        // (An empty tensor at the very end belongs to the last: `whole_at` is the length.)
        let writer = |i: usize| match snap.parts(i) {
            Some(_) => usize::MAX,
            None => (((whole_at[i] as u128 * sharers as u128) / (whole_len.max(1) as u128)) as usize).min(sharers - 1),
        };
        // 1. The host's first rank makes the file; every rank hears whether it could.
        let made = match rank == first {
            true => (|| -> std::io::Result<std::fs::File> {
                let _ = std::fs::remove_file(temp(me));
                let reused = std::fs::rename(self.spare(rank), temp(me)).is_ok();
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(!reused)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(temp(me))?;
                file.set_len((HEADER + reserved + data_len + own.len()) as u64)?;
                Ok(file)
            })()
            .map(Some),
            false => Ok(None),
        };
        let all = said("commit-file", made.is_ok(), me, step)?;
        let ok = |r: usize| all.get(r).and_then(|b| b.first()) == Some(&1);
        let pid = number(all.get(first), 0);
        let context = || format!("the commit {}", path.display());
        // Every rank commits the same step (each says which): else the ranks would resume
        // from different steps.
        let steps: Vec<u64> = (0..all.len()).map(|r| number(all.get(r), 1)).collect();
        let same_step = steps.iter().all(|&s| s == step);
        // 2. Every rank writes its share, hashing it as it goes.
        let wrote: std::io::Result<Vec<Option<crc32fast::Hasher>>> = (|| {
            if !same_step {
                return Err(std::io::Error::other(format!(
                    "the ranks commit different steps ({}): every rank must commit the same one",
                    steps.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
                )));
            }
            if !ok(first) {
                return Err(std::io::Error::other(format!("rank {first}, which makes this host's copy, could not")));
            }
            let file = match &made {
                Ok(Some(file)) => file.try_clone()?,
                _ => OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOFOLLOW).open(temp(pid))?,
            };
            // What this rank writes: each whole tensor of its share, and its part of each
            // tensor in parts (their CRC-32s joined in the order of the ranges, below): as
            // (where the bytes begin in the data, the bytes), by tensor.
            let own = |i: usize| match snap.parts(i) {
                Some(parts) => parts.get(rank).map(|range| (begins[i] + range.start, snap.bytes(i))),
                None => (writer(i) == share).then(|| (begins[i], snap.bytes(i))),
            };
            // Copied through one mapping of the range that holds them all, kept for the next
            // commits (a share's whole tensors are one range of the file, the writers taking
            // them in the file's order; with parts, the range spans the others' parts too).
            let ranges = (0..n).filter_map(own).filter(|(_, b)| !b.is_empty()).map(|(at, b)| (at, at + b.len()));
            // (A rank may have nothing to write: a store with no keys, or more ranks on
            // the host than tensors; then `low` stays above `high` and nothing is mapped.)
            let (low, high) = ranges.fold((usize::MAX, 0), |(l, h), (b, e)| (l.min(b), h.max(e)));
            let base = HEADER + reserved + low.min(high);
            let mapped = (high > low).then(|| crate::mapped::map_for_writing(&file, base as u64, high - low));
            let mut map = match mapped {
                // A file system that cannot allocate blocks ahead: written instead.
                Some(Err(e)) if e.kind() == std::io::ErrorKind::Unsupported => None,
                mapped => mapped.transpose()?,
            };
            // In the file's order, each into its own piece of the mapping (the bytes
            // between them may be other ranks' parts, written meanwhile).
            let mut writes: Vec<(usize, usize, &[u8])> =
                (0..n).filter_map(|i| own(i).map(|(at, b)| (i, at, b))).collect();
            writes.sort_by_key(|&(_, at, _)| at);
            let spans: Vec<std::ops::Range<usize>> =
                writes.iter().filter(|w| !w.2.is_empty()).map(|&(_, at, b)| at - low..at - low + b.len()).collect();
            let mapped = map.is_some();
            let mut pieces = match &mut map {
                Some(map) => map.pieces(&spans).ok_or_else(|| std::io::Error::other("this rank's ranges overlap"))?,
                None => Vec::new(),
            }
            .into_iter();
            let mut crcs = vec![None; n];
            for (i, at, bytes) in writes {
                if snap.parts(i).and_then(|p| p.get(rank)).is_some_and(|r| r.len() != bytes.len()) {
                    return Err(std::io::Error::other("this rank's part of a tensor is not the length its range says"));
                }
                let mut crc = crc32fast::Hasher::new();
                let mut piece = if mapped && !bytes.is_empty() { pieces.next() } else { None };
                // A piece is hashed while the cache holds it from its copy.
                let step = if piece.is_some() { MAPPED_PIECE } else { PIECE };
                for (k, chunk) in bytes.chunks(step).enumerate() {
                    match &mut piece {
                        Some(piece) => piece[k * step..k * step + chunk.len()].copy_from_slice(chunk),
                        None => file.write_all_at(chunk, (HEADER + reserved + at + k * step) as u64)?,
                    }
                    crc.update(chunk);
                }
                crcs[i] = Some(crc);
            }
            Ok(crcs)
        })();
        // The sample of a member's share: a few bytes of every MiB of its tensors, in order,
        // which the first rank hashes from its own memory too (below).
        let sample_of = |member: usize| {
            let mut crc = crc32fast::Hasher::new();
            for (i, bytes) in (0..n).map(|i| (i, snap.bytes(i))) {
                if writer(i) == member {
                    bytes.chunks(SAMPLE_STRIDE).for_each(|b| crc.update(&b[..b.len().min(SAMPLE_BYTES)]));
                }
            }
            u64::from(crc.finalize())
        };
        // This rank's share as written: its sample, its number of tensors and each one's
        // CRC-32, in order.
        let mine: Vec<u32> = wrote
            .as_ref()
            .map_or_else(|_| Vec::new(), |crcs| crcs.iter().flatten().map(|c| c.clone().finalize()).collect());
        let sample = if wrote.is_ok() { sample_of(share) } else { 0 };
        let all = said("commit-shares", wrote.is_ok(), sample, mine.len() as u64)?;
        let wrote_at = |r: usize| all.get(r).and_then(|b| b.first()) == Some(&1);
        let shares_written = host.iter().all(|&r| wrote_at(r));
        // Then, where every rank wrote its share, the checksums of every share, as long
        // as the longest list (every rank knows each one's length from the exchange), in
        // records of at most `MAX_RECORD` bytes. (Alone, the first rank has them all.)
        let everyone = (0..all.len()).all(wrote_at);
        let most = (0..all.len()).map(|r| number(all.get(r), 1)).max().unwrap_or(0) as usize;
        let mut lists: Vec<Vec<u8>> = vec![Vec::new(); all.len()];
        if everyone && !alone {
            let mut listed: Vec<u8> = mine.iter().flat_map(|c| c.to_le_bytes()).collect();
            listed.resize(4 * most, 0);
            for (k, part) in listed.chunks(MAX_RECORD).enumerate() {
                let parts = exchange(&format!("commit-checksums-{k}"), part)?;
                for (list, part) in lists.iter_mut().zip(parts) {
                    list.extend_from_slice(&part);
                }
            }
        }
        // The first rank's samples of the others' shares (from its own memory) must be
        // what they hashed: ranks that hold different values would make a copy whose
        // checksum can never match. (A sample, not the whole share: hashing every other
        // rank's bytes again made the first rank's commit cost two copies' worth.)
        let differing: Vec<usize> = match (&wrote, rank == first) {
            (Ok(_), true) => host
                .iter()
                .enumerate()
                .filter(|&(member, &r)| member != share && wrote_at(r) && sample_of(member) != number(all.get(r), 0))
                .map(|(_, &r)| r)
                .collect(),
            _ => Vec::new(),
        };
        // Every tensor's CRC-32, the others' as they said (each with its length), or,
        // where a rank elsewhere failed and none were sent, hashed from this rank's memory.
        let told = |crcs: Vec<Option<crc32fast::Hasher>>| -> std::io::Result<Vec<crc32fast::Hasher>> {
            let mut listed: Vec<std::vec::IntoIter<u32>> = host
                .iter()
                .map(|&r| {
                    let count = number(all.get(r), 1) as usize;
                    let record = lists.get(r).map_or(&[][..], |b| b.get(..4 * count).unwrap_or_default());
                    let crcs: Vec<u32> =
                        record.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().expect("4"))).collect();
                    crcs.into_iter()
                })
                .collect();
            crcs.into_iter()
                .enumerate()
                .map(|(i, own)| match (snap.parts(i), own) {
                    (Some(_), own) => {
                        // Every rank's part's CRC-32 (this rank's own), joined in order.
                        let mut each = vec![0; host.len()];
                        for (member, &r) in host.iter().enumerate() {
                            let crc = match member == share {
                                true => own.clone().map(crc32fast::Hasher::finalize),
                                false => listed[member].next(),
                            };
                            let crc = crc.filter(|_| everyone && r < each.len()).ok_or_else(|| {
                                std::io::Error::other(format!("rank {r} sent no checksum of its part of a tensor"))
                            })?;
                            each[r] = crc;
                        }
                        snap.joined_crc(i, &each).ok_or_else(|| {
                            std::io::Error::other(
                                "the ranks' parts of a tensor and their checksums do not make it whole",
                            )
                        })
                    }
                    (None, Some(crc)) => Ok(crc),
                    (None, None) if !everyone => {
                        let mut crc = crc32fast::Hasher::new();
                        crc.update(snap.bytes(i));
                        Ok(crc)
                    }
                    (None, None) => listed[writer(i)]
                        .next()
                        .map(|c| crc32fast::Hasher::new_with_initial_len(c, snap.bytes(i).len() as u64))
                        .ok_or_else(|| std::io::Error::other("a rank of this host sent too few checksums")),
                })
                .collect()
        };
        // 3. The first rank finishes the file; the others write their extra.
        let finished = (|| -> std::io::Result<()> {
            let crcs = wrote?;
            if rank != first {
                return self
                    .write(&self.extra_file(step, rank, ranks), &record(step, rank, &own))
                    .map_err(std::io::Error::other);
            }
            if !shares_written {
                return Err(std::io::Error::other("another rank of this host could not write its share"));
            }
            if !differing.is_empty() {
                return Err(std::io::Error::other(format!(
                    "{} of this host hold other values than rank {first} (a dist_sync store's ranks hold the same)",
                    named(&differing)
                )));
            }
            let crcs = told(crcs)?;
            let header = snap.header(&crcs).map_err(std::io::Error::other)?;
            if header.len() != reserved {
                return Err(std::io::Error::other("the checkpoint's header changed length"));
            }
            let fields = fields(step, rank, (reserved + data_len) as u64, &own);
            let mut crc = crc32fast::Hasher::new();
            crc.update(&fields);
            crc.update(&header);
            snap.file_order().iter().for_each(|&i| crc.combine(&crcs[i]));
            let own = own.bytes();
            crc.update(&own);
            let file = made.as_ref().ok().and_then(Option::as_ref).ok_or_else(|| std::io::Error::other("no file"))?;
            file.write_all_at(&[&fields[..], &crc.finalize().to_le_bytes(), &header].concat(), 0)?;
            file.write_all_at(&own, (HEADER + reserved + data_len) as u64)?;
            std::fs::rename(temp(pid), &path)
        })();
        if rank == first && finished.is_err() {
            let _ = std::fs::remove_file(temp(pid));
        }
        finished.map_err(|e| io(context(), e))
    }

    /// Reads a file of the folder: a regular file of the user's alone, else refused.
    fn read(&self, path: &Path) -> Result<Vec<u8>> {
        let context = || format!("the commit {}", path.display());
        let m = std::fs::symlink_metadata(path).map_err(|e| io(context(), e))?;
        if !m.file_type().is_file() {
            return Err(refused(path, "not a regular file"));
        }
        if m.uid() != self.uid || m.mode() & 0o077 != 0 {
            return Err(refused(path, format!("a file of user {} with mode {:o}", m.uid(), m.mode() & 0o777)));
        }
        let mut bytes = Vec::with_capacity(m.len() as usize);
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|e| io(context(), e))?;
        Ok(bytes)
    }

    /// The steps marked done, newest first.
    fn done_steps(&self) -> Result<Vec<u64>> {
        let mut steps: Vec<u64> = self.names()?.iter().filter_map(|n| done_step(n)).collect();
        steps.sort_unstable_by(|a, b| b.cmp(a));
        Ok(steps)
    }

    fn names(&self) -> Result<Vec<String>> {
        let entries =
            std::fs::read_dir(&self.path).map_err(|e| io(format!("the commits' folder {}", self.path.display()), e))?;
        Ok(entries.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned())).collect())
    }

    /// The files of `step` in the folder (any rank's).
    fn files_of(&self, step: u64) -> Result<Vec<PathBuf>> {
        let prefix = format!("step-{step:020}-rank-");
        let mut files: Vec<PathBuf> = self
            .names()?
            .into_iter()
            .filter(|n| n.starts_with(&prefix) && n.ends_with(".commit"))
            .map(|n| self.path.join(n))
            .collect();
        files.sort();
        Ok(files)
    }

    /// The newest marked commit in the folder that has a whole copy: its step and bytes
    /// (this rank's own copy first), and why a newer marked one was passed over, if one
    /// was (no copy whole: damaged, or planted). A copy that is not whole is never loaded.
    fn newest(&self, rank: usize) -> Result<Found> {
        let mut passed = None;
        for step in self.done_steps()? {
            let mut why = String::from("no file of it is in the folder");
            let mut files = self.files_of(step)?;
            let own = format!("-rank-{rank:06}-of-");
            files.sort_by_key(|f| !f.file_name().is_some_and(|n| n.to_string_lossy().contains(&own)));
            for file in files {
                match self.read(&file).and_then(|bytes| match decode(&bytes) {
                    Ok(c) if c.step == step => Ok(bytes),
                    Ok(_) => Err(refused(&file, "a commit of another step")),
                    Err(e) => Err(refused(&file, e)),
                }) {
                    Ok(bytes) => return Ok((Some((step, bytes)), passed)),
                    Err(e) => why = e.to_string(),
                }
            }
            passed.get_or_insert_with(|| {
                (step, format!("the commit of step {step} in {}: no copy is whole ({why})", self.path.display()))
            });
        }
        Ok((None, passed))
    }

    /// Removes the commits after `step` (marked, but no rank has a whole copy: the job
    /// resumed from `step`), so that the job commits those steps again.
    fn forget_after(&self, step: u64) {
        for name in self.names().unwrap_or_default() {
            let later = name
                .trim_start_matches('.')
                .strip_prefix("step-")
                .and_then(|rest| rest.get(..20))
                .and_then(|s| s.parse::<u64>().ok())
                .is_some_and(|s| s > step);
            if later {
                let _ = std::fs::remove_file(self.path.join(&name));
            }
        }
    }

    /// The ranks whose own record of `step` (their `extra` and residuals) is in the folder:
    /// the writer of the host's copy and the ranks of the `.extra` files beside it; none
    /// where the step is not marked done here (files a rank died among, of a history the
    /// job gave up).
    fn records_of(&self, step: u64) -> Vec<usize> {
        if !self.done(step).exists() {
            return Vec::new();
        }
        let prefix = format!("step-{step:020}-rank-");
        let names = self.names().unwrap_or_default();
        names
            .iter()
            .filter(|n| n.ends_with(".extra") || n.ends_with(".commit"))
            .filter_map(|n| n.strip_prefix(&prefix)?.get(..6)?.parse().ok())
            .collect()
    }

    /// Rank `rank`'s own record of `step`, when it is in the folder, whole: its `.extra`
    /// file, or the host's copy it wrote itself.
    fn own_extra(&self, step: u64, rank: usize) -> Option<Record> {
        if !self.done(step).exists() {
            return None;
        }
        let prefix = format!("step-{step:020}-rank-{rank:06}-of-");
        let mut files: Vec<PathBuf> = self
            .names()
            .ok()?
            .into_iter()
            .filter(|n| n.starts_with(&prefix) && (n.ends_with(".extra") || n.ends_with(".commit")))
            .map(|n| self.path.join(n))
            .collect();
        // `.extra` before `.commit`: the small file first.
        files.sort_by_key(|f| f.extension().is_some_and(|e| e == "commit"));
        files.into_iter().find_map(|file| {
            let bytes = self.read(&file).ok()?;
            let c = decode(&bytes).ok().filter(|c| c.step == step && c.rank == rank)?;
            Some(c.record())
        })
    }

    /// Removes every commit older than the [`KEEP`] newest marked ones (an unmarked one
    /// is one a rank died in), and the temporary files of writes that never finished:
    /// done by the first of the ranks that share the folder (`rank` of the host
    /// [`Folder::host`] found), for every rank's files, those of ranks that ran here
    /// before included; its own newest removed copy becomes its spare, other spares go.
    fn prune(&self, rank: usize) -> Result<()> {
        if self.host.get().and_then(|h| h.first()).is_some_and(|&first| first != rank) {
            return Ok(());
        }
        let done = self.done_steps()?;
        let Some(&newest) = done.first() else { return Ok(()) };
        let kept: Vec<u64> = done.iter().copied().take(KEEP).collect();
        let spare = self.spare(rank);
        for name in self.names()? {
            let path = self.path.join(&name);
            if let Some(r) = name.strip_prefix(".spare-rank-").and_then(|r| r.parse::<usize>().ok()) {
                if r != rank {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            // A temporary file (`.step-...`) of a step before the newest marked one is a
            // write that never finished (its process died): every rank finished its
            // commit of that step before any began the next. (Another rank may still be
            // marking the newest step itself.)
            let (temporary, file) = match name.strip_prefix('.') {
                Some(file) => (true, file),
                None => (false, name.as_str()),
            };
            let Some(rest) = file.strip_prefix("step-") else { continue };
            let Some(step) = rest.get(..20).and_then(|s| s.parse::<u64>().ok()) else { continue };
            let old = if temporary { step < newest } else { step <= newest && !kept.contains(&step) };
            if !old {
                continue;
            }
            // This rank's own copy becomes its spare, once.
            let own = !temporary && file.contains(&format!("-rank-{rank:06}-of-")) && file.ends_with(".commit");
            if !(own && !spare.exists() && std::fs::rename(&path, &spare).is_ok()) {
                let _ = std::fs::remove_file(&path);
            }
        }
        Ok(())
    }
}

/// A rank's gradient-compression residuals as its commit holds them (little-endian):
/// the number of keys, then per key its name's length and name, its number of
/// positions, and per position its number of values and the values (f32).
fn encode_residuals(keys: &[(&str, &[Vec<f32>])]) -> Vec<u8> {
    let values: usize = keys.iter().flat_map(|(_, p)| p.iter().map(Vec::len)).sum();
    let mut out = Vec::with_capacity(4 + keys.len() * 64 + values * 4);
    out.extend_from_slice(&(keys.len() as u32).to_le_bytes());
    for (key, positions) in keys {
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(&(positions.len() as u32).to_le_bytes());
        for p in *positions {
            out.extend_from_slice(&(p.len() as u64).to_le_bytes());
            // (f32 in the machine's order, little-endian: the order of a checkpoint's data.)
            out.extend_from_slice(bytemuck::cast_slice(p));
        }
    }
    out
}

/// Whether `bytes` hold no residual ([`encode_residuals`] of no key, or nothing): of a
/// store that never used gradient compression.
fn no_residuals(bytes: &[u8]) -> bool {
    bytes.is_empty() || bytes == 0u32.to_le_bytes()
}

/// [`encode_residuals`]'s keys back; `None` for bytes that are not such a list.
fn decode_residuals(bytes: &[u8]) -> Option<Vec<(String, Vec<Vec<f32>>)>> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let piece = bytes.get(at..at.checked_add(n)?)?;
        at += n;
        Some(piece)
    };
    let word = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize;
    let keys = word(take(4)?);
    let mut out = Vec::new();
    for _ in 0..keys {
        let len = word(take(4)?);
        let key = String::from_utf8(take(len)?.to_vec()).ok()?;
        let positions = word(take(4)?);
        let mut values = Vec::new();
        for _ in 0..positions {
            let n = usize::try_from(u64::from_le_bytes(take(8)?.try_into().expect("8 bytes"))).ok()?;
            let floats = take(n.checked_mul(4)?)?;
            values.push(bytemuck::pod_collect_to_vec(floats));
        }
        out.push((key, values));
    }
    (at == bytes.len()).then_some(out)
}

/// A rank's own record of a commit: its `extra`, its gradient-compression residuals
/// ([`encode_residuals`]) and, under `dist_async`, its share's optimizer state (the
/// store-wide counters of the updates its share applied: `runtime_json`'s), with the
/// number of ranks of the job that committed them.
#[derive(Clone, Debug)]
struct Record {
    extra: Vec<u8>,
    residuals: Vec<u8>,
    optimizer: Vec<u8>,
    ranks: usize,
}

impl Record {
    fn len(&self) -> usize {
        self.extra.len() + self.residuals.len() + self.optimizer.len()
    }

    /// Its bytes as a commit holds them, one after another.
    fn bytes(&self) -> Vec<u8> {
        [&self.extra[..], &self.residuals, &self.optimizer].concat()
    }
}

/// Each rank that lacks its own record of `step` on its host (it moved to another host)
/// gets it from a rank whose host has it: every rank says which ranks' records its
/// host's folder holds, and for each rank that lacks its own, the lowest rank that
/// holds it sends it (the bytes of an `.extra` file, checked as one). A collective:
/// every rank calls it at the same point. (A job of more ranks than a record can name,
/// 8,184, keeps what each rank found.)
fn fetch_records(group: Peers<'_>, folder: &Folder, step: u64, own: Option<Record>) -> Result<Option<Record>> {
    let (me, n) = (group.rank(), group.size());
    if n > (MAX_RECORD - 1) * 8 {
        return Ok(own);
    }
    let mut said = vec![0u8; 1 + n.div_ceil(8)];
    said[0] = u8::from(own.is_some());
    for r in folder.records_of(step).into_iter().filter(|&r| r < n) {
        said[1 + r / 8] |= 1 << (r % 8);
    }
    let all = group.exchange("restore-records", &said)?;
    let holds = |q: usize, r: usize| all[q].get(1 + r / 8).is_some_and(|b| b & (1 << (r % 8)) != 0);
    let mut own = own;
    for r in (0..n).filter(|&r| all[r].first() == Some(&0)) {
        let Some(q) = (0..n).find(|&q| holds(q, r)) else { continue };
        // The record as an `.extra` file holds it, or nothing (length 0) when the rank
        // that has it cannot read it after all.
        let record = (me == q).then(|| folder.own_extra(step, r)).flatten().map(|own| record(step, r, &own));
        let got = group.broadcast("restore-record", record.unwrap_or_default(), q)?;
        if got.is_empty() {
            continue;
        }
        if me == r
            && let Ok(c) = decode(&got)
            && c.step == step
            && c.rank == r
        {
            own = Some(c.record());
        }
    }
    Ok(own)
}

/// A commit file, read and checked.
struct Commit<'b> {
    step: u64,
    /// The rank that wrote it, and the job's ranks then.
    rank: usize,
    ranks: usize,
    extra: &'b [u8],
    checkpoint: &'b [u8],
    /// The writing rank's residuals ([`encode_residuals`]) and its share's optimizer state.
    residuals: &'b [u8],
    optimizer: &'b [u8],
}

impl Commit<'_> {
    /// The writing rank's own record.
    fn record(&self) -> Record {
        let (extra, residuals, optimizer) = (self.extra.to_vec(), self.residuals.to_vec(), self.optimizer.to_vec());
        Record { extra, residuals, optimizer, ranks: self.ranks }
    }
}

/// The header's fields before its CRC: magic, step, rank, ranks (`own`'s), the lengths of
/// the checkpoint and of `own`'s extra, residuals and optimizer state.
fn fields(step: u64, rank: usize, checkpoint: u64, own: &Record) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER - 4);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&step.to_le_bytes());
    out.extend_from_slice(&(rank as u32).to_le_bytes());
    out.extend_from_slice(&(own.ranks as u32).to_le_bytes());
    out.extend_from_slice(&(own.extra.len() as u64).to_le_bytes());
    out.extend_from_slice(&checkpoint.to_le_bytes());
    out.extend_from_slice(&(own.residuals.len() as u64).to_le_bytes());
    out.extend_from_slice(&(own.optimizer.len() as u64).to_le_bytes());
    out
}

/// Rank `rank`'s own record of `step` as an `.extra` file holds it: the header (no
/// checkpoint) and its CRC, then the record's bytes.
fn record(step: u64, rank: usize, own: &Record) -> Vec<u8> {
    let fields = fields(step, rank, 0, own);
    let bytes = own.bytes();
    let mut crc = crc32fast::Hasher::new();
    [&fields[..], &bytes].iter().for_each(|b| crc.update(b));
    [&fields[..], &crc.finalize().to_le_bytes(), &bytes].concat()
}

fn decode(bytes: &[u8]) -> std::result::Result<Commit<'_>, &'static str> {
    if bytes.len() >= 8 && bytes[..8] != MAGIC[..] && bytes.starts_with(b"KVSTCMT") {
        return Err("a commit of another version of kvstore");
    }
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return Err("not a commit");
    }
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let (step, extra_len, len, residuals_len, optimizer_len) =
        (u64_at(8), u64_at(24), u64_at(32), u64_at(40), u64_at(48));
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
    let (rank, ranks) = (u32_at(16), u32_at(20));
    let body = &bytes[HEADER..];
    let total = [len, residuals_len, optimizer_len].into_iter().try_fold(extra_len, u64::checked_add);
    if total != Some(body.len() as u64) {
        return Err("cut short");
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&bytes[..HEADER - 4]);
    crc.update(body);
    if crc.finalize().to_le_bytes() != bytes[HEADER - 4..HEADER] {
        return Err("its checksum does not match");
    }
    let (checkpoint, rest) = body.split_at(len as usize);
    let (extra, rest) = rest.split_at(extra_len as usize);
    let (residuals, optimizer) = rest.split_at(residuals_len as usize);
    Ok(Commit { step, rank, ranks, extra, checkpoint, residuals, optimizer })
}

/// A folder of commits is the store's durability.
impl Durable for Folder {
    fn commit(&self, store: Seam<'_>, step: u64, extra: &[u8], before: Result<()>) -> Result<()> {
        self.commit_to(store, step, extra, before)
    }

    fn restore(&self, store: Seam<'_>) -> Result<Option<Restored>> {
        self.restore_from(store)
    }

    fn built(&self) {
        self.claim.keep();
    }
}

impl Folder {
    /// Commits now (the caller ordered it after the calls before it; `before`: whether
    /// this rank's calls before it went well): every rank writes its file, and once
    /// every rank did, marks the step done.
    fn commit_to(&self, store: Seam<'_>, step: u64, extra: &[u8], before: Result<()>) -> Result<()> {
        const OP: &str = "commit";
        store.check_step(OP)?;
        let group = store.peers();
        let (rank, ranks) = group.map_or((0, 1), |g| (g.rank(), g.size()));
        // Steps must grow: the two greatest are kept, so a smaller one would be removed
        // at once and a restart would go back to the greater. (Refused on every rank.)
        let newest = self.done_steps().map(|d| d.first().copied());
        let checked = before.and(newest).and_then(|newest| match newest {
            _ if step == u64::MAX => {
                Err(Error::invalid_argument(format!("commit of step {step}: a step must be below {}", u64::MAX)))
            }
            Some(newest) if step <= newest => Err(Error::invalid_argument(format!(
                "commit of step {step}: the job's newest commit is of step {newest}, and a commit's step must be \
                 greater (count the steps of the whole job, not of an epoch)"
            ))),
            _ => Ok(()),
        });
        // A dist_async rank's share has optimizer counters of its own.
        let optimizer = store.own_counters();
        let at = Writing { step, rank, ranks, alone: store.has_owners(), optimizer: &optimizer };
        // Every rank takes part in the writers' exchanges, whatever failed before.
        // A dist_sync rank snapshots the store whatever failed before: with owners, the
        // snapshot gathers the optimizer state from every rank.
        let written = match checked {
            Err(e) if store.has_owners() => self.write_commit(group, at, extra, Err(&e)),
            checked => {
                let mut wrote = false;
                let mut write = |snap: &Snapshot<'_>| {
                    wrote = true;
                    self.write_commit(group, at, extra, checked.as_ref().map(|()| snap))
                };
                let snapshot = match store.has_owners() {
                    // dist_sync with every rank on this host: each writes its own parts
                    // of the optimizer state (nothing is gathered); across hosts, each
                    // host's copy is whole, so that a host lost costs no state.
                    false => match self.host(group).is_ok_and(|host| host.len() == ranks) {
                        true => store.snapshot_in_parts(OP, &mut write),
                        false => store.whole_snapshot(OP, false, &self.gathered, &mut write),
                    },
                    // dist_async: the store as its owners hold it, gathered by the first
                    // rank of each host (no push runs: every rank is in this commit),
                    // which writes the host's copy alone; the others write their extra.
                    true => self.host(group).and_then(|host| {
                        store.whole_snapshot(OP, host.first() == Some(&rank), &self.gathered, &mut write)
                    }),
                };
                match (wrote, snapshot) {
                    (false, Err(e)) => self.write_commit(group, at, extra, Err(&e)),
                    (_, result) => result,
                }
            }
        };
        let context = format!("commit of step {step}");
        store.agree(OP, &context, written.as_ref().map(|_| 0).map_err(|_| ()), "could not write its commit")?;
        written?;
        // The mark: every rank of a host makes the same empty file (no temporary name,
        // which ranks in other process namespaces could share), and fails only as every
        // rank does. Pruning is cleanup: what it cannot remove is left for the next.
        let marked = OpenOptions::new()
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(self.done(step))
            .map(|_| ())
            .map_err(|e| io(format!("the mark {}", self.done(step).display()), e));
        store.agree(OP, &context, marked.as_ref().map(|_| 0).map_err(|_| ()), "could not mark its commit done")?;
        marked?;
        let _ = self.prune(rank);
        Ok(())
    }

    /// Restores the newest marked commit (see the module's docs), when the store has a
    /// job name: what it restored, or `None`.
    fn restore_from(&self, store: Seam<'_>) -> Result<Option<Restored>> {
        let began = std::time::Instant::now();
        let found = self.newest(store.peers().map_or(0, |g| g.rank()));
        let damaged = |why: String| Error::Io {
            context: "restore".to_string(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{why}; no older commit is whole either: remove the folder to start the job afresh"),
            ),
        };
        let passed_over = |why: &Option<Passed>, step: u64| {
            if let Some((_, why)) = why {
                say!("kvstore: {why}; restoring the commit of step {step} instead");
            }
        };
        let Some(group) = store.peers() else {
            return match found? {
                (Some((step, bytes)), why) => {
                    passed_over(&why, step);
                    self.restore_bytes(store, step, &bytes, began).map(Some)
                }
                (None, Some((_, why))) => Err(damaged(why)),
                (None, None) => Ok(None),
            };
        };
        // Each rank's newest step with a whole copy (0 for none, else step + 1), its
        // bytes' length, whether it could not read its commits (1: every rank then
        // fails, none restores) or passed over a newer one that is not whole (2), and
        // the step it passed over (plus 1).
        let mut said = [0u8; 25];
        match &found {
            Ok((whole, why)) => {
                if let Some((step, bytes)) = whole {
                    said[..8].copy_from_slice(&(step + 1).to_le_bytes());
                    said[8..16].copy_from_slice(&(bytes.len() as u64).to_le_bytes());
                }
                if let Some((passed, _)) = why {
                    said[16] = 2;
                    said[17..25].copy_from_slice(&(passed + 1).to_le_bytes());
                }
            }
            Err(_) => said[16] = 1,
        }
        let all = Said::of(group.exchange("restore", &said)?);
        let failed = all.ranks_where(|r| r.get(16) == Some(&1));
        let (mine, why) = found?;
        if !failed.is_empty() {
            return Err(Error::Io {
                context: "restore".to_string(),
                source: std::io::Error::other(format!(
                    "{} could not read the job's commits (the error on {} says why); no rank restored anything",
                    named(&failed),
                    if failed.len() == 1 { "that rank" } else { "those ranks" }
                )),
            });
        }
        let at = |r: usize, i: usize| all.word(r, i * 8);
        let newest = (0..all.len()).map(|r| at(r, 0)).max().unwrap_or(0);
        if newest == 0 {
            let passed = all.ranks_where(|r| r.get(16) == Some(&2));
            return match (passed.is_empty(), why) {
                (true, _) => Ok(None),
                (false, Some((_, why))) => Err(damaged(why)),
                (false, None) => Err(damaged(format!(
                    "{} found the job's commits, but no copy whole (the error on {} says why)",
                    named(&passed),
                    if passed.len() == 1 { "that rank" } else { "those ranks" }
                ))),
            };
        }
        let step = newest - 1;
        // A newer commit than the one restored that no rank has whole is said once
        // (rank 0 for all), with the ranks that passed over it. (A rank whose copy of the
        // step restored was not whole passed over no newer one: another rank's is.)
        let passed_at = |r: usize| all.word(r, 17);
        let newer: Vec<usize> = (0..all.len()).filter(|&r| passed_at(r) > newest).collect();
        if let Some(passed) = newer.iter().map(|&r| passed_at(r) - 1).max()
            && group.rank() == 0
        {
            say!(
                "kvstore: the commit of step {passed} has no whole copy ({} passed it over{}); restoring step {step}, \
                 the newest whole one",
                named(&newer),
                why.as_ref().filter(|(s, _)| *s > step).map_or(String::new(), |(_, w)| format!(": on rank 0, {w}"))
            );
        }
        // Every rank that has the step loads its own copy: the copies hold the same
        // values (every rank of a dist_sync job does), and the ranks compare what they
        // load by its contents' checksum, which does not depend on the order of a
        // copy's metadata (its process's). When a rank lacks the step (on a new host),
        // every rank loads the bytes of the lowest rank that has it.
        if (0..all.len()).all(|r| at(r, 0) == newest) {
            let (_, bytes) = mine.expect("this rank's commit");
            return self.restore_bytes(store, step, &bytes, began).map(Some);
        }
        let root = (0..all.len()).find(|&r| at(r, 0) == newest).expect("a rank with the newest");
        let mine = mine.filter(|_| group.rank() == root).map(|(_, bytes)| bytes).unwrap_or_default();
        let bytes = group.broadcast("restore-commit", mine, root)?;
        self.restore_bytes(store, step, &bytes, began).map(Some)
    }

    /// Loads the commit `bytes` of `step` into the store (`began`: when the restore began,
    /// for what rank 0 says) and forgets the marked commits after it. `extra` and the
    /// residuals are this rank's own record: the commit's when this rank wrote it, else
    /// the one beside it on this host, else one a rank of another host has
    /// ([`fetch_records`]); without one, the commit's `extra` and no residuals.
    fn restore_bytes(&self, store: Seam<'_>, step: u64, bytes: &[u8], began: std::time::Instant) -> Result<Restored> {
        let context = format!("restore of step {step}");
        let commit =
            decode(bytes).map_err(|why| Error::Io { context: context.clone(), source: std::io::Error::other(why) });
        // (A rank that cannot read it fails in the load, with every rank.)
        store.install(&context, commit.as_ref().map(|c| c.checkpoint).map_err(Error::clone))?;
        let commit = commit?;
        // Said once, by rank 0: what the job resumed from (kvstore-run's output shows it).
        if store.peers().is_none_or(|g| g.rank() == 0) {
            say!(
                "kvstore: restored the commit of step {step} ({:.1} MB) in {:.0} ms",
                bytes.len() as f64 / 1e6,
                began.elapsed().as_secs_f64() * 1e3
            );
        }
        let (rank, ranks) = store.peers().map_or((0, 1), |g| (g.rank(), g.size()));
        let mut own = match commit.rank == rank {
            true => Some(commit.record()),
            false => self.own_extra(step, rank),
        };
        self.forget_after(step);
        if let Some(group) = store.peers() {
            own = fetch_records(group, self, step, own)?;
        }
        // A rank's residuals are what its own pushes did not send: on another number of
        // ranks, the pushes are other ranks' too.
        let other_ranks = |then: usize| {
            say!(
                "kvstore: rank {rank}'s gradient-compression residuals of step {step} were of a job of {then} ranks, \
                 not {ranks}: they start again at zero"
            );
        };
        // A dist_async rank's share takes its own optimizer counters back on as many ranks
        // (it has the writing rank's share's, from the commit, otherwise).
        if store.has_owners() {
            let restored = match &own {
                Some(own) if own.ranks == ranks && !own.optimizer.is_empty() => {
                    store.restore_own_counters(&context, &own.optimizer)
                }
                _ if commit.optimizer.is_empty() => Ok(()),
                _ => {
                    let why = match &own {
                        Some(own) => format!("were of a job of {} ranks, not {ranks}", own.ranks),
                        None => "are on no host of the job".to_string(),
                    };
                    say!(
                        "kvstore: rank {rank}'s share's optimizer counters of step {step} {why}: it starts from rank \
                         {}'s",
                        commit.rank
                    );
                    Ok(())
                }
            };
            let what = "could not restore its share's optimizer state";
            store.agree("restore", &context, restored.as_ref().map(|_| 0).map_err(|_| ()), what)?;
            restored?;
        }
        // This rank's own record (its extra and residuals), else the commit's extra alone:
        // another rank's residuals are not this rank's.
        let Some(Record { extra, residuals, ranks: then, .. }) = own else {
            match (no_residuals(commit.residuals), commit.ranks == ranks) {
                (true, _) => {}
                (false, true) => say!(
                    "kvstore: rank {rank} has no record of its own of step {step} on any host of the job (it ran on \
                     a host the job lost): its gradient-compression residuals start again at zero"
                ),
                (false, false) => other_ranks(commit.ranks),
            }
            return Ok(Restored { step, extra: commit.extra.to_vec() });
        };
        match (no_residuals(&residuals), then == ranks) {
            (true, _) => {}
            (false, true) => {
                let damaged = || Error::Io {
                    context: context.clone(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "its residuals: not a list of residuals",
                    ),
                };
                store.set_residuals(&context, decode_residuals(&residuals).ok_or_else(damaged)?)?
            }
            (false, false) => other_ranks(then),
        }
        Ok(Restored { step, extra })
    }
}

#[cfg(test)]
mod tests {
    use super::{Record, decode, decode_residuals, encode_residuals, fields};

    #[test]
    fn residuals_read_back_and_bytes_that_are_not_residuals_are_refused() {
        let (w, b) = (vec![vec![0.25f32, -0.5, 1e-3], vec![]], vec![vec![f32::MIN_POSITIVE]]);
        let bytes = encode_residuals(&[("w", &w), ("bias", &b)]);
        let back = decode_residuals(&bytes).expect("residuals");
        assert_eq!(back, vec![("w".to_string(), w), ("bias".to_string(), b)]);
        assert_eq!(decode_residuals(&encode_residuals(&[])), Some(Vec::new()));
        assert_eq!(decode_residuals(&bytes[..bytes.len() - 1]), None, "cut short");
        assert_eq!(decode_residuals(&[&bytes[..], &[0]].concat()), None, "a byte too many");
        // A count of values that no file holds is refused, not allocated.
        let huge = [&1u32.to_le_bytes()[..], &1u32.to_le_bytes(), b"w", &1u32.to_le_bytes(), &u64::MAX.to_le_bytes()];
        assert_eq!(decode_residuals(&huge.concat()), None);
    }

    /// A commit's bytes, as `Folder::write_commit` lays them out.
    fn encode(step: u64, rank: usize, ranks: usize, extra: &[u8], checkpoint: &[u8]) -> Vec<u8> {
        let own = Record { extra: extra.to_vec(), residuals: Vec::new(), optimizer: b"{}".to_vec(), ranks };
        let fields = fields(step, rank, checkpoint.len() as u64, &own);
        let crc = crc32fast::hash(&[&fields[..], checkpoint, &own.bytes()].concat());
        [&fields[..], &crc.to_le_bytes(), checkpoint, &own.bytes()].concat()
    }

    #[test]
    fn a_commit_reads_back_and_a_changed_byte_is_refused() {
        let bytes = encode(7, 1, 3, b"loader at 7", b"the checkpoint");
        let c = decode(&bytes).expect("whole");
        assert_eq!((c.step, c.rank, c.extra, c.checkpoint), (7, 1, &b"loader at 7"[..], &b"the checkpoint"[..]));
        assert_eq!((c.ranks, c.residuals, c.optimizer), (3, &b""[..], &b"{}"[..]));
        for at in [0, 9, 30, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            assert!(decode(&bad).is_err(), "a flip at {at}");
        }
        assert!(decode(&bytes[..bytes.len() - 1]).is_err(), "cut short");
        let mut older = bytes.clone();
        older[..8].copy_from_slice(b"KVSTCMT3");
        assert_eq!(decode(&older).err(), Some("a commit of another version of kvstore"));
    }
}
