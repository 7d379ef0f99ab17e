"""Binary sniffing: bytes or text that are no HTML (images, archives, executables, random bytes)
are refused before any decoding or parsing is spent on them."""

from __future__ import annotations

import re

# File signatures of formats that are sometimes served or stored as text/html.
_MAGIC = (
    b"\x89PNG",
    b"%PDF",
    b"PK\x03\x04",
    b"PK\x05\x06",
    b"GIF87a",
    b"GIF89a",
    b"\xff\xd8\xff",
    b"\x1f\x8b",
    b"BZh",
    b"\xfd7zXZ\x00",
    b"7z\xbc\xaf",
    b"Rar!",
    b"\x28\xb5\x2f\xfd",
    b"OggS",
    b"ID3",
    b"fLaC",
    b"RIFF",
    b"\x7fELF",
    b"\x00asm",
    b"wOFF",
    b"wOF2",
    b"\xca\xfe\xba\xbe",
    b"%!PS",
    b"II*\x00",
    b"MM\x00*",
    b"\xd0\xcf\x11\xe0",
    b"\x00\x00\x01\x00",
    b"SQLite format",
)
# C0 controls that do not occur in text: everything below 0x20 except \t \n \v \f \r and ESC
# (ESC is how ISO-2022-JP switches character sets).
_CONTROL_BYTES = bytes(b for b in range(32) if b not in (9, 10, 11, 12, 13, 27))
_CONTROL_CHARS_RE = re.compile("[\x00-\x08\x0e-\x1a\x1c-\x1f]")
SNIFF = 8192


def utf16_without_bom(sample: bytes) -> str | None:
    """'utf-16-le'/'utf-16-be' when the NULs sit on every other byte, as in UTF-16 ASCII text."""
    even, odd = sample[0::2].count(0), sample[1::2].count(0)
    half = len(sample) // 2
    if half and odd > 0.7 * half and even < 0.05 * half:
        return "utf-16-le"
    if half and even > 0.7 * half and odd < 0.05 * half:
        return "utf-16-be"
    return None


def looks_binary(raw: bytes) -> bool:
    head = raw[:SNIFF]
    if head.startswith(_MAGIC) or head[4:12] in (b"ftypisom", b"ftypmp42", b"ftypM4A "):
        return True
    n_control = len(head) - len(head.translate(None, _CONTROL_BYTES))
    # Real HTML has practically none; random or compressed bytes have ~12%.
    return n_control > max(8, 0.01 * len(head)) and utf16_without_bom(head) is None


def looks_binary_text(text: str) -> bool:
    head = text[:SNIFF]
    return len(_CONTROL_CHARS_RE.findall(head)) > max(8, 0.01 * len(head))
