//! How the store makes the files it writes (timelines, flight records, merged traces,
//! state files, commits): never through a symbolic link, readable by their user alone
//! (0600), and, where another user could guess the name, either created exclusively or
//! refused when a file of that name is not this user's own regular file, so that a
//! link or a file planted in a shared folder is never written through.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// This process's user: the owner of its `/proc/self`.
pub(crate) fn uid() -> io::Result<u32> {
    Ok(std::fs::metadata("/proc/self")?.uid())
}

/// Creates `path` to write, exclusively (it must not exist, not even as a link), 0600.
pub(crate) fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// Opens `path` to write it afresh (emptied), created 0600 when it does not exist; a
/// link is not followed, and a file that is not a regular file of this process's user
/// is refused, with what it is instead (nothing of it is changed).
pub(crate) fn create_own(path: &Path) -> io::Result<File> {
    let file = open_own(path)?;
    file.set_len(0)?;
    Ok(file)
}

/// [`create_own`], its contents kept (to write on where it ends).
pub(crate) fn open_own(path: &Path) -> io::Result<File> {
    // O_NONBLOCK: a FIFO put there is opened without waiting for a reader, and refused.
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let m = file.metadata()?;
    let me = uid()?;
    if !m.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "it is not a regular file"));
    }
    if m.uid() != me {
        let why = format!("it belongs to user {}, not to this process's user {me}", m.uid());
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, why));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn folder(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kvstore-files-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a folder");
        dir
    }

    #[test]
    fn files_are_made_0600_and_links_are_never_written_through() {
        let dir = folder("links");
        let target = dir.join("target");
        std::fs::write(&target, b"keep").expect("a file");
        let link = dir.join("link");
        std::os::unix::fs::symlink(&target, &link).expect("a link");
        assert_eq!(create_own(&link).expect_err("a link").raw_os_error(), Some(libc::ELOOP));
        assert!(create_new(&link).is_err());
        assert!(create_new(&target).is_err(), "exclusive");
        assert_eq!(std::fs::read(&target).expect("the file"), b"keep");
        for (name, make) in [("new", create_new as fn(&Path) -> io::Result<File>), ("own", create_own)] {
            let path = dir.join(name);
            drop(make(&path).expect("made"));
            assert_eq!(std::fs::metadata(&path).expect("made").permissions().mode() & 0o777, 0o600, "{name}");
        }
        // Another user's file (one root can make) is refused, and kept as it was.
        if uid().expect("uid") == 0 {
            let theirs = dir.join("theirs");
            std::fs::write(&theirs, b"theirs").expect("a file");
            std::os::unix::fs::chown(&theirs, Some(65534), None).expect("chown");
            assert_eq!(create_own(&theirs).expect_err("theirs").kind(), io::ErrorKind::PermissionDenied);
            assert_eq!(std::fs::read(&theirs).expect("theirs"), b"theirs");
        }
        // A file of this user's is emptied; a FIFO is refused without waiting.
        std::fs::write(dir.join("own"), b"old").expect("written");
        drop(create_own(&dir.join("own")).expect("own"));
        assert_eq!(std::fs::read(dir.join("own")).expect("own"), b"");
        let fifo = dir.join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo").success());
        // (With no reader, the open itself fails: ENXIO.)
        assert!(create_own(&fifo).is_err(), "a FIFO");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
