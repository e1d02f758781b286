//! A file's bytes mapped for writing (`Collective::map_file`): how a commit copies its
//! share of the store into its file in `/dev/shm`. There a `write` call costs about
//! three times a copy in memory (the kernel looks up, locks and marks each 4 KiB page),
//! so a rank copies into a shared mapping of its range instead.

use std::fs::File;
use std::os::fd::AsRawFd;

use kvstore_core::backend::MappedFile;

/// `len` bytes of `file` from `offset`, mapped shared and writable, with their blocks
/// allocated first (`fallocate`, which also grows the file to cover them): a file system
/// with no room says so here (`ENOSPC`) instead of a `SIGBUS` at the first write into a
/// page it cannot give. `file` must be open for reading and writing. A file system that
/// cannot allocate blocks ahead (`EOPNOTSUPP`: ramfs, some network file systems) gives
/// an error of kind `Unsupported`, and the caller writes instead.
pub(crate) fn map_for_writing(file: &File, offset: u64, len: usize) -> std::io::Result<MappedFile> {
    if len == 0 {
        return Ok(Box::new(Vec::new()));
    }
    let (start, count) = (i64::try_from(offset), i64::try_from(len));
    let (Ok(start), Ok(count)) = (start, count) else {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    };
    // SAFETY: fallocate reads no memory; the descriptor is open for as long as `file`.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, start, count) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) => std::io::Error::new(std::io::ErrorKind::Unsupported, e),
            _ => e,
        });
    }
    // SAFETY: the mapping is of a commit's file, in a folder of the user's alone
    // (`kvstore/commit.rs`), whose range only this rank writes while it is mapped, and
    // whose blocks were just allocated; no one of the job shortens a file that a rank
    // maps (the first rank sets its length before any rank maps it).
    let map = unsafe { memmap2::MmapOptions::new().offset(offset).len(len).populate().map_mut(file)? };
    Ok(Box::new(map))
}

#[cfg(test)]
mod tests {
    use super::map_for_writing;
    use std::io::Read;

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
