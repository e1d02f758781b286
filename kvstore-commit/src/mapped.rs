//! A file's bytes mapped for writing: how a commit copies its share of the store into
//! its file in `/dev/shm`. There a `write` call costs about
//! three times a copy in memory (the kernel looks up, locks and marks each 4 KiB page),
//! so a rank copies into a shared mapping of its range instead.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

use parking_lot::Mutex;

/// Bytes of a file mapped for writing (the range lent, whole or in pieces:
/// [`MappedFile::pieces`]); kept for a later commit when dropped ([`KEPT`]).
pub(crate) type MappedFile = Lent;

/// How many mappings a process keeps for its next commits: a host's copies rotate
/// through three files (the two newest commits and the spare the next one writes over),
/// the same files, renamed.
const KEPT: usize = 3;

/// A mapping kept for a later commit of the same range of the same file.
struct Kept {
    /// The file's device and inode (an inode is not reused while a mapping holds its
    /// file).
    id: (u64, u64),
    /// Where the mapping begins in the file (a page's start): it covers the range asked
    /// for and [`SLACK`] bytes more, so that it serves a range that moved a little (a
    /// commit's headers grow as its counters do).
    start: u64,
    /// The file, open: whether it still has a name (else it is dropped at once).
    file: File,
    map: memmap2::MmapMut,
    /// The range lent, in the mapping.
    lent: std::ops::Range<usize>,
}

/// The bytes a mapping covers past the range it was made for. Past the file's end they
/// are never written (a lent range is allocated first) and never touched.
const SLACK: u64 = 1 << 16;

/// The mappings kept, the least recently used first. Mapping 157 MB with its page
/// tables filled took 9 ms and unmapping it 4 ms, a third of a commit's copy.
static KEPT_MAPS: Mutex<Vec<Kept>> = Mutex::new(Vec::new());

/// A kept mapping, lent to one commit; back to [`KEPT_MAPS`] when dropped. (`None`: an
/// empty range, nothing mapped.)
pub(crate) struct Lent(Option<Kept>);

impl Lent {
    /// The pieces `ranges` of the range lent (from its start; sorted, disjoint, inside
    /// it), each a slice of its own, for a rank whose range holds other ranks' bytes
    /// between its own (which it must not reference while they write them); `None`
    /// for ranges that are not so.
    pub(crate) fn pieces(&mut self, ranges: &[std::ops::Range<usize>]) -> Option<Vec<&mut [u8]>> {
        let lent = self.0.as_ref().map_or(0..0, |k| k.lent.clone());
        let mut end = 0;
        for r in ranges {
            if r.start < end || r.end < r.start || r.end > lent.len() {
                return None;
            }
            end = r.end;
        }
        let Some(kept) = self.0.as_mut() else { return Some(ranges.iter().map(|_| &mut [][..]).collect()) };
        let base = kept.map.as_mut_ptr();
        // SAFETY: each range lies inside the range lent, inside the mapping (checked
        // above), and no two overlap, so each slice is the only reference to its bytes;
        // they borrow `self` mutably, so the mapping outlives them and no other slice of
        // it is made meanwhile.
        Some(
            ranges
                .iter()
                .map(|r| unsafe { std::slice::from_raw_parts_mut(base.add(lent.start + r.start), r.len()) })
                .collect(),
        )
    }
}

impl std::ops::Deref for Lent {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.as_ref().map_or(&[], |k| &k.map[k.lent.clone()])
    }
}

impl std::ops::DerefMut for Lent {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.0.as_mut().map_or(&mut [], |k| &mut k.map[k.lent.clone()])
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(kept) = self.0.take() {
            let mut all = KEPT_MAPS.lock();
            all.push(kept);
            let over = all.len().saturating_sub(KEPT);
            all.drain(..over);
        }
    }
}

