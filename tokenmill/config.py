"""The one validated job configuration: YAML file, then ``--set section.key=value`` overrides.

Every stage owns one section with an ``enabled`` flag. Unknown keys and bad values are
rejected here, before any pipeline is built, as one readable line.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from tokenmill.config_load import deep_merge, format_validation_error, load_validated, parse_set  # noqa: F401

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


# Help: each field's ``description`` is its one line of help, printed by `tokenmill config`
# (config_doc.py) above the key; a section's is the field's in JobConfig.
class Section(Strict):
    enabled: bool = Field(default=True, description="Run this stage.")


class TimedSection(Section):
    # A stage that works on each document's text (transforms/stage_base.py).
    timeout_s: float = Field(default=5.0, gt=0, description="Wall-clock budget per document; past it the document is "
        "dropped as <stage>:timeout (checked cooperatively between the stage's passes, as extract.timeout_s is, so it "
        "works on every runner).")


class ReadConfig(Section):
    enabled: bool = Field(default=True, description="Always on: the read stage cannot be disabled.")
    text_field: str = Field(default="text", min_length=1, description="The text field of JSONL and Parquet records.")
    id_field: str = Field(default="id", min_length=1, description="The id field of JSONL and Parquet records.")
    url_field: str = Field(default="url", min_length=1, description="The URL field of JSONL and Parquet records.")
    html_field: str | None = Field(default="html", description="A field holding raw HTML; used (and extracted) when "
        "the text field is absent or empty.")
    max_record_bytes: int = Field(default=20_000_000, gt=0, description="A record bigger than this is dropped as "
        "read:too_large without being held in memory.")
    split_bytes: int = Field(default=32 * 1024 * 1024, gt=0, description="Splittable inputs (uncompressed JSONL, "
        "Parquet) are cut into units of about this size, so one big file is read by many workers.")
    max_inflated_bytes: int = Field(default=256 * 1024 * 1024, gt=0, description="A compressed input (gzip, zstd) may "
        "inflate to at most max(max_inflated_bytes, max_inflate_ratio x its compressed size); past it the rest of the "
        "file is one row, read:inflate_limit.")
    max_inflate_ratio: float = Field(default=100.0, gt=1, description="See max_inflated_bytes. Real text inflates "
        "3-10x; a small gzip of newlines 1000x.")
    warc_content_types: list[str] = Field(default=["text/html", "application/xhtml+xml", "text/plain"], description="WARC/ARC: "
        "only response/resource/conversion records of these media types are read.")

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
    # Entry syntax: transforms/urlfilter.py.
    enabled: bool = Field(default=False, description="On once block_files are given.")
    block_files: list[str] = Field(default=[], description="Block lists: files of domains, URL prefixes and re: "
        "regexes; documents matching one are url:blocked.")
    allow_files: list[str] = Field(default=[], description="Exceptions to the block list, same syntax.")

    @model_validator(mode="after")
    def _needs_a_list(self) -> UrlConfig:
        return _on_with(self, "block_files", "url")


class ExtractConfig(Section):
    max_html_bytes: int = Field(default=5_000_000, gt=0, description="Pages larger than this (raw bytes) are dropped "
        "as extract:too_large: parse time is linear in size, so this bounds the time any single page can take in the C "
        "parser.")
    timeout_s: float = Field(default=5.0, gt=0, description="Wall-clock budget for the Python part of one page; past "
        "it the page is dropped as extract:timeout (checked cooperatively in the tree walk, so it works on every "
        "runner).")
    include_title: bool = Field(default=False, description="Put the page <title> as the first line of the text.")


class NormalizeConfig(TimedSection):
    fix_unicode: bool = Field(default=True, description="ftfy: mojibake, bad escapes, control characters.")
    straight_quotes: bool = Field(default=True, description="Curly quotes and apostrophes to ASCII ' and \".")
    collapse_whitespace: bool = Field(default=True, description="Runs of spaces collapsed, line breaks kept.")
    unicode_form: Literal["NFC", "NFKC", "none"] = Field(default="NFC", description="Unicode normal form.")
    # The seed recipes' destructive steps: opt-in only.
    ascii_only: bool = Field(default=False, description="Drop every character that is not ASCII (destructive).")
    lowercase: bool = Field(default=False, description="Lower-case the text (destructive).")
    drop_short_words: bool = Field(default=False, description="Drop words of 1-2 letters (destructive).")


class LanguageConfig(Section):
    model: str | None = Field(default=None, description=(
        "A fastText model file (lid.176.bin, GlotLID, ...). null: lid.176.ftz, shipped in tokenmill/models/."))
    keep: list[str] = Field(default=[], description="Languages to keep (ISO 639-1 where one exists). Empty: keep every "
        "language, only label.")
    threshold: float = Field(default=0.65, ge=0.0, le=1.0, description="A document of a kept language whose label "
        "scores below this is dropped.")
    thresholds: dict[str, float] = Field(default={}, description="Per-language thresholds that override the global "
        "one, e.g. {en: 0.8}.")
    max_chars: int = Field(default=4000, gt=0, description="The model sees at most this many characters of a document: "
        "the cost is linear in length and the label is settled long before.")

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
    enabled: bool = Field(default=True, description="Apply these rules.")


class GopherConfig(_Rules):
    min_words: int = Field(default=50, ge=0, description="Fewer words: dropped.")
    max_words: int = Field(default=100_000, gt=0, description="More words: dropped.")
    min_mean_word_len: float = Field(default=3.0, ge=0, description="Shorter mean word length: dropped "
        "(space-separated languages only).")
    max_mean_word_len: float = Field(default=10.0, gt=0, description="Longer mean word length: dropped (idem).")
    max_symbol_word_ratio: float = Field(default=0.1, ge=0, description="More '#' per word, or more ellipses per "
        "word: dropped (two ratios, each bounded).")
    max_bullet_lines: float = Field(default=0.9, ge=0, le=1, description="A larger share of lines starting with a "
        "bullet: dropped.")
    max_ellipsis_lines: float = Field(default=0.3, ge=0, le=1, description="A larger share of lines ending in an "
        "ellipsis: dropped.")
    min_alpha_words: float = Field(default=0.8, ge=0, le=1, description="A smaller share of words with a letter: "
        "dropped.")
    min_stop_words: int = Field(default=2, ge=0, description="Fewer distinct words of the language's stop-word list: "
        "dropped (languages with a list only).")


class RepetitionConfig(_Rules):
    dup_line_frac: float = Field(default=0.3, ge=0, le=1, description="A larger share of duplicate lines: dropped.")
    dup_para_frac: float = Field(default=0.3, ge=0, le=1, description="A larger share of duplicate paragraphs: "
        "dropped.")
    dup_line_char_frac: float = Field(default=0.2, ge=0, le=1, description="A larger share of characters in duplicate "
        "lines: dropped.")
    dup_para_char_frac: float = Field(default=0.2, ge=0, le=1, description="A larger share of characters in duplicate "
        "paragraphs: dropped.")
    top_ngram_fracs: list[float] = Field(default=[0.20, 0.18, 0.16], min_length=3, max_length=3, description="For n = "
        "2, 3, 4: a larger share of characters in the most frequent n-gram: dropped.")
    dup_ngram_fracs: list[float] = Field(default=[0.15, 0.14, 0.13, 0.12, 0.11, 0.10], min_length=6, max_length=6,
                                         description="For n = 5..10: a larger share of characters in "
                                         "duplicate n-grams: dropped.")


class C4Config(_Rules):
    drop_lorem_ipsum: bool = Field(default=True, description='Drop pages with "lorem ipsum" (with remove_lines or '
        'compat: on a line the line rules keep, as C4\'s code checks it).')
    drop_curly_bracket: bool = Field(default=True, description='Drop pages with "{" (code, templates; idem).')
    drop_javascript: bool = Field(default=True, description=(
        'Where lines stay (remove_lines off), a short page that mentions javascript is a "please enable JavaScript" '
        'stub: dropped. With remove_lines, C4 removes the line instead.'))
    javascript_max_words: int = Field(default=200, ge=0, description="Short, for drop_javascript: at most this many words.")
    remove_lines: bool = Field(default=False, description="C4's line removal (the paper and its code): keep only "
        "lines that end in . ? ! or a double quote (not an ellipsis), have min_words_per_line words, no word over 1,000 "
        "characters and no javascript, cookie or terms-of-use notice; Wikipedia citation marks are cut. The text "
        "becomes those lines (FineWeb's rules then measure it), for languages written with spaces.")
    line_terminal_punct: bool = Field(default=True, description="The line rule on terminal punctuation (FineWeb's "
        "recipe turns it off).")
    min_words_per_line: int | None = Field(default=None, ge=0, description="A line C4 keeps has at least this many "
        "words. null: 5, C4's code (3 with compat=datatrove, datatrove's default).")
    min_sentences: int | None = Field(default=None, ge=0, description="Fewer sentences on the lines C4 keeps: "
        "dropped (languages written with spaces). null: 3, C4's code (5 with compat=datatrove).")


# The two C4 numbers C4's code (and paper) and datatrove's defaults swap: words a kept line has,
# sentences a page keeps.
C4_DEFAULTS = {"papers": {"min_words_per_line": 5, "min_sentences": 3},
               "datatrove": {"min_words_per_line": 3, "min_sentences": 5}}


class FineWebConfig(_Rules):
    min_terminal_punct_lines: float = Field(default=0.12, ge=0, le=1, description="A smaller share of lines ending in "
        "terminal punctuation: dropped.")
    max_short_lines: float = Field(default=0.67, ge=0, le=1, description="A larger share of short lines (see "
        "quality.fineweb_short_line_chars): dropped.")
    max_dup_line_chars: float = Field(default=0.01, ge=0, le=1, description="A larger share of characters in duplicate "
        "lines: dropped.")
    max_newline_word_ratio: float = Field(default=0.3, ge=0, description="More line breaks per word: dropped.")


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
    model: str | dict[str, str] | None = Field(default=None, description="A fastText model (`tokenmill classifier "
        "train`), or several by name: each stores its score, P(label), as a signal column (quality_classifier, or "
        "quality_classifier_<name>).")
    threshold: float | dict[str, float] | None = Field(default=None, description="Keep a document only if its score "
        "reaches this (per name for several models); null: score only.")
    label: str = Field(default="hq", min_length=1, description="The positive label the model was trained with.")

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
    compat: Literal["papers", "datatrove"] = Field(default="papers", description="papers: each rule as its paper and "
        "code define it (Gopher, C4; FineWeb: datatrove's filters). datatrove: every Gopher, C4 and FineWeb rule decides "
        "exactly as datatrove 0.10.1's filters with their defaults (spaCy's English tokens, punctuation included, for "
        "every language; needs `pip install 'tokenmill[compat]'`). README: where the two differ.")
    mode: Literal["filter", "tag"] = Field(default="filter", description="filter: documents failing a rule are "
        "dropped. tag: every signal and decision is computed and stored (quality_flag, and the MinHash signatures), "
        "nothing is dropped, and `tokenmill refilter` applies any thresholds later without extracting again.")
    classifier: ClassifierConfig = Field(default=ClassifierConfig(), description="fastText quality classifiers.")
    gopher: GopherConfig = Field(default=GopherConfig(), description="Gopher's rules (Rae et al. 2021).")
    repetition: RepetitionConfig = Field(default=RepetitionConfig(), description="Gopher's repetition rules.")
    c4: C4Config = Field(default=C4Config(), description="C4's rules.")
    fineweb: FineWebConfig = Field(default=FineWebConfig(), description="FineWeb's rules.")
    fineweb_short_line_chars: int = Field(default=30, ge=0, description="A line of at most this many characters is short.")
    no_space_langs: list[str] = Field(default=["zh", "ja", "th", "lo", "km", "my", "bo", "yue", "wuu"], description="Written "
        "without spaces: words are counted per letter; word-length and stop-word rules skipped.")
    stop_words: dict[str, list[str]] = Field(default=_STOP_WORDS, description="Stop-word lists per language; the "
        "Gopher stop-word rule applies only where one exists.")
    per_lang: dict[str, dict[str, Any]] = Field(default={}, description="Overrides per language (FineWeb-2 style), any "
        "key of this section but per_lang itself: {de: {gopher: {min_words: 40}}, zh: {c4: {enabled: false}}}.")
    _per_lang_cache: dict[str, QualityConfig] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _c4_lines(self) -> QualityConfig:
        if self.c4.remove_lines and self.c4_value("min_sentences") < 1:
            raise ValueError("c4.min_sentences: at least 1 with c4.remove_lines (a page with no line left is dropped)")
        return self

    def c4_value(self, key: str) -> int:
        """A C4 number where C4's code and datatrove's defaults disagree: the one set, or the
        default of ``compat``'s definition."""
        value = getattr(self.c4, key)
        return C4_DEFAULTS[self.compat][key] if value is None else value

    @model_validator(mode="after")
    def _per_lang_valid(self) -> QualityConfig:
        for lang, override in self.per_lang.items():
            fixed = {"per_lang", "enabled", "mode", "compat"} & set(override)
            if fixed:
                raise ValueError(f"per_lang.{lang}: {', '.join(sorted(fixed))} cannot differ by language")
            if {"model", "label"} & set(override.get("classifier") or {}):
                raise ValueError(f"per_lang.{lang}.classifier: only thresholds differ by language (one set of models)")
            try:
                self.for_lang(lang)
            except ValidationError as e:
                raise ValueError(f"per_lang.{lang}: " + format_validation_error(e, "").removeprefix("bad config: ")) from None
        return self

    def for_lang(self, lang: str | None) -> QualityConfig:
        """This section with ``per_lang[lang]`` merged in (itself when there is none)."""
        override = self.per_lang.get(lang or "")
        if not override:
            return self
        cache = self._per_lang_cache
        if lang not in cache:
            base = self.model_dump(exclude={"per_lang"})
            cache[lang] = QualityConfig.model_validate(deep_merge(base, override))
        return cache[lang]


