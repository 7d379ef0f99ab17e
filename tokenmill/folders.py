"""The folder a command writes into (`compare --output`, `train --run-dir`): made if absent, and
one line when it cannot be (a file or a link to one in its place, no permission, a full disk),
before any work that would be lost."""

from __future__ import annotations

import os

from tokenmill.errors import UserError


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
