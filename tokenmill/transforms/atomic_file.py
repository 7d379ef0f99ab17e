"""Output files written under a temporary name beside their final path and renamed into place
only when complete, so a reader never sees half a file. A retried bundle replaces the earlier
attempt's file (same rows, same bytes); a failed one deletes its temporary file.

On an object store an object appears only once its upload completes, so a file is written
under its final name (no copy, no delete: a "rename" there is both), and a failed one's upload
is aborted (beamfs.abort_write): nothing appears."""

from __future__ import annotations

import contextlib
import uuid

from tokenmill import store
from tokenmill.beamfs import FileSystems, abort_write


class TempFile:
    def __init__(self, path: str):
        self.path = path
        self.tmp = path if store.remote(path) else f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        self.fh = FileSystems.create(self.tmp)

    def _close(self) -> None:
        if not getattr(self.fh, "closed", False):
            self.fh.close()

    def commit(self) -> None:
        self._close()
        if self.tmp == self.path:
            return
        if FileSystems.exists(self.path):  # a retried bundle: the earlier attempt wrote the same bytes
            FileSystems.delete([self.path])
        FileSystems.rename([self.tmp], [self.path])

    def abandon(self) -> None:
        """After a failure: close and delete the temporary file, quietly (the failure is the news)."""
        if self.tmp == self.path:
            abort_write(self.fh)
            return
        with contextlib.suppress(Exception):
            self._close()
        with contextlib.suppress(Exception):
            FileSystems.delete([self.tmp])