class PiiConfig(TimedSection):
    kinds: list[Literal["email", "phone", "ip", "card", "iban", "secret"]] = Field(
        default=["email", "phone", "ip", "card", "iban", "secret"],
        description="Kinds to redact; each is replaced by a typed placeholder such as <EMAIL>.")


class BoilerplateConfig(Section):
    # transforms/boilerplate.py
    enabled: bool = Field(default=False, description="Cut lines found in many documents (in the finish phase).")
    min_docs: int = Field(default=10, ge=2, description="A line is boilerplate in at least this many documents...")
    min_docs_domain: int = Field(default=3, ge=0, description="... or this many of one domain (0: corpus-wide only).")
    min_chars: int = Field(default=8, ge=1, description="Shorter lines (normalised) are never cut.")
    sketch_bits: int = Field(default=22, ge=10, le=26, description="The count-min sketch: 4 x 2**sketch_bits uint32 "
        "cells (22: 64 MB). Over-counting grows with distinct (document, line) occurrences per cell: raise it for "
        "corpora past ~10M lines. At most 26 (1 GB): the sketch is one combined value, and gRPC carries at most 2 GB.")


class DecontaminateConfig(TimedSection):
    enabled: bool = Field(default=False, description="On once evaluation files are given.")
    files: list[str] = Field(default=[], description="Evaluation files: JSONL/Parquet (the `fields` of each record) or "
        "text (one item per line). Documents holding an item's n-gram are dropped, or the span cut.")
    fields: list[str] = Field(default=["text", "question", "answer", "prompt", "completion"], min_length=1,
                              description="The fields of a JSONL/Parquet evaluation record that hold items.")
    n: int = Field(default=13, ge=3, le=64, description="Word n-grams, normalised as dedup's tokens (lower case, "
        "punctuation dropped, digits to 0).")
    min_words: int = Field(default=8, ge=1, description="An item shorter than n words is matched whole, if it has at "
        "least this many words.")
    mode: Literal["drop", "cut"] = Field(default="drop", description="drop the document, or cut the matched span.")

    @model_validator(mode="after")
    def _needs_files(self) -> DecontaminateConfig:
        _on_with(self, "files", "decontaminate")
        if len(self.files) > 64:
            raise ValueError("decontaminate.files: at most 64 files (name them by task, not by item)")
        return self


