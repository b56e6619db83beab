//! Atomic file replacement for every `save` of the crate (see
//! docs/security.md, "Writing files").
//!
//! - The bytes go to a temporary file in the target's folder, are fsynced,
//!   then renamed over the target: a reader sees the old file or the new one,
//!   never a torn one, even after `kill -9`.
//! - Temporary names are unique per call (`.<name>.quantrs-tmp.<pid>.<seq>`,
//!   created with `O_EXCL`), so threads saving to one path never collide.
//! - Temporaries left by a killed process (same prefix, a pid that no longer
//!   runs, same owner) are removed by the next save to the same path.
//! - Only a regular file (or nothing) is replaced: a FIFO, a device, a socket
//!   or a folder at the path is an error.
//! - A symlink is followed: the file it points to is replaced and the link
//!   stays a link, as editors do.
//! - An existing file keeps its permission bits; a new file gets `0o666`
//!   minus the umask, like any file the process creates.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{QuantError, Result};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// An I/O error that names `path` (the kind, hence the Python `OSError`
/// subclass, is kept).
pub(crate) fn io_at(path: &Path, e: io::Error) -> QuantError {
    QuantError::Io(io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// Read a whole file; errors name the path.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(|e| io_at(path, e))
}

/// Follow `path` through symlinks (at most 40, like the kernel) to the file
/// that a write should replace.
fn resolve(path: &Path) -> Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = fs::read_link(&p).map_err(|e| io_at(&p, e))?;
                p = match p.parent() {
                    Some(dir) => dir.join(target),
                    None => target,
                };
            }
            _ => return Ok(p),
        }
    }
    Err(io_at(
        path,
        io::Error::other("too many levels of symbolic links"),
    ))
}

fn temp_prefix(file_name: &str) -> String {
    format!(".{file_name}.quantrs-tmp.")
}

/// Whether process `pid` still runs (Linux: `/proc/<pid>`). Elsewhere every
/// process counts as alive, so nothing is removed.
fn alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        Path::new(&format!("/proc/{pid}")).exists()
    } else {
        true
    }
}

/// Remove temporaries of `prefix` in `dir` whose writer is dead and whose
/// owner is `uid`. Best effort: errors are ignored.
fn remove_stale(dir: &Path, prefix: &str, uid: Option<u32>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let me = std::process::id();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
            continue;
        };
        let Some(pid) = rest.split('.').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me || alive(pid) {
            continue;
        }
        let Ok(m) = fs::symlink_metadata(e.path()) else {
            continue;
        };
        if m.is_file() && owner(&m) == uid {
            let _ = fs::remove_file(e.path());
        }
    }
}

#[cfg(unix)]
fn owner(m: &fs::Metadata) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    Some(m.uid())
}

#[cfg(not(unix))]
fn owner(_: &fs::Metadata) -> Option<u32> {
    None
}

fn create_temp(dir: &Path, prefix: &str) -> Result<(PathBuf, File)> {
    let pid = std::process::id();
    loop {
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!("{prefix}{pid}.{seq}"));
        let mut o = OpenOptions::new();
        o.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            o.mode(0o666);
        }
        match o.open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_at(&tmp, e)),
        }
    }
}

/// A file being written atomically: bytes go to a temporary next to the
/// target; [`commit`](Self::commit) renames it over the target, and dropping
/// it uncommitted deletes the temporary (see the module notes). For writers
/// that stream more than they want to hold in memory (the CLI's safetensors
/// writer); [`write`] is the one-call form.
pub struct AtomicFile {
    /// The path as given, for messages.
    path: PathBuf,
    /// Where the rename goes: `path` with symlinks followed.
    target: PathBuf,
    dir: PathBuf,
    prefix: String,
    tmp: PathBuf,
    /// `None` once committed or aborted.
    file: Option<File>,
    /// The permissions of the file being replaced, kept by the new one.
    keep_permissions: Option<fs::Permissions>,
}

impl AtomicFile {
    /// Open a fresh temporary for `path`; refuses a `path` that exists and
    /// is not a regular file (after following symlinks).
    pub fn create(path: &Path) -> Result<Self> {
        let target = resolve(path)?;
        let keep_permissions = match fs::metadata(&target) {
            Ok(m) if m.is_file() => Some(m.permissions()),
            Ok(_) => {
                return Err(io_at(
                    path,
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "refusing to replace something that is not a regular file",
                    ),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_at(path, e)),
        };
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let file_name = target
            .file_name()
            .ok_or_else(|| QuantError::arg(format!("path: {path:?} names no file")))?
            .to_string_lossy()
            .into_owned();
        let prefix = temp_prefix(&file_name);
        let (tmp, file) = create_temp(&dir, &prefix)?;
        Ok(Self {
            path: path.to_path_buf(),
            target,
            dir,
            prefix,
            tmp,
            file: Some(file),
            keep_permissions,
        })
    }

    /// The temporary the bytes go to until `commit` (the Python binding shows it).
    #[cfg(any(test, feature = "python"))]
    pub fn temp_path(&self) -> &Path {
        &self.tmp
    }

    /// Append `bytes` to the temporary.
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        let Some(f) = self.file.as_mut() else {
            return Err(QuantError::InvalidState(format!(
                "{}: the atomic write was already committed or aborted",
                self.path.display()
            )));
        };
        f.write_all(bytes).map_err(|e| io_at(&self.tmp, e))
    }

