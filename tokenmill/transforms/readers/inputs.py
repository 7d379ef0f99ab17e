"""Step 1, at launch: files, folders and globs to the ``InputFile`` list, local symlinks resolved
so a file is read once, and what is found but not read counted. A file's name tells its reader."""

from __future__ import annotations

import errno
import logging
import os
import posixpath
import re
import stat
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from apache_beam.io.filesystem import FileSystem

from tokenmill.beamfs import FileSystems
from tokenmill.errors import UserError
from tokenmill.transforms.doc import path_text

from .formats import detect_format

log = logging.getLogger("tokenmill")

GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class InputFile:
    path: str  # what is opened: the real path of a local file (symlinks resolved), or a URL
    # The path as found, relative to the input root: the id of whole-file records, and the
    # name that tells the format. Bytes of a name that are not UTF-8 are written \\xNN.
    rel: str
    size: int


@dataclass(frozen=True)
class InputScan:
    files: list[InputFile]
    # Found but not read, by reason: the launcher puts it in the report. broken_link,
    # not_regular_file, no_reader, unreadable, output_folder (see _SKIPS); duplicate: a file
    # reached again under another spelling or link (read once); duplicate_folder: a folder
    # reached again through a symlink (walked once); symlink_loop: a symlinked folder that
    # holds the link itself (not walked), or a link that never reaches a file (ELOOP).
    skipped: dict[str, int] = field(default_factory=dict)


# The error for a file the user named that is not read, by reason.
_SKIPS = {
    "broken_link": "a broken symbolic link",
    "symlink_loop": "a loop of symbolic links (it never reaches a file)",
    "not_regular_file": "not a regular file (a FIFO, device or socket: never opened, a FIFO would hang)",
    "no_reader": "no reader for this file type (WARC/WET/ARC, JSONL, Parquet, HTML, txt)",
    "unreadable": "cannot be read (permission denied)",
    "output_folder": "inside the output folder",
}


def _glob_root(pattern: str) -> str:
    """The folder above the first glob character: ids are relative to it."""
    cut = min(i for i, ch in enumerate(pattern) if ch in GLOB_CHARS)
    if "/" not in pattern[:cut]:
        return "."
    return pattern[:cut].rsplit("/", 1)[0] or "/"


def _rel(path: str, root: str) -> str:
    root = root.rstrip("/")
    if root in ("", ".") and not path.startswith("/"):
        return path
    if path.startswith(root + "/"):
        return path[len(root) + 1 :]
    return posixpath.basename(path)


def resolve_inputs(patterns: list[str]) -> list[InputFile]:
    """The files to read (see ``scan_inputs``)."""
    return scan_inputs(patterns).files


def scan_inputs(patterns: list[str], exclude: Sequence[str] = ()) -> InputScan:
    """Expand files, folders (recursively) and globs; raise UserError for a path that matches
    nothing, and for a named file that cannot be read. A local file is known by its real path, so
    it is read once however many spellings or symlinks reach it; nothing under a folder of
    ``exclude`` (the output folder) is taken, even through a symlink."""
    files: dict[str, InputFile] = {}
    skipped: Counter[str] = Counter()
    excluded = [os.path.realpath(p) for p in exclude if "://" not in p]
    for given in patterns:
        if "://" in given:
            pattern = given
            root, found = _remote_entries(pattern)
        else:
            pattern = os.path.normpath(given)  # ./x and a/../a/x are x: one id
            root, found = _local_entries(pattern, excluded, skipped)
        if not found:
            raise UserError(_not_found(given, pattern, excluded))
        named = len(found) == 1 and found[0][0] == pattern
        taken = 0
        for path, real, size, why in found:
            why = why or ("no_reader" if detect_format(path) is None else None)
            if why and named:
                raise UserError(f"input {given}: {_SKIPS[why]}")
            taken += why is None
            if why is None and real in files:
                why = "duplicate"
            if why:
                skipped[why] += 1
            else:
                files[real] = InputFile(path=real, rel=path_text(_rel(path, root)), size=size)
        if not taken:
            raise UserError(f"input {given}: no readable files (WARC/WET/ARC, JSONL, Parquet, HTML, txt)")
    if skipped:
        log.warning("inputs: not read: %s", ", ".join(f"{n} {why}" for why, n in sorted(skipped.items())))
    return InputScan(sorted(files.values(), key=lambda f: f.path), dict(skipped))


def _not_found(given: str, pattern: str, excluded: list[str]) -> str:
    """The error for an input that gave no file: an existing folder is not "not found"."""
    if "://" in given or not os.path.isdir(pattern):
        return f"input not found: {given}"
    if _under(os.path.realpath(pattern), excluded):
        return f"input {given}: {_SKIPS['output_folder']} (choose another --output)"
    return f"input {given}: a folder with no files in it"