class DedupConfig(Section):
    """Exact + MinHash-LSH near-duplicate removal (tokenmill/transforms/dedup/)."""

    near: bool = Field(default=True, description="false: only exact duplicates (same lower-cased, whitespace-collapsed "
        "text) are removed.")
    ngram: int = Field(default=5, ge=1, le=64, description="Word n-grams of the normalised text; a text shorter than "
        "one n-gram is one shingle.")
    bands: int = Field(default=14, ge=1, le=512, description="LSH: bands x rows MinHash permutations (FineWeb: 14 x 8 "
        "= 112, ~0.72 similarity S-curve).")
    rows: int = Field(default=8, ge=1, le=512, description="See bands.")
    seed: int = Field(default=1, ge=0, lt=2**32, description="Permutation seed (numpy RandomState range).")
    verify: bool = Field(default=True, description="Keep a candidate pair only if its signature Jaccard estimate "
        "reaches verify_threshold: cuts the chance band collisions that chain unrelated documents into one cluster.")
    verify_threshold: float = Field(default=0.75, ge=0.0, le=1.0, description="See verify.")
    bucket_all_pairs_max: int = Field(default=16, ge=2, le=10_000, description="An LSH bucket with up to this many "
        "members emits all its pairs; a bigger one a star to its smallest member (linear, not quadratic, in the bucket "
        "size).")
    # (Each verification group hands over a star forest, and a job with one group none at all,
    # so in a small job the rounds run empty, at a small fixed cost each: bench/MEASUREMENTS.md.)
    max_rounds: int = Field(default=6, ge=0, le=64, description="Rounds of large-star/small-star unrolled in the Beam "
        "graph for connected components; what is left unconverged after them is finished by a union-find over the "
        "residual, on one worker.")
    survivor: Literal["quality", "longest", "first_id"] = Field(default="quality", description="Which member of a "
        "cluster survives: highest quality_field, then longest text, then the smallest id (quality); longest text then "
        "smallest id (longest); smallest id (first_id).")
    keep: Literal["one", "rehydrate"] = Field(default="one", description="one: a cluster's survivor goes into the "
        "shards once. rehydrate: `repeats` times by its cluster's size.")
    repeats: dict[int, int] = Field(default={2: 2, 5: 3, 100: 1}, description="rehydrate: min cluster size -> copies "
        "(FineWeb-2 found that removing every copy hurts, and that the largest clusters are spam, hence the step back "
        "to 1).")
    quality_field: str = Field(default="quality_score", min_length=1, description="The score survivor=quality ranks by.")
    stats_top_clusters: int = Field(default=20, ge=0, le=10_000, description="Cluster statistics for report.json: this "
        "many largest clusters...")
    stats_member_ids: int = Field(default=5, ge=0, le=1000, description="... with this many member ids each.")

    @model_validator(mode="after")
    def _perm_count(self):
        if self.bands * self.rows > 4096:
            raise ValueError(f"bands x rows must be at most 4096 permutations, got {self.bands * self.rows}")
        if any(s < 1 or not 1 <= r <= 100 for s, r in self.repeats.items()):
            raise ValueError("repeats: cluster sizes from 1 on, and 1 to 100 copies each")
        return self


