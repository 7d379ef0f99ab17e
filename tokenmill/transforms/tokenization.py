"""Tokenization with Hugging Face ``tokenizers`` (Rust): training, loading, batched encoding.

The tokenizer travels through the pipeline as its JSON string (a single-element side input),
whether it was trained on a bounded sample of the cleaned documents or loaded from the user's
``tokenizer.json``: workers rebuild it once (``Encoder``) and encode in batches with
``encode_batch``, which runs in Rust threads outside the GIL.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa

from tokenmill import native
from tokenmill.errors import UserError
from tokenmill.transforms.doc import drop
from tokenmill.transforms.stage_base import CombineOnce, Stage, Stash, count

EOS, BOS, PAD, UNK = "<|endoftext|>", "<|bos|>", "<|pad|>", "<unk>"
# Common EOS spellings, tried in order when a user's tokenizer is loaded and none is named.
EOS_CANDIDATES = (EOS, "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "[SEP]")
MAX_VOCAB = 2**32


def build_trainer_and_tokenizer(kind: str, vocab_size: int, min_frequency: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if kind == "bpe":
        # Byte-level BPE: every string encodes without <unk> and decodes back byte for byte.
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                      special_tokens=[EOS, BOS, PAD],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=[EOS, BOS, PAD, UNK], show_progress=False)
    elif kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=[EOS, BOS, PAD, UNK],
                                          unk_token=UNK, show_progress=False)
    else:
        raise UserError(f"tokenizer kind must be bpe, wordpiece or unigram, got {kind!r}")
    return tok, trainer


def train_tokenizer(texts: Iterable[str], vocab_size: int = 32000, kind: str = "bpe", min_frequency: int = 2):
    if not 256 < vocab_size < MAX_VOCAB:
        raise UserError(f"vocab_size must be between 257 and 2^32, got {vocab_size}")
    tok, trainer = build_trainer_and_tokenizer(kind, vocab_size, min_frequency)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def tokenizer_from_json(text: str, where: str = "tokenizer", checked: bool = False):
    """The Tokenizer of a tokenizer.json text, tried in a child process first unless ``checked``
    (tokenmill.native: a crafted file can panic Rust)."""
    return native.tokenizer_from_text(text, where, checked=checked)


def read_tokenizer_json(path: str) -> str:
    """The JSON text of the user's tokenizer, not parsed (``check_tokenizer`` does that once per
    job: parsing a large vocabulary is slow, bench/MEASUREMENTS.md); one clear error line if
    unreadable."""
    from tokenmill.beamfs import FileSystems

    try:
        with FileSystems.open(path) as fh:
            data = fh.read()
    except Exception as e:
        why = ("no such file" if isinstance(e, FileNotFoundError) or not FileSystems.exists(path)
               else getattr(e, "strerror", None) or str(e))  # "Is a directory", not the errno and path again
        raise UserError(f"tokenize.tokenizer: cannot read {path} ({why})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"tokenize.tokenizer: {path} is not a tokenizer.json (not UTF-8 text at byte {e.start})") from None


def check_tokenizer(path: str, eos_token: str | None) -> None:
    """The user's tokenizer loads and has what the shards need (an EOS token, ids that fit
    uint32): parsed once."""
    text = read_tokenizer_json(path)
    tokenizer_info(text, eos_token, tokenizer_from_json(text, f"tokenize.tokenizer {path}"))


def find_eos(tok, eos_token: str | None) -> int:
    names = [eos_token] if eos_token else list(EOS_CANDIDATES)
    for name in names:
        tid = tok.token_to_id(name)
        if tid is not None:
            return tid
    raise UserError(f"tokenizer has no EOS token (tried {', '.join(names)}); set tokenize.eos_token")


def tokenizer_info(tok_json: str, eos_token: str | None = None, tok=None) -> dict[str, Any]:
    """What the manifest and the shard metadata say about the tokenizer (``tok``: the
    Tokenizer already built from ``tok_json``, if the caller has it). The tokenizer is one the
    job trained or one the launcher's check_tokenizer tried in a child: not tried again."""
    tok = tok or tokenizer_from_json(tok_json, checked=True)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if vocab > MAX_VOCAB:
        raise UserError(f"tokenizer vocab of {vocab:,} does not fit in uint32 token ids")

    def tid(name: str) -> int | None:
        return tok.token_to_id(name)

    return {
        "sha256": hashlib.sha256(tok_json.encode("utf-8")).hexdigest(),
        "vocab_size": vocab,
        "eos_id": find_eos(tok, eos_token),
        "bos_id": next((i for i in (tid(BOS), tid("<s>"), tid("<|begin_of_text|>")) if i is not None), None),
        "pad_id": next((i for i in (tid(PAD), tid("<pad>"), tid("[PAD]")) if i is not None), None),
        "model": type(tok.model).__name__,
    }


