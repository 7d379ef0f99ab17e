"""Quality thresholds per language (quality.per_lang, FineWeb-2 style): the merged section, the
filter applying a language's own thresholds in a real prepare run, the report's kept and
dropped per language and rule, and the one-line errors."""

import pytest
from conftest import run_prepare

from tokenmill.cli import main
from tokenmill.config import JobConfig, QualityConfig

SAMPLE = __import__("pathlib").Path(__file__).parent.parent / "tokenmill" / "sample"


def test_overrides_merge_into_the_section():
    q = QualityConfig(per_lang={"de": {"gopher": {"min_words": 40}, "c4": {"enabled": False}}})
    de = q.for_lang("de")
    assert de.gopher.min_words == 40 and not de.c4.enabled and de.gopher.max_words == q.gopher.max_words
    assert q.for_lang("en") is q and q.for_lang(None) is q and q.for_lang("de") is de
    with pytest.raises(ValueError, match="per_lang.de: gopher.min_wrds: unknown key"):
        QualityConfig(per_lang={"de": {"gopher": {"min_wrds": 1}}})
    with pytest.raises(ValueError, match="only thresholds differ"):
        QualityConfig(per_lang={"de": {"classifier": {"model": "x.bin"}}})


@pytest.mark.slow
def test_prepare_applies_a_languages_own_thresholds(tmp_path, capsys):
    _, rows, base = run_prepare(tmp_path / "base", [SAMPLE])
    rc, rows2, strict = run_prepare(tmp_path / "de", [SAMPLE], ["quality.per_lang.de.gopher.min_words=100000"])
    assert rc == 0
    kept = lambda rows, lang: sorted(r["id"] for r in rows if r["dropped_by"] is None and r["lang"] == lang)  # noqa: E731
    assert kept(rows, "de") and not kept(rows2, "de")
    for lang in ("en", "fr", "ja"):
        assert kept(rows, lang) == kept(rows2, lang)
    assert strict["languages_dropped"]["de"]["quality:gopher_min_words"] >= len(kept(rows, "de"))
    assert all(r.startswith(("language:", "quality:", "dedup:", "extract:")) for r in strict["languages_dropped"]["de"])
    page = (tmp_path / "de" / "report" / "report.html").read_text()
    assert 'id="languages_dropped"' in page and "gopher_min_words" in page
    capsys.readouterr()
    assert main(["prepare", "--output", str(tmp_path / "x"), "--set", "quality.per_lang.deu.gopher.min_words=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "quality.per_lang: 'deu'" in err[0] and "'de'" in err[0]


def test_config_round_trip_keeps_the_overrides():
    cfg = JobConfig.model_validate({"quality": {"per_lang": {"fr": {"fineweb": {"max_short_lines": 0.9}}}}})
    again = JobConfig.model_validate(cfg.model_dump(mode="json"))
    assert again.quality.for_lang("fr").fineweb.max_short_lines == 0.9