class TokenizeConfig(Section):
    tokenizer: str | None = Field(default=None, description="A Hugging Face tokenizer.json (local or gs://...). null: "
        "train one on a sample of survivors.")
    eos_token: str | None = Field(default=None, description="The EOS token appended to every document; null: the first "
        "of <|endoftext|>, </s>, ... found.")
    # Training when no tokenizer is given.
    kind: Literal["bpe", "wordpiece", "unigram"] = Field(default="bpe", description="The model trained when no "
        "tokenizer is given.")
    vocab_size: int = Field(default=32_000, gt=256, lt=2**32, description="Its vocabulary size.")
    min_frequency: int = Field(default=2, ge=1, description="Its tokens appear at least this often in the sample.")
    train_docs: int = Field(default=20_000, gt=0, description="The training sample: the documents with the smallest "
        "hash of their id, up to train_docs of them and train_chars characters in all (what a worker holds while it "
        "trains), each cut to train_max_chars; exact copies of a text count once.")
    train_chars: int = Field(default=50_000_000, gt=0, description="See train_docs.")
    train_max_chars: int = Field(default=20_000, gt=0, description="See train_docs.")
    batch_size: int = Field(default=512, gt=0, description="Documents per encode_batch call, at most.")
    # (a larger one raises the peak memory: bench/MEASUREMENTS.md, tokenize.batch_chars)
    batch_chars: int = Field(default=1 << 18, gt=0, description="Characters per encode_batch call, at most: the "
        "tokenizer's working memory follows the text in flight.")


