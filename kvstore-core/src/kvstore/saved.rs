//! `save_checkpoint` in parts (`Store::save_in_parts`): under `dist_sync` with the
//! optimizer state on owners, when every rank can open the file rank 0 makes for the
//! save (a file system the ranks share), each rank writes its own parts of the state
//! into it and rank 0 the values and the header, so that no rank gathers the state or
//! writes another's part. The file is the one a whole save writes, byte for byte. Where
//! some rank cannot open it (a path on rank 0's own disk), the caller saves the whole
//! way, the state gathered (`checkpoint.rs`).

use std::fs::{File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use super::agree::{Said, ranks, word};
use super::checkpoint::Snapshot;
use super::data::Store;
use super::layout::Layout;
use crate::collective::{Collective, MAX_RECORD};
use crate::error::{Error, Result};
use crate::optimizer::states as opt_states;

/// The bytes of a tensor written at a time.
const PIECE: usize = 256 << 10;

impl Store {
    /// Saves the store to `path` in parts when every rank can open the file rank 0
    /// makes for it: `Ok(true)` once saved on every rank; `Ok(false)`, having changed
    /// nothing, for a store without owners or where a rank could not open it (the
    /// caller then saves the whole way). Every rank calls it at the same point.
    ///
    /// # Errors
    /// On every rank, where a rank could not write its parts or rank 0 finish the file
    /// (the file at `path` is then as it was before).
    pub(super) fn save_in_parts(&self, op: &'static str, path: &Path) -> Result<bool> {
        let Some(group) = self.collective.as_ref().filter(|g| self.layout == Layout::Owners && g.size() > 1) else {
            return Ok(false);
        };
        let Some(peers) = self.peers() else { return Ok(false) };
        let rank = group.rank();
        // 1. Rank 0 makes a temporary file beside the target and says which it is
        //    (device, inode, path); each other rank opens that file, checked by its
        //    device and inode, and every rank says whether it could.
        let made = match rank {
            0 => Some(opt_states::save_target(path, op).and_then(|target| {
                let (tmp, file) = opt_states::temp_file(&target, op)?;
                Ok((target, tmp, file))
            })),
            _ => None,
        };
        let told = match &made {
            Some(Ok((_, tmp, file))) => match file.metadata() {
                Ok(m) => {
                    [&[1u8][..], &m.dev().to_le_bytes(), &m.ino().to_le_bytes(), tmp.as_os_str().as_encoded_bytes()]
                        .concat()
                }
                Err(_) => vec![0],
            },
            _ => vec![0],
        };
        let told = peers.broadcast(&format!("{op} (file)"), told, 0)?;
        let file = match &made {
            Some(made) => made.as_ref().ok().and_then(|(_, _, f)| f.try_clone().ok()),
            None => open_told(&told),
        };
        let opened = Said::exchange(&**group, &format!("{op} (opened)"), &[u8::from(file.is_some())])?;
        let (Some(file), true) = (file, opened.ranks_where(|r| r.first() != Some(&1)).is_empty()) else {
            if let Some(Ok((_, tmp, _))) = &made {
                let _ = std::fs::remove_file(tmp);
            }
            return Ok(false);
        };
        let context = format!("{op} to {}", opt_states::shown(path));
        let io = |source: std::io::Error| Error::Io { context: context.clone(), source };
        // 2. Every rank writes its parts (rank 0 the whole tensors too); rank 0 the header
        //    and the file in place, once every rank has written.
        let mut wrote = false;
        let snapshot = self.snapshot(op, true, |snap| {
            wrote = true;
            write_parts(&**group, op, &file, Ok(snap)).map_err(io)
        });
        let written = match (wrote, snapshot) {
            // This rank could not even take its snapshot: it says so at each step.
            (false, Err(e)) => write_parts(&**group, op, &file, Err(())).map_err(io).and(Err(e)),
            (_, written) => written,
        };
        let finished = match (&made, written) {
            (Some(Ok((target, tmp, _))), Ok(())) => opt_states::finish_file(&file, tmp, target).map_err(io),
            (_, written) => written,
        };
        if let (Some(Ok((_, tmp, _))), Err(_)) = (&made, &finished) {
            let _ = std::fs::remove_file(tmp);
        }
        self.agree(op, &context, finished.as_ref().map(|()| 0).map_err(|_| ()), "could not write its parts")?;
        finished.map(|()| true)
    }
}

/// The file rank 0 said it made (`told`: made, device, inode, path), opened for writing
/// where it is the same file here; `None` where it is not, or cannot be opened.
fn open_told(told: &[u8]) -> Option<File> {
    if told.first() != Some(&1) || told.len() < 17 {
        return None;
    }
    let path = Path::new(std::ffi::OsStr::from_bytes(&told[17..]));
    let file = OpenOptions::new().write(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path).ok()?;
    let m = file.metadata().ok()?;
    (m.is_file() && m.dev() == word(told, 1) && m.ino() == word(told, 9)).then_some(file)
}

/// Every rank's writing of its parts of `snap` (`Err`: this rank has none to write, and
/// takes part in the ranks' exchanges only) into `file`, each hashed; then rank 0 joins
/// every rank's parts' CRC-32s into the header and writes it. Each rank's own failure,
/// or, on rank 0, that of any rank.
fn write_parts(
    group: &dyn Collective,
    op: &str,
    file: &File,
    snap: std::result::Result<&Snapshot<'_>, ()>,
) -> std::io::Result<()> {
    let rank = group.rank();
    // The header's length (it does not depend on the CRC-32s), the parted tensors.
    let laid = snap.ok().map(|snap| {
        let n = snap.count();
        let reserved = snap.header(&vec![crc32fast::Hasher::new(); n]).map(|h| h.len());
        (snap, reserved, (0..n).filter(|&i| snap.parts(i).is_some()).collect::<Vec<_>>())
    });
    // A. Rank 0 sizes the file; every rank says the header's length and the number of
    //    parted tensors, which must be the same everywhere.
    let sized = match &laid {
        Some((snap, Ok(reserved), parted)) => {
            let len = (reserved + snap.data_len()) as u64;
            let ok = rank != 0 || file.set_len(len).is_ok();
            [&[u8::from(ok)][..], &(*reserved as u64).to_le_bytes(), &(parted.len() as u64).to_le_bytes()].concat()
        }
        _ => vec![0; 17],
    };
    let said = Said::exchange(group, &format!("{op} (sized)"), &sized).map_err(std::io::Error::other)?;
    let agreed = said.ranks_where(|r| r.first() != Some(&1)).is_empty()
        && said.records().all(|r| word(r, 1) == word(&sized, 1) && word(r, 9) == word(&sized, 9));
    // B. Each rank writes its parts, each hashed; rank 0 the whole tensors too.
    let wrote = match (&laid, agreed) {
        (Some((snap, Ok(reserved), parted)), true) => write_own(file, snap, *reserved, parted, rank),
        _ => Err(std::io::Error::other("the ranks could not agree on the file's layout")),
    };
    // C. Every rank says whether it wrote; where all did, the parts' CRC-32s follow, in
    //    records of at most `MAX_RECORD` bytes (rank 0 needs them all).
    let said =
        Said::exchange(group, &format!("{op} (written)"), &[u8::from(wrote.is_ok())]).map_err(std::io::Error::other)?;
    let failed = said.ranks_where(|r| r.first() != Some(&1));
    let mut lists: Vec<Vec<u8>> = vec![Vec::new(); group.size()];
    if failed.is_empty() {
        let listed: Vec<u8> =
            wrote.as_ref().map_or(&[][..], |(mine, _)| mine).iter().flat_map(|c| c.to_le_bytes()).collect();
        for (k, part) in listed.chunks(MAX_RECORD).enumerate() {
            let got = Said::exchange(group, &format!("{op} (checksums {k})"), part).map_err(std::io::Error::other)?;
            for (list, got) in lists.iter_mut().zip(got.records()) {
                list.extend_from_slice(got);
            }
        }
    }
    let (_, whole) = wrote?;
    if !failed.is_empty() {
        return Err(std::io::Error::other(format!(
            "{} could not write its parts (its error says why)",
            ranks(&failed)
        )));
    }
    if rank != 0 {
        return Ok(());
    }
    // D. Rank 0: each parted tensor's CRC-32 from its parts', joined in their order.
    let Some((snap, Ok(reserved), parted)) = &laid else { return Err(std::io::Error::other("no snapshot")) };
    let mut crcs: Vec<crc32fast::Hasher> = whole.into_iter().map(Option::unwrap_or_default).collect();
    for (j, &i) in parted.iter().enumerate() {
        let each: Option<Vec<u32>> = lists
            .iter()
            .map(|l| l.get(4 * j..4 * j + 4).map(|b| u32::from_le_bytes(b.try_into().expect("4"))))
            .collect();
        crcs[i] = each.and_then(|each| snap.joined_crc(i, &each)).ok_or_else(|| {
            std::io::Error::other("the ranks' parts of a tensor and their checksums do not make it whole")
        })?;
    }
    let header = snap.header(&crcs).map_err(std::io::Error::other)?;
    if header.len() != *reserved {
        return Err(std::io::Error::other("the checkpoint's header changed length"));
    }
    file.write_all_at(&header, 0)
}

/// This rank's writing: its part of each parted tensor (their CRC-32s, in order) and,
/// on rank 0, each whole tensor (its CRC-32 at its index; `None` for the others).
fn write_own(
    file: &File,
    snap: &Snapshot<'_>,
    reserved: usize,
    parted: &[usize],
    rank: usize,
) -> std::io::Result<(Vec<u32>, Vec<Option<crc32fast::Hasher>>)> {
    let offsets = snap.offsets();
    let write = |at: usize, bytes: &[u8]| -> std::io::Result<crc32fast::Hasher> {
        let mut crc = crc32fast::Hasher::new();
        for (k, piece) in bytes.chunks(PIECE).enumerate() {
            file.write_all_at(piece, (reserved + at + k * PIECE) as u64)?;
            crc.update(piece);
        }
        Ok(crc)
    };
    let mut mine = Vec::with_capacity(parted.len());
    for &i in parted {
        let range = snap.parts(i).and_then(|p| p.get(rank)).cloned().unwrap_or_default();
        if snap.bytes(i).len() != range.len() {
            return Err(std::io::Error::other("this rank's part of a tensor is not the length its range says"));
        }
        mine.push(write(offsets[i] + range.start, snap.bytes(i))?.finalize());
    }
    let mut whole = vec![None; snap.count()];
    if rank == 0 {
        for i in (0..snap.count()).filter(|&i| snap.parts(i).is_none()) {
            whole[i] = Some(write(offsets[i], snap.bytes(i))?);
        }
    }
    file.sync_data()?;
    Ok((mine, whole))
}
