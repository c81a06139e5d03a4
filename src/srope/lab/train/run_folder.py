"""One run per folder: ``srope train`` holds an exclusive lock on its ``--out`` for the whole run.

The lock is ``fcntl.flock`` on ``DIR/.lock``, which holds the holder's pid. The kernel drops it
when the process ends, however it ends, so a lock file left by a killed run blocks nothing.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = ".lock"


class FolderInUse(OSError):
    """Another process holds the run folder."""


class RunFolder:
    """``with RunFolder(out) as folder:`` makes ``out`` if it is missing (``folder.created``;
    ``folder.created_root``: the outermost folder that making it made, which a failed start
    removes) and locks it until the block ends. ``lock=False`` (the other ranks of a
    distributed run) does neither."""

    def __init__(self, path: Path, *, lock: bool = True):
        self.path, self.lock, self.created, self.created_root, self._fd = Path(path), lock, False, None, None

    def __enter__(self) -> "RunFolder":
        if not self.lock:
            return self
        missing = [p for p in (self.path.absolute(), *self.path.absolute().parents) if not p.exists()]
        try:
            self.path.mkdir(parents=True)
            self.created, self.created_root = True, missing[-1] if missing else self.path
        except FileExistsError:
            pass
        self._fd = _acquire(self.path / LOCK_FILE)
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            (self.path / LOCK_FILE).unlink(missing_ok=True)  # still held: nobody else has it now
            os.close(self._fd)
            self._fd = None


def _acquire(path: Path) -> int:
    """Lock ``path`` (made if missing) and write our pid into it; the open descriptor holds the lock."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise FolderInUse(
                f"{path.parent} is in use by another run (pid {holder}, lock {path}): wait for it to end, or choose another --out"
            ) from None
        if _same_file(fd, path):
            break
        os.close(fd)  # the holder removed the file between our open and our lock: lock the new one
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _same_file(fd: int, path: Path) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


def used_entries(folder: Path) -> list[str]:
    """The names in ``folder`` besides the lock file ([] when it is missing)."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.name != LOCK_FILE)
