"""An output folder someone else made ("Trust what you open"): `prepare`, `refilter` and
`export` write only tokenmill's own files under the folder they are given, follow no link out
of it, and remove nothing they did not write. `export` verifies checksums first."""

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import run_prepare

from tokenmill.cli import main
from tokenmill.transforms.tokenization import train_tokenizer

WORDS = "garden weather spring tomato bean river mountain city train music paper window table light".split()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    d = tmp_path_factory.mktemp("confine")
    train_tokenizer([" ".join(WORDS)] * 20, vocab_size=300).save(str(d / "tok.json"))
    src = d / "in" / "a.jsonl"
    src.parent.mkdir()
    src.write_text("".join(json.dumps({"id": f"d{i}", "text": f"Note {i}. " + " ".join(WORDS[(i + j) % len(WORDS)]
                                                                                        for j in range(80)) + "."}) + "\n"
                           for i in range(30)))
    sets = ["quality.enabled=false", f"tokenize.tokenizer={d / 'tok.json'}", "dedup.enabled=false"]
    out = d / "out"
    rc, _, _ = run_prepare(out, [src.parent], sets=sets)
    assert rc == 0
    return d, src.parent, out, sets


def _prepare(out, inp, sets) -> int:
    return main(["prepare", "--output", str(out), "--input", str(inp), *(a for s in sets for a in ("--set", s))])


def _one_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def _victim(tmp_path) -> Path:
    """A folder of someone's files that a link in OUT points to."""
    v = tmp_path / "victim"
    v.mkdir()
    for name in ("notes.jsonl", "kept-00000-of-00001.parquet", "train-00000.arrow", "report.json", "x.bin"):
        (v / name).write_text("precious")
    return v


def _untouched(victim: Path) -> bool:
    return sorted(p.name for p in victim.iterdir()) == sorted(
        ["notes.jsonl", "kept-00000-of-00001.parquet", "train-00000.arrow", "report.json", "x.bin"]) and all(
        p.read_text() == "precious" for p in victim.iterdir())


def test_a_linked_lock_file_is_not_followed(made, tmp_path, capsys):
    d, inp, ref, sets = made
    out = tmp_path / "out"
    shutil.copytree(ref, out)
    victim = _victim(tmp_path)
    (out / ".tokenmill.lock").unlink(missing_ok=True)
    os.symlink(victim / "notes.jsonl", out / ".tokenmill.lock")
    rc = _prepare(out, inp, sets)
    assert rc == 2 and "symbolic link" in _one_line(capsys)
    assert _untouched(victim)


@pytest.mark.parametrize("folder", ["report/samples", "report", "docs", "shards", "export/nanogpt"])
def test_a_linked_output_folder_is_refused_and_its_target_untouched(made, tmp_path, capsys, folder):
    d, inp, ref, sets = made
    out = tmp_path / "out"
    shutil.copytree(ref, out)
    victim = _victim(tmp_path)
    link = out / folder
    if link.exists():
        shutil.rmtree(link)
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(victim, link)
    extra = ["shards.formats=[nanogpt]"] if folder.startswith("export") else []
    rc = _prepare(out, inp, sets + extra)
    assert rc == 2 and "symbolic link" in _one_line(capsys)
    assert _untouched(victim)


def test_a_linked_leftover_stage_is_neither_entered_nor_removed(made, tmp_path):
    d, inp, ref, sets = made
    out = tmp_path / "out"
    shutil.copytree(ref, out)
    victim = _victim(tmp_path)
    (victim / ".complete").write_text("")
    (victim / "docs").mkdir()
    (victim / "docs" / "kept-00000-of-00001.parquet").write_text("precious")
    os.symlink(victim, out / ".tokenmill-stage-deadbeef")
    os.symlink(victim, out / ".tokenmill-old-deadbeef")
    rc, _, _ = run_prepare(out, [inp], sets=sets)
    assert rc == 0
    assert (victim / "docs" / "kept-00000-of-00001.parquet").read_text() == "precious"
    assert (out / ".tokenmill-stage-deadbeef").is_symlink() and (victim / "notes.jsonl").read_text() == "precious"


def _spellings(out: Path, tmp_path: Path) -> list[str]:
    link = tmp_path / "link-to-out"
    os.symlink(out, link)
    return [str(out) + "/", str(out / "." / ""), str(link), os.path.relpath(out), str(out / "docs" / "x")]