/// `len` bytes of `file` from `offset`, mapped shared and writable, with their blocks
/// allocated first (`fallocate`, which also grows the file to cover them): a file system
/// with no room says so here (`ENOSPC`) instead of a `SIGBUS` at the first write into a
/// page it cannot give. `file` must be open for reading and writing. A file system that
/// cannot allocate blocks ahead (`EOPNOTSUPP`: ramfs, some network file systems) gives
/// an error of kind `Unsupported`, and the caller writes instead.
///
/// The mapping is kept after its commit (up to [`KEPT`]), and a later call for the same
/// range of the same file (a host's spare, written over) gets it again; a kept mapping
/// whose file lost its name is dropped at the next call, so that no removed file's
/// memory stays in use.
pub(crate) fn map_for_writing(file: &File, offset: u64, len: usize) -> std::io::Result<MappedFile> {
    if len == 0 {
        return Ok(Lent(None));
    }
    let (at, count, end) = (i64::try_from(offset), i64::try_from(len), offset.checked_add(len as u64));
    let (Ok(at), Ok(count), Some(end)) = (at, count, end) else {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    };
    // SAFETY: fallocate reads no memory; the descriptor is open for as long as `file`.
    if !allocated(file, end) && unsafe { libc::fallocate(file.as_raw_fd(), 0, at, count) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) => std::io::Error::new(std::io::ErrorKind::Unsupported, e),
            _ => e,
        });
    }
    let m = file.metadata()?;
    let id = (m.dev(), m.ino());
    let covers = |k: &Kept| k.id == id && k.start <= offset && offset - k.start + len as u64 <= k.map.len() as u64;
    let found = {
        let mut all = KEPT_MAPS.lock();
        all.retain(|k| k.file.metadata().is_ok_and(|m| m.nlink() > 0));
        all.iter().position(covers).map(|i| all.remove(i))
    };
    if let Some(mut kept) = found {
        let from = (offset - kept.start) as usize;
        kept.lent = from..from + len;
        return Ok(Lent(Some(kept)));
    }
    let start = offset - offset % page();
    let span = usize::try_from(end - start + SLACK).map_err(std::io::Error::other)?;
    // SAFETY: the mapping is of a commit's file, in a folder of the user's alone
    // (`folder.rs`); this rank writes only the range lent, which no other rank
    // writes while it is lent (or, where other ranks write between this rank's bytes,
    // only its pieces of it, `Lent::pieces`, referenced apart), and whose blocks were
    // allocated above (again, for a kept
    // mapping: a file shortened and grown since has its pages back before any write);
    // no one of the job shortens a file while a rank writes into it (the first rank
    // sets its length before any rank maps it). Populating the pages past the file's
    // end (the slack) faults nothing: it stops at the end.
    let map = unsafe { memmap2::MmapOptions::new().offset(start).len(span).populate().map_mut(file)? };
    let from = (offset - start) as usize;
    Ok(Lent(Some(Kept { id, start, file: file.try_clone()?, map, lent: from..from + len })))
}

/// The size of a page of memory.
fn page() -> u64 {
    // SAFETY: sysconf reads no memory of ours.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1)
}

/// Whether every block of `file` up to `end` is allocated already, as a spare written
/// over has it: told only on tmpfs, which counts its pages in a file's blocks and nothing
/// else (`fallocate` there walks every page of the range, about 25 ms for 157 MB
/// allocated already, as long as the copy itself).
fn allocated(file: &File, end: u64) -> bool {
    let Ok(m) = file.metadata() else { return false };
    // SAFETY: fstatfs writes the struct it is given, which lives through the call.
    let tmpfs = unsafe {
        let mut fs: libc::statfs = std::mem::zeroed();
        libc::fstatfs(file.as_raw_fd(), &mut fs) == 0 && fs.f_type == libc::TMPFS_MAGIC
    };
    tmpfs && end <= m.size() && m.blocks().saturating_mul(512) >= m.size()
}

