"""The folder a command writes into (`compare --output`, `train --run-dir`): made if absent, and
one line when it cannot be (a file or a link to one in its place, no permission, a full disk),
before any work that would be lost."""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from tokenmill.errors import UserError

LOCK_NAME = ".tokenmill.lock"


def output_folder(path: str, flag: str) -> str:
    """``path`` as a folder this process can write to; one UserError line naming ``flag`` if not."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UserError(f"{flag} {path} exists and is not a folder")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UserError(f"{flag} {path}: cannot create the folder ({e.strerror})") from None
    probe = os.path.join(path, f".write-test-{os.getpid()}")
    try:  # a real write: os.access says yes to root on a read-only folder
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise UserError(f"{flag} {path}: cannot write there ({e.strerror})") from None
    return path


def take_lock(folder: str, command: str, flag: str, instead: str) -> int:
    """Hold ``folder`` for this process (an flock on FOLDER/.tokenmill.lock, which holds the pid)
    until the returned descriptor is closed or the process ends; one UserError line naming the
    holder when another process holds it. The lock file is opened without following a link."""
    lock = os.path.join(folder, LOCK_NAME)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UserError(f"{flag} {lock} is a symbolic link; tokenmill does not write through links "
                            "(remove it)") from None
        raise UserError(f"{flag} cannot write {folder} ({e.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"{flag} {lock} is not a regular file (remove it)")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
        os.close(fd)
        raise UserError(f"{flag} {folder} is in use by another tokenmill {command} (pid {holder}); "
                        f"wait for it or choose another {instead}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd
