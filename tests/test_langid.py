import pytest

from tokenmill.config import LanguageConfig
from tokenmill.errors import UserError
from tokenmill.transforms.langid import (
    decide,
    default_model_path,
    iso_code,
    load_model,
    predict,
    resolve_model_path,
)


@pytest.fixture(scope="module")
def model():
    return load_model(default_model_path())


def test_labels_mapped_to_iso_639_1():
    assert iso_code("__label__en") == "en"
    assert iso_code("__label__eng_Latn") == "en"  # GlotLID style
    assert iso_code("__label__deu") == "de"
    assert iso_code("__label__ceb") == "ceb"  # no 639-1 code: kept as is


@pytest.mark.parametrize("text, lang", [
    ("The committee will publish its findings next week after a long review.", "en"),
    ("Die Bibliothek bleibt wegen Bauarbeiten bis Ende des Monats geschlossen.", "de"),
    ("Le marché du samedi matin attire des visiteurs de toute la région.", "fr"),
    ("東京の天気は明日から晴れるでしょう。", "ja"),
    ("Сегодня в городе открылась новая библиотека.", "ru"),
])
def test_predicts_real_sentences(model, text, lang):
    got, score = predict(model, text + "\nsecond line", 4000)
    assert got == lang and 0.5 < score <= 1.0


def test_decide_keep_list_and_thresholds():
    assert decide("xx", 0.01, LanguageConfig()) is None  # empty keep list: label only
    cfg = LanguageConfig(keep=["en", "de"], threshold=0.6, thresholds={"de": 0.9})
    assert decide("fr", 0.99, cfg) == "not_in_keep"
    assert decide("en", 0.5, cfg) == "low_score"
    assert decide("en", 0.7, cfg) is None
    assert decide("de", 0.8, cfg) == "low_score"


def test_bad_model_paths(tmp_path):
    with pytest.raises(UserError, match="file not found"):
        resolve_model_path(LanguageConfig(model=str(tmp_path / "none.bin")))
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a model")
    with pytest.raises(UserError, match="not a fastText model"):
        load_model(str(junk))
