//! How the store makes the files it writes (timelines, flight records, merged traces,
//! state files): never through a symbolic link, readable by their user alone
//! (0600), and, where another user could guess the name, either created exclusively or
//! refused when a file of that name is not this user's own regular file, so that a
//! link or a file planted in a shared folder is never written through.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
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
    // Another name of the same file may be in a place of another user's.
    if m.nlink() != 1 {
        let why = format!("it has {} names (hard links), not one", m.nlink());
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, why));
    }
    if m.mode() & 0o777 != 0o600 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(file)
}

/// A name beside `path` for a file written whole before it is renamed to `path`:
/// unique in this process (`.NAME.PID.N.writing`), made with [`create_new`].
pub(crate) fn temp_beside(path: &Path) -> std::path::PathBuf {
    static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.{n}.writing", std::process::id()))
}

/// Renames `temp` to `path`, unless `path` is there and not this process's user's (a
/// link or file another user made: root could replace it even in a sticky folder).
pub(crate) fn rename_over_own(temp: &Path, path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.uid() != uid()? => {
            let why = format!("{} belongs to user {}, not to this process's user", path.display(), m.uid());
            Err(io::Error::new(io::ErrorKind::PermissionDenied, why))
        }
        Ok(_) => std::fs::rename(temp, path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => std::fs::rename(temp, path),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // A second name (hard link) of a file is refused, the file kept; a file of this
        // user's of another mode is made 0600.
        std::fs::hard_link(&target, dir.join("second")).expect("a hard link");
        assert_eq!(create_own(&dir.join("second")).expect_err("2 names").kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(std::fs::read(&target).expect("the file"), b"keep");
        std::fs::set_permissions(dir.join("own"), std::fs::Permissions::from_mode(0o644)).expect("0644");
        drop(create_own(&dir.join("own")).expect("own"));
        assert_eq!(std::fs::metadata(dir.join("own")).expect("own").permissions().mode() & 0o777, 0o600);
        // Renamed over: a name of this user's is replaced, another user's is not.
        let temp = temp_beside(&dir.join("own"));
        assert_ne!(temp, temp_beside(&dir.join("own")), "unique");
        drop(create_new(&temp).expect("temp"));
        rename_over_own(&temp, &dir.join("own")).expect("replaced");
        if uid().expect("uid") == 0 {
            drop(create_new(&temp).expect("temp"));
            let e = rename_over_own(&temp, &dir.join("theirs")).expect_err("theirs");
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
            assert_eq!(std::fs::read(dir.join("theirs")).expect("theirs"), b"theirs");
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
