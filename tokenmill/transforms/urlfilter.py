"""URL block and allow lists: a document whose URL matches a block entry, and no allow entry, is
dropped as ``url:blocked`` before its HTML is extracted.

A list file holds one entry per line (a line starting with ``#`` is a comment; gzip and zstd
files are read too):

- ``re:<regex>``: searched in the whole URL (``re:^https?://[^/]*casino``);
- an entry with a ``/``: a URL prefix, matched without the scheme and a leading ``www.``
  (``example.com/ads/`` blocks ``https://www.example.com/ads/1``);
- anything else: a domain and all its subdomains (``example.com`` blocks ``a.example.com``).

Allow entries are exceptions to the block list (an allowed blog on a blocked host). A document
without a URL is never blocked. Domains are looked up per label suffix in a set and prefixes
per host, so a list of millions of domains costs a set lookup per label, not a scan (and only
the suffixes with no more labels than the longest listed domain: a URL of 100,000 labels costs
no more than a short one).

Regexes run on RE2 (``google-re2``), whose time is linear in the URL whatever the regex: a
regex that backtracks catastrophically in Python (``re:(a+)+$``) cannot stall the job. Its
syntax is Python's but for backreferences, lookarounds, possessive or atomic groups and ``\\Z``
(``\\z`` in RE2), which RE2 lacks: such a regex is refused before the job, in one line; and
``\\d \\w \\s \b`` are ASCII classes in RE2 (Python's are Unicode).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import re2

from tokenmill.errors import UserError
from tokenmill.transforms.doc import drop
from tokenmill.transforms.stage_base import Stage, StageFn, check
from tokenmill.transforms.userfiles import lines

STAGE = "url"

_RE2 = re2.Options()
_RE2.log_errors = False  # its errors become one UserError line, not C++ log lines on stderr


def _why(e: Exception) -> str:
    return e.args[0].decode("utf-8", "replace") if e.args and isinstance(e.args[0], bytes) else str(e)


def _re2_compile(pattern: str, where: str):
    """``pattern`` compiled by RE2, or a UserError line that says why not."""
    try:
        return re2.compile(pattern, _RE2)
    except re2.error as e:
        why = _why(e)
    try:
        re.compile(pattern)
    except re.error as e:
        raise UserError(f"{where}: bad regex {pattern!r} ({e})") from None
    raise UserError(f"{where}: regex {pattern!r} uses a feature RE2 does not support ({why}); URL regexes "
                    f"run on RE2, in linear time: no backreferences, lookarounds, possessive or atomic groups")


def _host_path(url: str) -> tuple[str, str]:
    """(host lower-cased without ``www.`` and port, the rest of the URL from its path on);
    ValueError for a malformed one (an unclosed IPv6 bracket, a character NFKC turns into /?#@:)."""
    parts = urlsplit(url.strip() if "://" in url else "//" + url.strip())
    host = (parts.hostname or "").rstrip(".")
    host = host[4:] if host.startswith("www.") else host
    rest = parts.path or "/"
    if parts.query:
        rest += "?" + parts.query
    return host, rest


class UrlList:
    """Domains, URL prefixes and regexes from list files; ``match(url)`` says whether any hits."""

    def __init__(self, entries: list[tuple[str, str, int]]):
        """``entries``: (entry, file, line) triples, for the one-line error on a bad regex."""
        self.domains: set[str] = set()
        self.prefixes: dict[str, list[str]] = {}
        patterns = []
        for entry, file, line in entries:
            if entry.startswith("re:"):
                _re2_compile(entry[3:], f"{file}:{line}")
                patterns.append(f"(?:{entry[3:]})")
            else:
                try:
                    host, rest = _host_path(entry)
                except ValueError as e:
                    raise UserError(f"{file}:{line}: {entry!r} is not a domain or URL prefix ({e})") from None
                if "/" in entry:
                    self.prefixes.setdefault(host, []).append(rest)
                else:
                    self.domains.add(host)
        # Only a suffix of at most this many labels can be a listed domain.
        self.max_labels = max((d.count(".") + 1 for d in self.domains), default=0)
        try:
            self.regex = re2.compile("|".join(patterns), _RE2) if patterns else None
        except re2.error as e:
            raise UserError(f"{', '.join(dict.fromkeys(f for _, f, _ in entries))}: {len(patterns)} re: entries, "
                            f"too large together for RE2 ({_why(e)}); fold them into fewer regexes") from None

    def __len__(self) -> int:
        return len(self.domains) + sum(map(len, self.prefixes.values())) + (self.regex is not None)

    def match(self, url: str, deadline: float | None = None) -> bool:
        try:
            host, rest = _host_path(url)
        except ValueError:  # a malformed URL: only the regexes can speak about it
            host, rest = "", ""
        # The host's suffixes of up to max_labels labels (a longer one cannot be listed).
        labels = host.rsplit(".", self.max_labels)
        if any(".".join(labels[i:]) in self.domains for i in range(len(labels) > self.max_labels, len(labels))):
            return True
        if any(rest.startswith(p) for p in self.prefixes.get(host, ())):
            return True
        check(deadline)
        return self.regex is not None and self.regex.search(url) is not None


def read_list(paths: list[str]) -> UrlList:
    """The entries of every file in ``paths`` as one list; a missing file is one line."""
    entries = []
    for path in paths:
        for n, line in lines(path, "url list"):
            entry = line.strip()
            if entry and not entry.startswith("#"):
                entries.append((entry, path, n))
    return UrlList(entries)


def blocked(url: str | None, block: UrlList, allow: UrlList | None, deadline: float | None = None) -> bool:
    """The pure core: whether a document with this URL is dropped (``deadline``: see deadline.check)."""
    if not url or not block.match(url, deadline):
        return False
    return allow is None or not allow.match(url, deadline)


class UrlFn(StageFn):
    stage = STAGE

    def setup(self):
        self._block = read_list(self.cfg.block_files)
        self._allow = read_list(self.cfg.allow_files) if self.cfg.allow_files else None

    def apply(self, doc: dict[str, Any]) -> dict[str, Any]:
        return drop(doc, STAGE, "blocked") if blocked(doc.get("url"), self._block, self._allow, self.deadline) else doc


# Before extraction: a blocked page is not parsed. Every list reads and every regex compiles
# before the job starts.
SPEC = Stage(STAGE, "url", UrlFn, check=lambda cfg, job: read_list(cfg.block_files + cfg.allow_files),
             reads=lambda cfg: {"url.block_files": cfg.block_files, "url.allow_files": cfg.allow_files})
