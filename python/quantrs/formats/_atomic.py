"""Atomic file replacement for the CLI, with the same rules (and the same
temporary names) as the Rust writer in ``src/atomic.rs``; see docs/security.md.

- bytes go to ``.<name>.quantrs-tmp.<pid>.<seq>`` in the target's folder
  (created with ``O_EXCL``: unique per call, so threads never collide), are
  fsynced, then renamed over the target;
- the next write to the same path removes temporaries of that name whose
  process is dead and whose owner is the current user;
- only a regular file (or nothing) is replaced: a FIFO, a device or a folder is
  an ``OSError`` naming the path;
- a symlink is followed (the file it points to is replaced, the link stays);
- an existing file keeps its permission bits; a new file gets ``0o666`` minus
  the umask.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
from pathlib import Path

_SEQ = itertools.count()


def temp_prefix(name: str) -> str:
    return f".{name}.quantrs-tmp."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


class AtomicFile:
    """``open()`` a temporary next to ``path``; ``commit()`` renames it over
    ``path``; ``abort()`` deletes it."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.target = Path(os.path.realpath(self.path))
        try:
            st = os.stat(self.target)
        except FileNotFoundError:
            self.mode = None
        else:
            if not stat.S_ISREG(st.st_mode):
                raise OSError(
                    errno.EINVAL,
                    "refusing to replace something that is not a regular file",
                    str(self.path),
                )
            self.mode = stat.S_IMODE(st.st_mode)
        self.prefix = temp_prefix(self.target.name)
        while True:
            tmp = self.target.parent / f"{self.prefix}{os.getpid()}.{next(_SEQ)}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                continue
            break
        self.tmp = tmp
        self.file = os.fdopen(fd, "wb")

    def commit(self) -> None:
        f = self.file
        f.flush()
        if self.mode is not None:
            os.fchmod(f.fileno(), self.mode)
        os.fsync(f.fileno())
        uid = os.fstat(f.fileno()).st_uid
        f.close()
        os.replace(self.tmp, self.target)
        self._remove_stale(uid)

    def abort(self) -> None:
        if not self.file.closed:
            self.file.close()
        self.tmp.unlink(missing_ok=True)

    def _remove_stale(self, uid: int) -> None:
        try:
            entries = list(os.scandir(self.target.parent))
        except OSError:
            return
        me = os.getpid()
        for e in entries:
            if not e.name.startswith(self.prefix):
                continue
            pid_text = e.name[len(self.prefix) :].split(".")[0]
            if not pid_text.isdigit():
                continue
            pid = int(pid_text)
            if pid == me or _alive(pid):
                continue
            try:
                st = e.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_uid == uid:
                    os.unlink(e.path)
            except OSError:
                pass