def test_refilter_into_its_own_input_however_spelled_is_refused(made, tmp_path, capsys):
    d, inp, ref, sets = made
    out = tmp_path / "out"
    shutil.copytree(ref, out)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    for target in _spellings(out, tmp_path):
        assert main(["refilter", str(out), "--output", target]) == 2, target
        line = _one_line(capsys)
        assert "--output" in line and ("itself" in line or "inside" in line), line
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_export_into_its_own_input_however_spelled_is_refused(made, tmp_path, capsys):
    d, inp, ref, sets = made
    out = tmp_path / "out"
    shutil.copytree(ref, out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    for target in _spellings(out, tmp_path):
        assert main(["export", str(out), "--format", "nanogpt", "--output", target]) == 2, target
        assert "--output" in _one_line(capsys)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_export_leaves_other_files_alone(made, tmp_path, capsys):
    d, inp, out, sets = made
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "train.bin").write_text("a user's own train.bin")
    assert main(["export", str(out), "--format", "nanogpt", "--output", str(mine)]) == 2
    assert "holds other files" in _one_line(capsys)
    assert (mine / "train.bin").read_text() == "a user's own train.bin" and len(list(mine.iterdir())) == 1


def test_export_replaces_only_what_it_wrote_and_follows_no_link(made, tmp_path, capsys):
    d, inp, out, sets = made
    target = tmp_path / "exp"
    assert main(["export", str(out), "--format", "nanogpt", "--output", str(target)]) == 0
    first = (target / "train.bin").read_bytes()
    victim = _victim(tmp_path)
    (target / "train.bin").unlink()
    os.symlink(victim / "x.bin", target / "train.bin")  # a received export whose file is a link
    (target / "notes.txt").write_text("the user's")
    listed = json.loads((target / ".tokenmill-export.json").read_text())
    listed["files"] += ["../victim/notes.jsonl", "/etc/hostname"]  # a crafted list names outside files
    (target / ".tokenmill-export.json").write_text(json.dumps(listed))
    assert main(["export", str(out), "--format", "nanogpt", "--output", str(target)]) == 0
    assert not (target / "train.bin").is_symlink() and (target / "train.bin").read_bytes() == first
    assert _untouched(victim) and (target / "notes.txt").read_text() == "the user's"
    assert not [p for p in target.iterdir() if p.name.startswith(".tokenmill-stage")]


def test_export_verifies_checksums_first(made, tmp_path, capsys):
    d, inp, ref, sets = made
    out = tmp_path / "out"
    shutil.copytree(ref, out)
    shard = sorted((out / "shards").glob("train-*.arrow"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert main(["export", str(out), "--format", "nanogpt", "--output", str(tmp_path / "exp")]) == 2
    line = _one_line(capsys)
    assert "sha256" in line and shard.name in line
    assert not (tmp_path / "exp").exists()


def test_a_shard_with_crafted_offsets_is_a_problem_not_a_crash(made, tmp_path, capsys):
    """A received OUT whose shard's list offsets point past its token buffer, with the manifest's
    checksums made to match: inspect and export name the shard instead of reading outside it."""
    import hashlib

    import numpy as np
    import pyarrow as pa

    d, inp, ref, sets = made
    out = tmp_path / "out"
    shutil.copytree(ref, out)
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["splits"]["train"]["shards"][0]
    shard = out / entry["file"]
    with pa.memory_map(str(shard)) as src:
        offsets = pa.ipc.open_file(src).get_batch(0).column("tokens").offsets.to_numpy().astype(np.int32)
    data = shard.read_bytes()
    at = data.index(offsets.tobytes())  # the offsets buffer, as the file holds it
    crafted = offsets.copy()
    crafted[-1] += 10_000_000  # the last document ends 10M tokens past the token buffer
    shard.write_bytes(data[:at] + crafted.tobytes() + data[at + len(crafted) * 4:])
    entry["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    entry["bytes"] = shard.stat().st_size
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert main(["export", str(out), "--format", "nanogpt", "--output", str(tmp_path / "exp")]) == 2
    line = _one_line(capsys)
    assert shard.name in line and "not a readable Arrow IPC file" in line, line
    assert main(["inspect", str(out), "--docs", "0"]) == 1
    assert "not a readable Arrow IPC file" in capsys.readouterr().out
