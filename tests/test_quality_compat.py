"""quality.compat=datatrove against datatrove 0.10.1's own filter classes, rule by rule, on real
pages: the HTML of ../shared/data/html_extraction and the HTML records of its WARC files,
extracted and normalised by tokenmill first (the same text goes to both sides).

Each datatrove filter runs with its defaults and every check but one switched off, beside the
tokenmill rule (or rules) that check is: the verdicts must be equal on every document. Skips
where datatrove, spaCy or the shared data is absent. ``python tests/test_quality_compat.py``
prints the per-rule agreement of both modes (the default's differences are by design).
"""

from __future__ import annotations

import gzip
import sys
from functools import cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import shared  # noqa: E402

from tokenmill.config import QualityConfig  # noqa: E402
from tokenmill.transforms import quality_datatrove  # noqa: E402
from tokenmill.transforms.quality import failures, signals  # noqa: E402

MAX_DOCS = 400

# tokenmill's reasons -> the datatrove filter class and the arguments that leave only the
# matching check on (None, -1, (), 0 or 1 switch a datatrove check off).
_GOPHER_OFF = dict(min_doc_words=None, max_doc_words=None, min_avg_word_length=None, max_avg_word_length=None,
                   max_symbol_word_ratio=None, max_bullet_lines_ratio=None, max_ellipsis_lines_ratio=None,
                   max_non_alpha_words_ratio=None, min_stop_words=None)
_REPETITION_OFF = dict(dup_line_frac=None, dup_para_frac=None, dup_line_char_frac=None, dup_para_char_frac=None,
                       top_n_grams=(), dup_n_grams=())
_C4_OFF = dict(filter_lorem_ipsum=False, filter_curly_bracket=False, min_num_sentences=-1)
_FINEWEB_OFF = dict(line_punct_thr=0.0, short_line_thr=1.0, char_duplicates_ratio=1.0, new_line_ratio=float("inf"))


def _checks() -> list[tuple[tuple[str, ...], str, dict]]:
    g = [(("gopher_min_words",), dict(min_doc_words=50)),
         (("gopher_max_words",), dict(max_doc_words=100_000)),
         (("gopher_mean_word_len",), dict(min_avg_word_length=3, max_avg_word_length=10)),
         (("gopher_hash_ratio", "gopher_ellipsis_ratio"), dict(max_symbol_word_ratio=0.1)),
         (("gopher_bullet_lines",), dict(max_bullet_lines_ratio=0.9)),
         (("gopher_ellipsis_lines",), dict(max_ellipsis_lines_ratio=0.3)),
         (("gopher_alpha_words",), dict(max_non_alpha_words_ratio=0.8)),
         (("gopher_stop_words",), dict(min_stop_words=2))]
    r = [((f"gopher_{k}",), {k: v}) for k, v in
         (("dup_line_frac", 0.3), ("dup_para_frac", 0.3), ("dup_line_char_frac", 0.2), ("dup_para_char_frac", 0.2))]
    r += [((f"gopher_top_{n}gram",), dict(top_n_grams=((n, f),))) for n, f in ((2, 0.2), (3, 0.18), (4, 0.16))]
    r += [((f"gopher_dup_{n}gram",), dict(dup_n_grams=((n, f),)))
          for n, f in zip(range(5, 11), (0.15, 0.14, 0.13, 0.12, 0.11, 0.10))]
    c = [(("c4_lorem_ipsum",), dict(filter_lorem_ipsum=True)), (("c4_curly_bracket",), dict(filter_curly_bracket=True)),
         (("c4_min_sentences",), dict(min_num_sentences=5))]
    f = [(("fineweb_terminal_punct",), dict(line_punct_thr=0.12)), (("fineweb_short_lines",), dict(short_line_thr=0.67)),
         (("fineweb_dup_line_chars",), dict(char_duplicates_ratio=0.01)),
         (("fineweb_newlines_per_word",), dict(new_line_ratio=0.3))]
    return ([(k, "gopher", {**_GOPHER_OFF, **a}) for k, a in g] + [(k, "repetition", {**_REPETITION_OFF, **a}) for k, a in r]
            + [(k, "c4", {**_C4_OFF, **a}) for k, a in c] + [(k, "fineweb", {**_FINEWEB_OFF, **a}) for k, a in f])


