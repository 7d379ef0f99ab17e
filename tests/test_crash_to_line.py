"""Crashes with no line ("Trust what you open"): files that crash native code, configs that
take gigabytes, settings that validation used to accept but that cannot run, and flags out of
range. Each is refused up front or ends in one line `tokenmill ...: error: ...`, exit 2."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tokenmill.cli import main

TOKENMILL = str(Path(sys.executable).parent / "tokenmill")


def crafted_fasttext_model(path: Path) -> Path:
    """194 bytes that fastText loads into a division by zero (bucket 0 with subwords): SIGFPE."""
    b = struct.pack("<ii", 793712314, 12)
    b += struct.pack("<12i", 4, 5, 1, 1, 5, 1, 2, 3, 0, 1, 3, 100) + struct.pack("<d", 1e-4)
    b += struct.pack("<iiiqq", 2, 1, 1, 10, -1)
    b += b"hello\x00" + struct.pack("<qb", 5, 0) + b"__label__en\x00" + struct.pack("<qb", 5, 1)
    for _ in range(2):
        b += b"\x00" + struct.pack("<qq", 1, 4) + struct.pack("<4f", 0, 0, 0, 0)
    path.write_bytes(b)
    return path


def panicking_tokenizer(path: Path, how: str) -> Path:
    """A tokenizer.json that loads, then makes Rust panic when it encodes."""
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": None, "post_processor": None, "decoder": None,
            "model": {"type": "WordLevel", "vocab": {"a": 0, "</s>": 1}, "unk_token": "a"}}
    if how == "fixed_length_0":
        spec["pre_tokenizer"] = {"type": "FixedLength", "length": 0}
    else:  # a template naming a special token it does not define
        spec["post_processor"] = {"type": "TemplateProcessing", "special_tokens": {},
                                  "single": [{"Sequence": {"id": "A", "type_id": 0}},
                                             {"SpecialToken": {"id": "<zz>", "type_id": 0}}],
                                  "pair": [{"Sequence": {"id": "A", "type_id": 0}}]}
    path.write_text(json.dumps(spec))
    return path


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err and "panicked" not in err, err[-2000:]
    return lines[0]


def cli(*args: str, timeout: int = 120) -> tuple[int, str]:
    """A separate process: a crash there is what a user sees (a signal, Rust's own stderr lines)."""
    p = subprocess.run([TOKENMILL, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stderr


@pytest.mark.parametrize("setting", ["language.model", "quality.classifier.model"])
def test_a_fasttext_model_that_crashes_fasttext_is_one_line(tmp_path, setting):
    model = crafted_fasttext_model(tmp_path / "model.bin")
    rc, err = cli("prepare", "--output", str(tmp_path / "out"), "--set", f"{setting}={model}")
    line = one_line(err)
    assert rc == 2 and setting in line and "SIGFPE" in line, line
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.parametrize("how", ["fixed_length_0", "template"])
def test_a_tokenizer_that_panics_is_one_line(tmp_path, how):
    tok = panicking_tokenizer(tmp_path / "tok.json", how)
    rc, err = cli("prepare", "--output", str(tmp_path / "out"), "--set", f"tokenize.tokenizer={tok}")
    line = one_line(err)
    assert rc == 2 and "tokenize.tokenizer" in line and "PanicException" in line, line


BOMB = "\n".join([
    'a: &a ["x","x","x","x","x","x","x","x","x"]',
    *(f"{n}: &{n} [{','.join(['*' + p] * 9)}]" for p, n in zip("abcdefgh", "bcdefghi")),
    "language: {keep: *i}",
])


def test_a_yaml_anchor_bomb_is_refused_before_it_expands(tmp_path, capsys):
    (tmp_path / "bomb.yaml").write_text(BOMB)  # 9^9 = 387 million strings once expanded
    assert main(["prepare", "--config", str(tmp_path / "bomb.yaml"), "--output", str(tmp_path / "o")]) == 2
    assert "anchors and aliases" in one_line(capsys.readouterr().err)
    assert main(["prepare", "--set", "language.keep=" + "[" * 3000 + "]" * 3000, "--output", str(tmp_path / "o")]) == 2
    assert "nested too deeply" in one_line(capsys.readouterr().err)
    # Anchors a config may use are fine.
    (tmp_path / "ok.yaml").write_text("language: {keep: &k [en, de]}\nquality: {per_lang: {en: {}}}\n")
    from tokenmill.config import load_config

    assert load_config(str(tmp_path / "ok.yaml")).language.keep == ["en", "de"]


@pytest.mark.parametrize("sets, needle", [
    (["boilerplate.sketch_bits=27"], "sketch_bits"),  # 2 GB: past what gRPC carries, after the whole clean phase
    (["language.threshold=nan"], "language.threshold"),
    (["quality.gopher.max_symbol_word_ratio=.inf"], "max_symbol_word_ratio"),
    (["read.split_bytes=100000000000000000000"], "split_bytes"),
])
def test_job_settings_that_cannot_run_are_refused(tmp_path, capsys, sets, needle):
    argv = ["prepare", "--output", str(tmp_path / "o")]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 2
    assert needle in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("sets, needle", [
    (["data.prefetch_factor=1e9"], "prefetch_factor"),
    (["optim.lr=nan"], "lr"),
    (["train.seed=100000000000000000000"], "seed"),
])
def test_train_settings_that_cannot_run_are_refused(tmp_path, capsys, sets, needle):
    pytest.importorskip("torch")
    from tokenmill.errors import UserError
    from tokenmill.trainer.train_config import load_train_config

    with pytest.raises(UserError, match=needle):
        load_train_config(None, sets)


@pytest.mark.parametrize("args, needle", [
    (["--seed", "1e20"], "--seed"),
    (["--seed", "100000000000000000000"], "--seed"),
    (["--temperature", "nan"], "--temperature"),
    (["--temperature", "inf"], "--temperature"),
    (["--max-tokens", "100000000000000000000"], "--max-tokens"),
    (["--top-k", "-1"], "--top-k"),
])
def test_generate_flags_out_of_range_are_one_line(tmp_path, capsys, args, needle):
    assert main(["generate", str(tmp_path), *args]) == 2
    assert needle in one_line(capsys.readouterr().err)


@pytest.mark.slow
def test_an_output_that_is_a_file_is_one_line(tmp_path):
    f = tmp_path / "file"
    f.write_text("not a folder")
    rc, err = cli("prepare", "--output", str(tmp_path / "out"))
    assert rc == 0, err
    for args in (["prepare", "--output", str(f)], ["export", str(tmp_path / "out"), "--format", "nanogpt", "--output", str(f)],
                 ["refilter", str(tmp_path / "out"), "--output", str(f)]):
        rc, err = cli(*args)
        assert rc == 2 and str(f) in one_line(err), err
    assert f.read_text() == "not a folder"