def token_dtype(vocab_size: int) -> np.dtype:
    if vocab_size <= 2**16:
        return np.dtype(np.uint16)
    if vocab_size <= MAX_VOCAB:
        return np.dtype(np.uint32)
    raise UserError(f"vocab of {vocab_size:,} does not fit in uint32 token ids")


def encode_texts(tok, texts: list[str], eos_id: int, dtype: np.dtype) -> list[np.ndarray]:
    """Token ids of each text with EOS appended, as compact arrays (cheap to ship between workers).
    ``encode_batch_fast`` gives the same ids without character offsets: faster than
    ``encode_batch``, and less held per worker (bench/MEASUREMENTS.md: encode_batch_fast)."""
    encs = tok.encode_batch_fast(texts, add_special_tokens=False)
    out = []
    for e in encs:
        tokens = e.ids  # a new Python list at each access
        ids = np.empty(len(tokens) + 1, dtype=dtype)
        ids[:-1] = tokens
        ids[-1] = eos_id
        out.append(ids)
    return out


class Encoder:
    """A tokenizer JSON ready to encode batches of documents: built once per worker."""

    def __init__(self, tok_json: str, eos_token: str | None):
        self.json = tok_json
        tok = tokenizer_from_json(tok_json, checked=True)  # the launcher tried it (check_tokenizer)
        self.info = tokenizer_info(tok_json, eos_token, tok)
        self.dtype = token_dtype(self.info["vocab_size"])
        self._tok, self._eos = tok, self.info["eos_id"]
        self._unk = next((tok.token_to_id(t) for t in (UNK, "[UNK]", "<unk>") if tok.token_to_id(t) is not None), None)

    def encode(self, docs: list[dict]) -> list[np.ndarray | None]:
        """Tokens of each document (EOS appended); sets ``n_tokens`` and ``n_unk`` on it. A
        document the tokenizer panics on (Rust: a pre-tokenizer regex past the regex engine's
        retry limit, say) gets None and is dropped as ``tokenize:tokenizer_error``, one log line
        each; the batch's other documents are encoded as ever. An ordinary error (a WordLevel
        model without an unknown token) is the tokenizer's, not the document's: the job fails."""
        try:
            ids_list = encode_texts(self._tok, [d["text"] for d in docs], self._eos, self.dtype)
        except BaseException as e:  # noqa: BLE001 - pyo3's PanicException is a BaseException
            if not _panic(e):
                raise
            ids_list = [self._one(d) for d in docs]
        for d, ids in zip(docs, ids_list):
            if ids is None:
                continue
            d["n_tokens"] = len(ids)
            # Tokens the vocabulary could not cover (always 0 for byte-level BPE).
            d["n_unk"] = int((ids == self._unk).sum()) if self._unk is not None else 0
        done = [ids for ids in ids_list if ids is not None]
        count("tokenize.in", len(docs))
        count("tokenize.out", len(done))
        count("tokenize.tokens", sum(len(i) for i in done))
        return ids_list

    def _one(self, doc: dict) -> np.ndarray | None:
        try:
            return encode_texts(self._tok, [doc["text"]], self._eos, self.dtype)[0]
        except BaseException as e:  # noqa: BLE001 - see encode
            if not _panic(e):
                raise
            drop(doc, "tokenize", "tokenizer_error")
            count("dropped.tokenize:tokenizer_error")
            logging.getLogger("tokenmill").warning("tokenize: the tokenizer panicked on %s (%s); dropped",
                                                   doc.get("id"), str(e).splitlines()[0][:200])
            return None


def _panic(e: BaseException) -> bool:
    """A panic inside Rust code (pyo3 raises it as ``pyo3_runtime.PanicException``)."""
    return type(e).__name__ == "PanicException"


# ---------------------------------------------------------------- Beam wrapper


def sample_key(doc: dict) -> tuple[bytes, str]:
    """Deterministic sample order: by a hash of the id, so the sample does not depend on the runner."""
    return hashlib.blake2b(str(doc["id"]).encode("utf-8"), digest_size=8).digest(), doc["id"]


class SampleItem(NamedTuple):
    """A candidate for the tokenizer's training sample: what travels instead of its text."""

    key: tuple  # the sample is the smallest keys (a hash of the id, then ties)
    chars: int
    where: tuple[str, int, int]  # its frame in the candidate files: (file, offset, length)


