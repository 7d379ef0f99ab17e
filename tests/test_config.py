import pytest

from tokenmill.config import load_config, parse_set
from tokenmill.errors import UserError


def test_defaults_validate():
    cfg = load_config()
    assert cfg.language.keep == [] and cfg.extract.enabled and cfg.normalize.ascii_only is False


def test_set_parses_yaml_values():
    assert parse_set("language.keep=[en,de]") == (["language", "keep"], ["en", "de"])
    assert parse_set("language.threshold=0.65") == (["language", "threshold"], 0.65)
    assert parse_set("dedup.enabled=false") == (["dedup", "enabled"], False)
    cfg = load_config(overrides=["language.keep=[en, DE]", "language.thresholds={en: 0.8}", "normalize.lowercase=true"])
    assert cfg.language.keep == ["en", "de"] and cfg.language.thresholds == {"en": 0.8} and cfg.normalize.lowercase


def test_single_language_string_is_a_list():
    assert load_config(overrides=["language.keep=en"]).language.keep == ["en"]


@pytest.mark.parametrize(
    "override, needle",
    [
        ("language.threshold=1.5", "language.threshold"),
        ("language.bogus=1", "language.bogus: unknown key"),
        ("nosuchstage.enabled=true", "nosuchstage: unknown key"),
        ("read.max_record_bytes=-1", "read.max_record_bytes"),
        ("language.thresholds={en: 7}", "between 0 and 1"),
        ("read.enabled=false", "cannot be disabled"),
    ],
)
def test_bad_values_are_one_clear_line(override, needle):
    with pytest.raises(UserError) as e:
        load_config(overrides=[override])
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


def test_config_file_and_override_order(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("language:\n  keep: [fr]\n  threshold: 0.3\n")
    cfg = load_config(str(f), ["language.threshold=0.9"])
    assert cfg.language.keep == ["fr"] and cfg.language.threshold == 0.9


def test_config_file_errors(tmp_path):
    with pytest.raises(UserError, match="config file not found"):
        load_config(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("language: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config(str(bad))
    bad.write_text("- just\n- a list\n")
    with pytest.raises(UserError, match="expected a mapping"):
        load_config(str(bad))