class ShardsConfig(Section):
    val_fraction: float = Field(default=0.01, ge=0.0, lt=1.0, description="Share of documents (by a hash of the id) in "
        "the val split.")
    target_bytes: int = Field(default=256 * 1024 * 1024, gt=0, description="Token bytes per shard file.")
    batch_tokens: int = Field(default=1 << 20, gt=0, description="Tokens per Arrow record batch.")
    buckets: int = Field(default=0, ge=0, le=100_000, description="Shards per split, and the finish phase's units of "
        "work. 0: from the input size, about target_bytes of tokens each (at least 4). Fixed up front: it does not "
        "wait for totals.")
    formats: list[str] = Field(default=[], description="Also write the shards in these formats (megatron, "
        "nanogpt, mds), under OUT/export/<format>/ (`tokenmill export`).")

    @field_validator("formats")
    @classmethod
    def _known_formats(cls, v: list[str]) -> list[str]:
        from tokenmill.pipelines.export_formats import FORMATS  # declared there, once

        if unknown := [f for f in v if f not in FORMATS]:
            raise ValueError(f"{unknown[0]!r} is not one of {', '.join(FORMATS)}")
        return v


class ReportConfig(Section):
    samples_per_reason: int = Field(default=20, ge=0, description="Sample documents shown per drop reason.")