_Entry = tuple[str, str, int, str | None]  # path as found, real path, size, why it is skipped


def _remote_entries(pattern: str) -> tuple[str, list[_Entry]]:
    if any(ch in GLOB_CHARS for ch in pattern):
        root, matched = _glob_root(pattern), _match(pattern)
    elif pattern.endswith("/"):
        root, matched = pattern.rstrip("/"), _match(pattern.rstrip("/") + "/**")
    else:
        root, matched = posixpath.dirname(pattern), _match(pattern)
        matched = [m for m in matched if m[0] == pattern] or matched
    return root, [(path, path, size, None) for path, size in matched]


def _match(pattern: str) -> list[tuple[str, int]]:
    try:
        result = FileSystems.match([pattern])[0]
    except Exception:  # Beam raises BeamIOError for a missing path on some filesystems
        return []
    return [(m.path, m.size_in_bytes) for m in result.metadata_list]


def _local_entries(pattern: str, excluded: list[str], skipped: Counter[str]) -> tuple[str, list[_Entry]]:
    """The local paths ``pattern`` names, with Beam's glob syntax (``*`` within a folder,
    ``**`` across folders), without folders."""
    # A name that exists as it is written is that file or folder, whatever its characters
    # (a file named "a[1].jsonl" would otherwise be a glob that does not match itself).
    if any(ch in GLOB_CHARS for ch in pattern) and not os.path.lexists(pattern):
        root = _glob_root(pattern)
        match = re.compile(FileSystem.translate_pattern(pattern)).match
        below = pattern if root == "." else pattern[len(root) :].lstrip("/")
        depth = None if "**" in below else below.count("/")
        paths = [(p, real) for p, real in _walk(root, depth, excluded, skipped) if match(p)]
    elif os.path.isdir(pattern):
        root, paths = pattern, list(_walk(pattern, None, excluded, skipped))
    else:
        root, paths = os.path.dirname(pattern), [(pattern, None)] if os.path.lexists(pattern) else []
    return root, [(p, *_local_file(p, excluded, real)) for p, real in sorted(paths)]


def _under(real: str, folders: list[str]) -> bool:
    return any(real == d or real.startswith(d.rstrip("/") + "/") for d in folders)


def _walk(root: str, depth: int | None, excluded: list[str], skipped: Counter[str]) -> Iterator[tuple[str, str | None]]:
    """Every entry below ``root`` that is not a folder, at most ``depth`` folders down (None: all),
    with its real path where it is not a symlink (its folder's real path and its name: resolving
    each of 60,000 files' paths again was a tenth of a second per 5,000 files, on the launcher's
    path to the first bundle). Symlinked folders are followed once, after the real ones: a folder
    whose real path was walked already, or one that holds the very link to it (a loop), is
    counted, not walked again."""
    seen: set[str] = set()
    todo, links = [(root, 0, "")], []
    while todo or links:
        folder, d, parent = todo.pop() if todo else links.pop()
        real = os.path.realpath(folder)
        why = ("symlink_loop" if _under(parent, [real]) else "duplicate_folder" if real in seen
               else "output_folder" if _under(real, excluded) else None)
        if why:
            skipped[why] += 1
            continue
        seen.add(real)
        try:
            with os.scandir(folder) as it:
                entries = sorted((e.name, _is_dir(e), e.is_symlink()) for e in it)
        except OSError:
            skipped["unreadable"] += 1
            continue
        prefix = "" if folder == "." else folder.rstrip("/") + "/"
        for name, is_dir, is_link in reversed(entries):
            if not is_dir:
                yield prefix + name, None if is_link else os.path.join(real, name)
            elif depth is None or d < depth:
                (links if is_link else todo).append((prefix + name, d + 1, real))


def _is_dir(entry: os.DirEntry) -> bool:
    """Whether an entry is a folder, links followed. One that cannot be resolved (a loop of
    links: ELOOP) is not: as a file it is then counted, not the whole folder unreadable."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def _local_file(path: str, excluded: list[str], real: str | None = None) -> tuple[str, int, str | None]:
    """(real path, size, why it is skipped or None) for a local path that is not a folder
    (``real``: its real path, when known already)."""
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return path, 0, "symlink_loop"
        return path, 0, "broken_link" if os.path.islink(path) else "unreadable"
    real = real or os.path.realpath(path)
    if _under(real, excluded):
        return real, 0, "output_folder"
    if not stat.S_ISREG(st.st_mode):
        return real, 0, "not_regular_file"
    if not os.access(path, os.R_OK):
        return real, 0, "unreadable"
    return real, st.st_size, None