@cache
def corpus(limit: int | None = MAX_DOCS) -> list[tuple[str, str, str]]:
    """(name, text, language) of real documents (up to ``limit``, spread over the page sets and
    the WARCs); the language as tokenmill labels it (the default mode's rules depend on it)."""
    from warcio.archiveiterator import ArchiveIterator

    from tokenmill.config import NormalizeConfig
    from tokenmill.transforms.extract import extract_html
    from tokenmill.transforms.langid import default_model_path, load_model, predict
    from tokenmill.transforms.normalize import normalize_text

    pages = shared("html_extraction")
    sources: list[list[tuple[str, bytes]]] = []
    for folder in sorted(p for p in pages.iterdir() if p.is_dir()):
        sources.append([(str(p.relative_to(pages)), gzip.decompress(p.read_bytes()))
                        for p in sorted(folder.rglob("*.html.gz"))])
    records = []
    for warc in sorted(shared("warc").rglob("*.warc.gz")):
        with open(warc, "rb") as fh:
            for rec in ArchiveIterator(fh):
                ctype = rec.http_headers.get_header("Content-Type", "") if rec.http_headers else ""
                if rec.rec_type == "response" and "html" in ctype:
                    records.append((f"{warc.name}#{rec.rec_headers.get_header('WARC-Record-ID')}",
                                    rec.content_stream().read()))
    sources.append(records)
    per_source = limit // len(sources) if limit else None
    norm, model = NormalizeConfig(), load_model(default_model_path())
    docs = []
    for items in sources:
        taken = 0
        for name, raw in items:
            text = extract_html(raw).text
            if text:
                text = normalize_text(text, norm)
            if text and text.strip():
                docs.append((name, text, predict(model, text, 4000)[0]))
                taken += 1
                if taken == per_source:
                    break
    return docs


def datatrove_filter(family: str, kwargs: dict):
    from datatrove.pipeline.filters.c4_filters import C4QualityFilter
    from datatrove.pipeline.filters.fineweb_quality_filter import FineWebQualityFilter
    from datatrove.pipeline.filters.gopher_quality_filter import GopherQualityFilter
    from datatrove.pipeline.filters.gopher_repetition_filter import GopherRepetitionFilter

    cls = {"gopher": GopherQualityFilter, "repetition": GopherRepetitionFilter, "c4": C4QualityFilter,
           "fineweb": FineWebQualityFilter}[family]
    return cls(**kwargs)


def datatrove_keeps(filt, text: str) -> bool | None:
    """The filter's verdict on ``text`` (C4's rewrites a Document's text: a fresh one each
    time); None where datatrove raises (a division by zero on a text without words)."""
    from datatrove.data import Document

    try:
        verdict = filt.filter(Document(text=text, id="x"))
    except ZeroDivisionError:
        return None
    return verdict is True


def agreement(cfg: QualityConfig, docs: list[tuple[str, str, str]]) -> dict[str, tuple[int, int, list[str]]]:
    """Per check: (documents where tokenmill and datatrove agree, documents compared, the names
    of some that differ). Document by document: datatrove caches its last few tokenizations."""
    checks = [(reasons, datatrove_filter(family, kwargs)) for reasons, family, kwargs in _checks()]
    counts = {reasons: [0, 0, []] for reasons, _ in checks}
    for name, text, lang in docs:
        ours_failed = set(failures(signals(text, lang, cfg), lang, cfg))
        for reasons, filt in checks:
            theirs = datatrove_keeps(filt, text)
            if theirs is None:
                continue
            ours = not set(reasons) & ours_failed
            c = counts[reasons]
            c[0] += ours == theirs
            c[1] += 1
            if ours != theirs and len(c[2]) < 5:
                c[2].append(name)
    return {"+".join(reasons): tuple(c) for reasons, c in counts.items()}


@pytest.fixture(scope="module")
def compat_agreement():
    pytest.importorskip("datatrove", reason="datatrove not installed (make setup installs it)")
    pytest.importorskip("spacy", reason="spaCy not installed (pip install 'tokenmill[compat]')")
    if len(corpus()) < 100:
        pytest.skip("fewer than 100 shared documents")
    return agreement(QualityConfig(compat="datatrove"), corpus())


@pytest.mark.slow
def test_compat_decides_as_datatrove_rule_by_rule(compat_agreement):
    differ = {rule: (same, total, names) for rule, (same, total, names) in compat_agreement.items() if same != total}
    assert not differ, differ
    assert min(total for _, total, _ in compat_agreement.values()) >= 100


def test_character_tables_are_datatroves():
    text = pytest.importorskip("datatrove.utils.text")
    assert set(quality_datatrove.TERMINAL_PUNCTUATION) == text.TERMINAL_PUNCTUATION
    assert quality_datatrove.PUNCTUATION_SET == text.PUNCTUATION_SET


if __name__ == "__main__":  # the figures, on every shared document: python tests/test_quality_compat.py
    docs = corpus(None)
    print(f"{len(docs)} documents, {sum(lang == 'en' for _, _, lang in docs)} in English")
    print(f"{'rule':42} {'compat=datatrove':>20} {'papers (default)':>20} {'papers, English':>20}")
    compat, papers = agreement(QualityConfig(compat="datatrove"), docs), agreement(QualityConfig(), docs)
    english = agreement(QualityConfig(), [d for d in docs if d[2] == "en"])
    for rule in compat:
        print(f"{rule:42}" + "".join(f" {c[0]:>6}/{c[1]:<5} {c[0] / c[1]:6.1%}" for c in (compat[rule], papers[rule],
                                                                                            english[rule])))