class JobConfig(Strict):
    inputs: list[str] = Field(default=[], description="Files, folders (read recursively) or globs; local, gs:// or "
        "s3://. --input replaces it; empty: the bundled sample.")
    output: str = Field(default="out", description="The output folder (--output replaces it).")
    read: ReadConfig = Field(default=ReadConfig(), description="Reading the inputs (WARC/ARC, JSONL, Parquet, HTML, txt).")
    url: UrlConfig = Field(default=UrlConfig(), description="URL block lists.")
    extract: ExtractConfig = Field(default=ExtractConfig(), description="Text from HTML.")
    normalize: NormalizeConfig = Field(default=NormalizeConfig(), description="Text normalisation.")
    language: LanguageConfig = Field(default=LanguageConfig(), description="Language identification (fastText).")
    quality: QualityConfig = Field(default=QualityConfig(), description="Quality rules and classifiers.")
    pii: PiiConfig = Field(default=PiiConfig(), description="PII redaction.")
    decontaminate: DecontaminateConfig = Field(default=DecontaminateConfig(), description="Removing evaluation text "
        "from the training data.")
    dedup: DedupConfig = Field(default=DedupConfig(), description=DedupConfig.__doc__)
    boilerplate: BoilerplateConfig = Field(default=BoilerplateConfig(), description="Lines repeated across documents "
        "(menus, footers).")
    tokenize: TokenizeConfig = Field(default=TokenizeConfig(), description="The tokenizer, given or trained.")
    shards: ShardsConfig = Field(default=ShardsConfig(), description="The training shards (what the trainer reads).")
    report: ReportConfig = Field(default=ReportConfig(), description="report.json and report.html.")


def load_config(path: str | None = None, overrides: list[str] | None = None) -> JobConfig:
    return load_validated(JobConfig, path, overrides)
