"""Files parsed by native code are tried in a child process first.

fastText (C++) and HF tokenizers (Rust) trust the files they load: a crafted fastText model of a
few hundred bytes kills the process with SIGFPE or SIGSEGV, and a crafted tokenizer.json makes
Rust panic (``pyo3_runtime.PanicException`` is a BaseException, and Rust prints its own lines
to stderr first). A model or tokenizer the user names, or that comes inside a folder someone
else made, is therefore loaded and exercised once in a child: a crash or a panic there becomes
one line naming the file, and the parent loads it only once the child has. The lid.176.ftz
shipped inside tokenmill is not tried (it is the package's own).

    python -m tokenmill.native fasttext PATH     # load, predict
    python -m tokenmill.native tokenizer < JSON  # load, encode (with and without special tokens), decode
"""

from __future__ import annotations

import functools
import hashlib
import os
import signal
import subprocess
import sys

from tokenmill.errors import UserError

TIMEOUT_S = 120.0
# What each kind of file is called in an error line: (the library that reads it, the file).
_NAMES = {"fasttext": ("fastText", "fastText model"), "tokenizer": ("tokenizers", "Hugging Face tokenizer.json")}
_PROBE_TEXT = ("Hello, world! Ünïcödé 中文 テスト 123 4.56 <b>tag</b> \t tabs\nnew line  "
               "https://example.com/a?b=c e-mail@example.com 😀 " * 4)


def _fasttext(path: str) -> None:
    import fasttext

    model = fasttext.load_model(path)  # a file that does not load: its error is the line
    try:  # only a crash is this check's (see _tokenizer)
        model.predict(_PROBE_TEXT.replace("\n", " "), k=-1, threshold=-1.0)
        model.predict("", k=1)
    except Exception:  # noqa: BLE001
        pass


def _tokenizer(text: str) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(text)  # a file that does not load: its error is the line
    # Used as the pipeline and the trainer use it. An ordinary error here (a WordLevel model
    # without an unknown token meets an unknown word) is the real run's to report, in its own
    # words; only a panic (a BaseException) or a crash is this check's.
    try:
        ids = tok.encode(_PROBE_TEXT).ids + tok.encode(_PROBE_TEXT, add_special_tokens=False).ids
        tok.encode_batch([_PROBE_TEXT, "", " "])
        tok.decode(ids)
    except Exception:  # noqa: BLE001
        pass
    # Every token alone (the first 65,536): a decoder may fail on one token's own text.
    try:
        tok.decode_batch([[i] for i in range(min(tok.get_vocab_size(with_added_tokens=True), 1 << 16))])
    except Exception:  # noqa: BLE001
        pass


def _run(kind: str, arg: str | None, data: bytes | None, what: str, shown: str) -> None:
    """Run the child; ``what``: the setting or role named in an error, ``shown``: the file, if any."""
    said = f"{what}: {shown}" if shown else what
    library, file = _NAMES[kind]
    try:
        r = subprocess.run([sys.executable, "-m", "tokenmill.native", kind, *([arg] if arg else [])], input=data,
                           capture_output=True, timeout=TIMEOUT_S, env={**os.environ, "RUST_BACKTRACE": "0"})
    except subprocess.TimeoutExpired:
        raise UserError(f"{said} did not load within {TIMEOUT_S:.0f} s") from None
    if r.returncode < 0:
        try:
            name = signal.Signals(-r.returncode).name
        except ValueError:
            name = f"signal {-r.returncode}"
        raise UserError(f"{said} crashed {library} while loading ({name}): not a valid {file}")
    if r.returncode != 0:
        lines = [ln for ln in r.stdout.decode("utf-8", "replace").splitlines() if ln.strip()]
        raise UserError(f"{said} is not a {file} ({lines[-1] if lines else f'exit {r.returncode}'})")


@functools.lru_cache(maxsize=32)
def _checked_model(path: str, size: int, mtime_ns: int, what: str) -> None:
    _run("fasttext", path, None, what, path)


def check_fasttext(path: str, what: str) -> None:
    """Load and use the fastText model at the local ``path`` in a child; UserError if it fails or crashes."""
    st = os.stat(path)
    _checked_model(os.path.abspath(path), st.st_size, st.st_mtime_ns, what)


_CHECKED_TOKENIZERS: set[str] = set()


def check_tokenizer_json(text: str, what: str, shown: str) -> None:
    """Load and use a tokenizer.json (its text) in a child; UserError if it fails or panics."""
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    if digest in _CHECKED_TOKENIZERS:
        return
    _run("tokenizer", None, text.encode("utf-8", "surrogatepass"), what, shown)
    _CHECKED_TOKENIZERS.add(digest)


def tokenizer_from_text(text: str, what: str = "tokenizer", shown: str = "", checked: bool = False):
    """A ``tokenizers.Tokenizer`` from tokenizer.json text, tried in a child first unless
    ``checked`` (a worker whose launcher tried it); one UserError line if it does not load."""
    from tokenizers import Tokenizer

    if not checked:
        check_tokenizer_json(text, what, shown)
    try:
        return Tokenizer.from_str(text)
    except Exception as e:  # the Rust side raises a plain Exception on a bad file
        msg = str(e).strip().splitlines()
        raise UserError(f"{what}: not a Hugging Face tokenizer.json ({msg[0] if msg else type(e).__name__})") from None


def load_tokenizer(path: str, what: str = "tokenizer"):
    """``Tokenizer.from_file(path)`` for a file that may come from someone else (see the module docstring)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{what}: cannot read {path} ({getattr(e, 'strerror', None) or e})") from None
    return tokenizer_from_text(text, what, path)


def _child(argv: list[str]) -> int:
    kind = argv[0]
    try:
        if kind == "fasttext":
            _fasttext(argv[1])
        else:
            _tokenizer(sys.stdin.buffer.read().decode("utf-8", "surrogatepass"))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - a Rust panic is a BaseException
        msg = str(e).strip().splitlines()
        print(f"{type(e).__name__}: {msg[0] if msg else ''}"[:300], flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