def sample_prefix(items: list[SampleItem], max_docs: int, max_chars: int,
                  keep_stopper: bool = False) -> list[SampleItem]:
    """The longest smallest-key prefix of (key, characters, where) items with at most
    ``max_docs`` items and ``max_chars`` characters (at least one item). ``keep_stopper``: also
    the first item that did not fit, for cuts of a part: then every item of the whole corpus's
    prefix, and the item that ends it, are in its own part's cut, so parts cut, merged and cut
    again give the same sample in any order (a runner's bundling cannot change the tokenizer)."""
    items = sorted(items)
    total = 0
    for i, (_, chars, _) in enumerate(items[:max_docs]):
        total += chars
        if total > max_chars and i > 0:
            return items[:i + 1] if keep_stopper else items[:i]
    return items[:max_docs]


def unique_texts(texts: Iterable[str]) -> Iterator[str]:
    """Each exact copy of a text once, streamed (the sample is drawn before dedup)."""
    seen: set[bytes] = set()
    for text in texts:
        h = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        if h not in seen:
            seen.add(h)
            yield text


class SampleFn(beam.CombineFn):
    """A lifted combine over (key, characters, where) records: each worker keeps only its own
    bounded prefix. Only these small records travel; the texts stay in the candidate files."""

    def __init__(self, max_docs: int, max_chars: int):
        self.max_docs, self.max_chars = max_docs, max_chars

    def create_accumulator(self):
        return {"items": [], "chars": 0}

    def _cut(self, acc):
        acc["items"] = sample_prefix(acc["items"], self.max_docs, self.max_chars, keep_stopper=True)
        acc["chars"] = sum(chars for _, chars, _ in acc["items"])
        return acc

    def add_input(self, acc, item):
        acc["items"].append(item)
        _, chars, _ = item
        acc["chars"] += chars
        # Cut back at 2x the documents or 1.25x the characters: a sort per many items, not per item.
        if len(acc["items"]) >= 2 * self.max_docs or acc["chars"] >= 1.25 * self.max_chars:
            self._cut(acc)
        return acc

    def merge_accumulators(self, accs):
        return self._cut({"items": [i for a in accs for i in a["items"]], "chars": 0})

    def extract_output(self, acc):
        return sample_prefix(acc["items"], self.max_docs, self.max_chars)


class TrainOnSample(beam.PTransform):
    """(sample_key, characters, where) records -> a bounded sample (``n_docs`` documents and
    ``n_chars`` characters at most, smallest keys first) -> one trained tokenizer JSON string.
    ``read(where)`` gives a text back: the texts are streamed into the trainer in key order, never
    held all at once."""

    def __init__(self, n_docs: int, n_chars: int, vocab_size: int, kind: str, min_frequency: int, read):
        super().__init__()
        self.n_docs, self.n_chars, self.read = n_docs, n_chars, read
        self.vocab_size, self.kind, self.min_frequency = vocab_size, kind, min_frequency

    def expand(self, samples):
        return (
            samples
            | "Sample" >> CombineOnce(SampleFn(self.n_docs, self.n_chars))
            | "Train" >> beam.Map(self._train)
        )

    def _train(self, sample: list) -> str:
        texts = unique_texts(self.read(where) for _, _, where in sorted(sample))
        try:
            return train_tokenizer(texts, self.vocab_size, self.kind, self.min_frequency).to_str()
        finally:
            close = getattr(self.read, "close", None)
            if close:
                close()


SAMPLE = "sample"  # the clean phase's output of tokenizer sample candidates (pipelines/phases.StashFn)


class SampleStash(Stash):
    """The clean phase's last step, when a tokenizer is to be trained: where a live document's
    text waits, as a ``SampleItem`` (the sample travels as small records)."""

    tag = SAMPLE

    def __init__(self, max_chars: int):
        self._max_chars = max_chars

    def place(self, taken: None, doc: dict, loc) -> SampleItem:
        chars = min(len(doc.get("text") or ""), self._max_chars)
        # The content hash (the Locator's tie) breaks ties between records that share an id: a
        # file name would not be the same from one run to the next.
        return SampleItem((*sample_key(doc), loc.tie), chars, (loc.file, loc.offset, loc.length))


def _check(cfg, job) -> None:
    if cfg.tokenizer:
        check_tokenizer(cfg.tokenizer, cfg.eos_token)


SPEC = Stage("tokenize", "tokenize", phase="later", fields=lambda cfg: [pa.field("n_tokens", pa.int32())],
             check=_check, report={"n_tokens": (0.0, 6.0, 24, True)},
             stash=lambda cfg, job: None if cfg.tokenizer else SampleStash(cfg.train_max_chars),
             refilter="rerun", derived=("n_tokens",))