    /// Fsync the temporary and rename it over the target; then remove the
    /// temporaries dead writers left for the same target. On an error the
    /// temporary is deleted and the target is untouched.
    pub fn commit(mut self) -> Result<()> {
        let Some(f) = self.file.take() else {
            return Err(QuantError::InvalidState(format!(
                "{}: the atomic write was already committed or aborted",
                self.path.display()
            )));
        };
        let result = (|| -> Result<()> {
            if let Some(p) = self.keep_permissions.take() {
                f.set_permissions(p).map_err(|e| io_at(&self.tmp, e))?;
            }
            f.sync_all().map_err(|e| io_at(&self.tmp, e))?;
            let uid = f.metadata().ok().and_then(|m| owner(&m));
            drop(f);
            fs::rename(&self.tmp, &self.target).map_err(|e| io_at(&self.path, e))?;
            remove_stale(&self.dir, &self.prefix, uid);
            if let Ok(d) = File::open(&self.dir) {
                let _ = d.sync_all();
            }
            Ok(())
        })();
        if result.is_err() {
            let _ = fs::remove_file(&self.tmp);
        }
        result
    }

    /// Delete the temporary; the target is untouched. Doing nothing after a
    /// `commit` or an earlier `abort`.
    pub fn abort(&mut self) {
        if self.file.take().is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        self.abort();
    }
}

/// Write `bytes` to `path` atomically (see the module notes).
pub fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = AtomicFile::create(path)?;
    f.write_all(bytes)?;
    f.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "quantrs-atomic-{name}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("quantrs-tmp"))
            .collect()
    }

    #[test]
    fn threads_saving_to_one_path_all_succeed() {
        let d = scratch("threads");
        let p = d.join("x.bin");
        std::thread::scope(|s| {
            for i in 0..16u8 {
                let p = &p;
                s.spawn(move || write(p, &[i; 1000]).unwrap());
            }
        });
        let got = fs::read(&p).unwrap();
        assert_eq!(got.len(), 1000);
        assert!(got.iter().all(|&b| b == got[0]));
        assert!(leftovers(&d).is_empty());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn stale_temporaries_of_dead_processes_are_removed() {
        let d = scratch("stale");
        let p = d.join("x.bin");
        // pid 2**22 + 1 is above Linux's pid_max limit, so never alive.
        let dead = d.join(format!("{}4194305.0", temp_prefix("x.bin")));
        fs::write(&dead, b"junk").unwrap();
        let other = d.join(".y.bin.quantrs-tmp.4194305.0");
        fs::write(&other, b"junk").unwrap();
        write(&p, b"new").unwrap();
        assert!(!dead.exists());
        assert!(other.exists(), "a temporary of another path is not ours");
    }

    #[cfg(unix)]
    #[test]
    fn permissions_kept_and_symlink_followed() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let d = scratch("perm");
        let p = d.join("x.bin");
        fs::write(&p, b"old").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        let link = d.join("link.bin");
        symlink("x.bin", &link).unwrap();
        write(&link, b"new").unwrap();
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read(&p).unwrap(), b"new");
        let mode = fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn streamed_writes_commit_and_dropped_writers_leave_nothing() {
        let d = scratch("stream");
        let p = d.join("x.bin");
        fs::write(&p, b"old").unwrap();
        let mut f = AtomicFile::create(&p).unwrap();
        f.write_all(b"ab").unwrap();
        f.write_all(b"cd").unwrap();
        assert_eq!(
            fs::read(&p).unwrap(),
            b"old",
            "the target changes only at commit"
        );
        f.commit().unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"abcd");
        let mut g = AtomicFile::create(&p).unwrap();
        g.write_all(b"lost").unwrap();
        let tmp = g.temp_path().to_path_buf();
        assert!(tmp.exists());
        drop(g);
        assert!(!tmp.exists());
        assert_eq!(fs::read(&p).unwrap(), b"abcd");
        let mut h = AtomicFile::create(&p).unwrap();
        h.abort();
        assert!(h.write_all(b"x").is_err());
        assert!(leftovers(&d).is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn refuses_what_is_not_a_regular_file() {
        let d = scratch("fifo");
        let err = write(&d, b"x").unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        assert!(err.contains(&d.display().to_string()), "{err}");
        if Path::new("/dev/null").exists() {
            let err = write(Path::new("/dev/null"), b"x").unwrap_err().to_string();
            assert!(err.contains("/dev/null"), "{err}");
        }
    }
}
