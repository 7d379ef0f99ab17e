import subprocess
import sys

import pytest
from pydantic import BaseModel

from tokenmill.cli import main
from tokenmill.config import JobConfig, load_config, load_validated, parse_set
from tokenmill.errors import UserError
from tokenmill.trainer.train_config import TrainJobConfig


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


def _keys(model_cls, prefix=""):
    """Every key of a config model, as section.key paths, with its field."""
    for name, field in model_cls.model_fields.items():
        yield prefix + name, field
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from _keys(field.annotation, f"{prefix}{name}.")


@pytest.mark.parametrize("argv, model", [(["config"], JobConfig), (["config", "--train"], TrainJobConfig)],
                         ids=["job", "train"])
def test_config_prints_every_key_with_its_help_as_yaml_that_loads_back_to_the_defaults(argv, model, tmp_path, capsys):
    assert main(argv) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    for key, field in _keys(model):
        assert field.description, f"{key}: no description (its line of help in `tokenmill config`)"
        indent, name = "  " * key.count("."), key.rsplit(".", 1)[-1]
        at = [i for i, line in enumerate(lines) if line.startswith(f"{indent}{name}:")]
        assert at, f"{key} is not printed"
        assert lines[at[0] - 1].startswith(f"{indent}# "), f"{key} has no help above it"
    path = tmp_path / "default.yaml"
    path.write_text(text)
    assert load_validated(model, str(path)) == model()
    assert load_validated(model, str(path)).model_dump() == model().model_dump()


def test_config_train_needs_no_torch():
    code = "import sys; from tokenmill.cli import main; main(['config', '--train']); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