#[cfg(test)]
mod tests {
    use super::map_for_writing;
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("kvstore-mapped-{name}-{}", std::process::id()))
    }

    #[test]
    fn what_is_copied_into_the_map_is_in_the_file() {
        let path = temp("copied");
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        let mut map = map_for_writing(&file, 5000, 3).expect("mapped");
        map.copy_from_slice(b"abc");
        drop(map);
        let mut bytes = Vec::new();
        std::fs::File::open(&path).unwrap().read_to_end(&mut bytes).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(bytes.len(), 5003, "the file grew to cover the range");
        assert_eq!(&bytes[5000..], b"abc");
        assert!(bytes[..5000].iter().all(|&b| b == 0));
    }

    #[test]
    fn pieces_of_a_mapping_are_written_apart_and_overlapping_ones_refused() {
        let path = temp("pieces");
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        let mut map = map_for_writing(&file, 100, 10).expect("mapped");
        assert!(map.pieces(&[0..4, 3..6]).is_none(), "overlapping");
        assert!(map.pieces(&[4..6, 0..2]).is_none(), "out of order");
        assert!(map.pieces(std::slice::from_ref(&(8..11))).is_none(), "past the range lent");
        let mut pieces = map.pieces(&[1..3, 3..3, 6..9]).expect("pieces");
        pieces[0].copy_from_slice(b"ab");
        pieces[2].copy_from_slice(b"xyz");
        drop(map);
        let mut bytes = Vec::new();
        std::fs::File::open(&path).unwrap().read_to_end(&mut bytes).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(&bytes[100..110], b"\0ab\0\0\0xyz\0");
    }

    /// Maps 4 MiB of a file on a file system `kind` with `options`, mounted in a mount
    /// namespace of this test's thread alone; `None` where no namespace can be made.
    fn map_on(kind: &str, options: &str) -> Option<std::io::Result<()>> {
        use std::ffi::CString;
        // SAFETY: unshare and mount take no memory but these strings, alive for the calls.
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
            eprintln!("SKIP: no mount namespace of its own here ({})", std::io::Error::last_os_error());
            return None;
        }
        let dir = temp(kind);
        std::fs::create_dir_all(&dir).unwrap();
        let (root, target) = (CString::new("/").unwrap(), CString::new(dir.to_str().unwrap()).unwrap());
        let (kind, options) = (CString::new(kind).unwrap(), CString::new(options).unwrap());
        let null = std::ptr::null;
        // SAFETY: as above.
        let mounted = unsafe {
            libc::mount(null(), root.as_ptr(), null(), libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) == 0
                && libc::mount(kind.as_ptr(), target.as_ptr(), kind.as_ptr(), 0, options.as_ptr().cast()) == 0
        };
        assert!(mounted, "a file system in a namespace of its own: {}", std::io::Error::last_os_error());
        let path = dir.join("commit");
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        let mapped = map_for_writing(&file, 0, 4 << 20).map(drop);
        drop(file);
        // SAFETY: as above.
        unsafe { libc::umount(target.as_ptr()) };
        let _ = std::fs::remove_dir(&dir);
        Some(mapped)
    }

    /// A tmpfs of 1 MiB: a share of 4 MiB is refused with ENOSPC, where a mapping without
    /// its blocks would have killed the process (SIGBUS) at its first write past the room.
    #[test]
    fn a_file_system_with_no_room_is_an_error_not_a_fault() {
        let Some(mapped) = map_on("tmpfs", "size=1m") else { return };
        let e = mapped.expect_err("no room is an error");
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    }

    /// ramfs allocates no blocks ahead: the error says the caller must write instead.
    #[test]
    fn a_file_system_that_cannot_allocate_ahead_says_it_is_unsupported() {
        let Some(mapped) = map_on("ramfs", "") else { return };
        let e = mapped.expect_err("no allocation ahead");
        assert_eq!(e.kind(), std::io::ErrorKind::Unsupported, "{e}");
    }

    /// A second commit of the same range gets the kept mapping (the same memory), as does
    /// one of a range a few bytes on; one of
    /// a file removed since does not keep the removed file's memory.
    #[test]
    fn a_mapping_is_kept_for_the_same_range_and_dropped_once_its_file_is_removed() {
        let path = temp("kept");
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        let mut first = map_for_writing(&file, 4096, 8192).expect("mapped");
        first[..4].copy_from_slice(b"one.");
        let at = first.as_ptr();
        drop(first);
        let mut again = map_for_writing(&file, 4096, 8192).expect("mapped again");
        assert_eq!(again.as_ptr(), at, "the kept mapping");
        assert_eq!(&again[..4], b"one.");
        again[..4].copy_from_slice(b"two.");
        drop(again);
        // A range moved a little (a commit's headers grew) is in the kept mapping too.
        let moved = map_for_writing(&file, 4104, 8192).expect("mapped, moved");
        assert_eq!(moved.as_ptr(), at.wrapping_add(8), "the kept mapping, 8 bytes on");
        drop(moved);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[4096..4100], b"two.", "written through to the file");
        std::fs::remove_file(&path).unwrap();
        let other = temp("kept-other");
        let file2 =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&other).unwrap();
        drop(map_for_writing(&file2, 0, 4096).expect("mapped"));
        let kept = super::KEPT_MAPS.lock();
        let ino = file.metadata().unwrap().ino();
        assert!(kept.iter().all(|k| k.id.1 != ino), "the removed file's mapping was dropped");
        drop(kept);
        let _ = std::fs::remove_file(&other);
    }

    /// On tmpfs a file grown by its length alone has holes, which must be allocated
    /// before a mapping is written; once mapped through, it has none.
    #[test]
    fn a_tmpfs_file_with_holes_is_not_taken_for_allocated() {
        let path = std::path::Path::new("/dev/shm").join(format!("kvstore-mapped-holes-{}", std::process::id()));
        let Ok(file) = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path)
        else {
            eprintln!("SKIP: no /dev/shm here");
            return;
        };
        file.set_len(1 << 20).unwrap();
        let holes = super::allocated(&file, 1 << 20);
        drop(map_for_writing(&file, 0, 1 << 20).expect("mapped"));
        let whole = super::allocated(&file, 1 << 20);
        let beyond = super::allocated(&file, (1 << 20) + 1);
        let _ = std::fs::remove_file(&path);
        assert_eq!((holes, whole, beyond), (false, true, false));
    }

    #[test]
    fn a_file_open_only_for_reading_is_an_error_not_a_fault() {
        let path = temp("read-only");
        std::fs::write(&path, [0u8; 16]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let mapped = map_for_writing(&file, 0, 16);
        let _ = std::fs::remove_file(&path);
        assert!(mapped.is_err());
    }
}
