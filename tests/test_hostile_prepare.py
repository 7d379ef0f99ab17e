"""`tokenmill prepare` under hostile conditions: a failed, refused, interrupted, killed or
disk-full run never touches the previous output, and every error a user can cause is one line.

Runs that check stderr run `tokenmill` as a separate process: what a user sees there includes
what Beam and its worker processes log, which an in-process run under pytest would hide.
"""

import glob
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import TOKENMILL, prepare, read_output, reaped, run_prepare, snapshot, start_prepare, wait_for

from tokenmill.cli import main
from tokenmill.config import LanguageConfig
from tokenmill.pipelines import output
from tokenmill.pipelines.inspect_output import inspect_output
from tokenmill.transforms.langid import check_languages
from tokenmill.transforms.tokenization import train_tokenizer

MULTI = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
WORDS = ("garden weather spring tomato bean river mountain city train music paper window table light market "
         "coffee bread winter summer autumn forest ocean letter street doctor school morning evening").split()


# ---------------------------------------------------------------- helpers


def one_error_line(stderr: str) -> str:
    """The whole of stderr is one `tokenmill: error: ...` line."""
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("tokenmill: error: "), stderr
    return lines[0]


def leftovers(out: Path) -> list[str]:
    return sorted(n for n in os.listdir(out) if n.startswith((output.STAGE_PREFIX, output.OLD_PREFIX)))


def stage_started(out: Path) -> Path | None:
    """A run's stage folder, once the launcher has written its input list (the graph is built next)."""
    found = glob.glob(str(out / f"{output.STAGE_PREFIX}*" / "inputs.jsonl"))
    return Path(found[0]).parent if found else None


def lock_pid(out: Path) -> int | None:
    try:
        return int((out / output.LOCK_NAME).read_text() or 0)
    except (OSError, ValueError):
        return None


def doc_ids(out: Path) -> list[str]:
    return sorted(r["id"] for f in sorted((out / "docs").glob("*.parquet")) for r in pq.read_table(f).to_pylist())


def write_docs(path: Path, n: int, words: int, seed: int) -> Path:
    """JSONL of ``n`` distinct English-looking documents."""
    rnd = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for i in range(n):
            text = f"Note {i} is about the {rnd.choice(WORDS)}. " + " ".join(rnd.choice(WORDS) for _ in range(words))
            fh.write(json.dumps({"id": f"{path.stem}-{i}", "text": text + "."}) + "\n")
    return path


# ---------------------------------------------------------------- shared inputs


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    # A user tokenizer, so no run trains one.
    train_tokenizer([" ".join(WORDS)] * 20, vocab_size=300).save(str(d / "tok.json"))
    small = d / "small"
    write_docs(small / "a.jsonl", 20, 60, seed=1)
    big = d / "big"  # a few seconds of pipeline
    write_docs(big / "b.jsonl", 6000, 200, seed=2)  # long enough that a signal 0.5 s in never meets the publish
    return d, small, big


@pytest.fixture(scope="module")
def fast(data):
    """--set flags for a quick run."""
    d, _, _ = data
    return ["--set", "quality.enabled=false", "--set", f"tokenize.tokenizer={d / 'tok.json'}"]


@pytest.fixture(scope="module")
def reference(data, fast, tmp_path_factory):
    """A good output; each test that needs one copies it."""
    _, small, _ = data
    out = tmp_path_factory.mktemp("reference") / "out"
    # Language codes the model knows pass the check.
    rc, _, err = prepare(out, [small], *fast, "--set", "language.keep=[en,de]", "--set", "language.thresholds={en: 0.3}")
    assert rc == 0, err
    assert (out / "manifest.json").exists() and len(doc_ids(out)) == 20 and leftovers(out) == []
    return out


@pytest.fixture
def previous(reference, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    return out


# ---------------------------------------------------------------- 1. a failed run keeps the previous output


@pytest.fixture(scope="module")
def no_unk_tokenizer(data):
    """Loads and has an EOS (the launcher's checks pass), but a WordLevel model without an unknown
    token cannot encode a word outside its vocabulary: the Tokenize step fails on the worker."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"</s>": 0, "the": 1}))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = data[0] / "no_unk.json"
    tok.save(str(path))
    return path


@pytest.mark.parametrize("case", ["runner_typo", "missing_language_model", "fails_on_a_worker"])
@pytest.mark.slow
def test_a_failed_run_leaves_the_previous_output_whole(case, previous, data, no_unk_tokenizer):
    _, small, _ = data
    args, needle = {
        "runner_typo": (["--runner=Nope"], "--runner=Nope"),
        "missing_language_model": (["--set", "language.model=/nope.bin"], "/nope.bin"),
        "fails_on_a_worker": (["--set", "quality.enabled=false", "--set", f"tokenize.tokenizer={no_unk_tokenizer}"],
                              "the pipeline failed in step 'Finish'"),
    }[case]
    before = snapshot(previous)
    rc, out, err = prepare(previous, [small], *args)
    line = one_error_line(err)
    assert rc == 2 and needle in line and out == ""
    assert snapshot(previous) == before and leftovers(previous) == []
    assert inspect_output(str(previous)) == 0


# ---------------------------------------------------------------- 2. one run at a time


@pytest.mark.slow
def test_a_second_run_into_a_busy_output_is_refused(tmp_path, data, fast, capsys):
    _, small, big = data
    out = tmp_path / "out"
    first = start_prepare(out, [big], *fast)
    with reaped(first):
        wait_for(lambda: lock_pid(out) == first.pid, proc=first)
        # In-process: it reaches the lock at once, while the first run surely holds it.
        rc = main(["prepare", "--output", str(out), "--input", str(small), *fast])
        line = one_error_line(capsys.readouterr().err)
        assert rc == 2 and "in use" in line and f"pid {first.pid}" in line
        assert first.poll() is None, "the first run ended before the second was refused"
        _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert leftovers(out) == [] and inspect_output(str(out)) == 0
    assert len(doc_ids(out)) == 6000


def test_a_killed_run_neither_blocks_the_next_nor_leaves_its_stage(tmp_path, data, fast):
    _, small, big = data
    out = tmp_path / "out"
    dead = start_prepare(out, [big], *fast)
    stage = wait_for(lambda: stage_started(out), proc=dead)
    os.killpg(dead.pid, signal.SIGKILL)
    dead.communicate()
    assert stage.is_dir() and lock_pid(out) == dead.pid  # what a killed run leaves
    rc, _, _ = run_prepare(out, [small], sets=fast[1::2])
    assert rc == 0 and not stage.exists() and leftovers(out) == []
    assert inspect_output(str(out)) == 0 and len(doc_ids(out)) == 20


# ---------------------------------------------------------------- 3. disk full


def test_disk_full_is_one_line_and_leaves_no_temp_files(tmp_path, data, fast):
    d, _, _ = data
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here to mount a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=400k tmpfs {disk}"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a user+mount namespace here: {probe.stderr.strip()}")
    # ~500 KB of docs Parquet and ~1.6 MB of shards for 400 KB: the launcher's own small writes
    # (lock, input list, tokenizer.json) fit, a worker's Parquet or shard writes do not.
    rnd = random.Random(3)
    src = tmp_path / "in" / "words.jsonl"
    src.parent.mkdir()
    src.write_text("".join(json.dumps({"id": f"w{i}", "text": " ".join(
        "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(3, 9))) for _ in range(400))}) + "\n"
        for i in range(300)))
    left = tmp_path / "left.txt"  # the tmpfs goes with the namespace: list what is left inside it
    run = shlex.join([TOKENMILL, "prepare", "--input", str(src), "--output", f"{disk}/out", *fast])
    cmd = (f"mount -t tmpfs -o size=400k tmpfs {disk} && {{ {run}; rc=$?; "
           f"cd {disk}/out && find . -mindepth 1 > {left}; exit $rc; }}")
    p = subprocess.run(["unshare", "-rm", "sh", "-c", cmd], capture_output=True, text=True, timeout=120)
    line = one_error_line(p.stderr)
    assert p.returncode == 2 and "disk full" in line and p.stdout == ""
    assert left.read_text().split() == [f"./{output.LOCK_NAME}"]


# ---------------------------------------------------------------- 4. Ctrl-C


@pytest.mark.parametrize("mode, to, sig", [
    ("in_memory", "group", signal.SIGINT),
    ("multi_processing", "group", signal.SIGINT),  # a terminal's Ctrl-C: the launcher and its worker processes
    ("multi_processing", "launcher", signal.SIGINT),  # kill -INT <pid>: the workers must be ended by the launcher
    ("multi_processing", "group", signal.SIGTERM),  # what `timeout`, `scancel` and Kubernetes send
])
@pytest.mark.slow
def test_ctrl_c_is_one_line_and_keeps_the_previous_output(mode, to, sig, previous, data, fast):
    _, _, big = data
    before = snapshot(previous)
    run = start_prepare(previous, [big], *fast, *(MULTI if mode == "multi_processing" else []))
    with reaped(run):
        wait_for(lambda: stage_started(previous), proc=run)
        time.sleep(1.0 if mode == "multi_processing" else 0.5)  # workers started, bundles running
        assert run.poll() is None
        (os.killpg if to == "group" else os.kill)(run.pid, sig)
        out, err = run.communicate(timeout=60)
    said = "interrupted" if sig == signal.SIGINT else "terminated"
    assert run.returncode == 128 + sig, err
    assert "Traceback" not in err and [ln for ln in err.splitlines() if ln.strip()] == [f"tokenmill: {said}"], err
    assert leftovers(previous) == [] and snapshot(previous) == before


# ---------------------------------------------------------------- 5-8. mistakes caught before the pipeline runs


@pytest.mark.parametrize("args, needles", [
    # 5. Beam flags: Beam's own check, in one line instead of its usage text.
    (["--direct_num_workers=abc"], ["Beam option", "--direct_num_workers", "'abc'"]),
    (["--direct_running_mode=nope"], ["Beam option", "--direct_running_mode", "'nope'"]),
    # 6. --set values that are not YAML.
    (["--set", "language.keep=[en"], ["language.keep", "not valid YAML"]),
    # 7. Language codes the model does not know.
    (["--set", "language.keep=[eng]"], ["language.keep", "'eng'", "did you mean 'en'"]),
    (["--set", "language.keep=en-US"], ["language.keep", "'en-us'", "did you mean 'en'"]),
    (["--set", "language.keep=klingon"], ["language.keep", "'klingon'"]),
    (["--set", "language.thresholds={xx: 0.5}"], ["language.thresholds", "'xx'"]),
], ids=["workers_abc", "running_mode_nope", "broken_yaml", "eng", "en_US", "klingon", "threshold_xx"])
def test_bad_flags_and_settings_are_one_line_before_any_output(args, needles, tmp_path, data):
    _, small, _ = data
    out = tmp_path / "out"
    rc, stdout, err = prepare(out, [small], *args)
    line = one_error_line(err)
    assert rc == 2 and stdout == "" and not out.exists()
    assert all(n in line for n in needles), line
    assert "usage:" not in err


def test_language_codes_the_model_knows_pass():
    for keep, thresholds in [(["en", "de"], {}), (["zh"], {"zh": 0.5})]:
        check_languages(LanguageConfig(keep=keep, thresholds=thresholds))


@pytest.fixture(scope="module")
def broken_files(data):
    d = data[0] / "broken"
    d.mkdir()
    (d / "model.bin").write_text("a text file, not a fastText model\n")
    (d / "binary.json").write_bytes(b"\x8b\xff\xfe\x00" + bytes(range(128, 256)) * 8)
    (d / "folder.json").mkdir()
    (d / "other.json").write_text('{"name": "a JSON file that is not a tokenizer", "vocab": [1, 2]}')
    return d


@pytest.mark.parametrize("setting, needles", [
    ("language.model=model.bin", ["language.model", "model.bin", "not a fastText model"]),
    ("tokenize.tokenizer=binary.json", ["tokenize.tokenizer", "binary.json", "not UTF-8"]),
    ("tokenize.tokenizer=folder.json", ["tokenize.tokenizer", "folder.json", "Is a directory"]),
    ("tokenize.tokenizer=other.json", ["tokenize.tokenizer", "other.json", "not a Hugging Face tokenizer.json"]),
], ids=["model_text", "tokenizer_binary", "tokenizer_folder", "tokenizer_json"])
def test_files_that_cannot_load_are_one_line_before_any_output(setting, needles, broken_files, tmp_path, data):
    _, small, _ = data
    key, name = setting.split("=")
    out = tmp_path / "out"
    rc, stdout, err = prepare(out, [small], "--set", f"{key}={broken_files / name}")
    line = one_error_line(err)
    assert rc == 2 and stdout == "" and not out.exists()
    assert all(n in line for n in needles) and "no such file" not in line, line


# ---------------------------------------------------------------- 9-10. what a folder input holds


def test_skipped_inputs_are_counted_in_the_report(tmp_path, data, fast):
    _, small, _ = data
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(small / "a.jsonl", src / "a.jsonl")
    (src / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    os.mkfifo(src / "pipe.jsonl")  # opened for reading, a FIFO blocks until a writer comes
    (src / "README.md").write_text("# about these files\n")
    out = tmp_path / "out"
    rc, _, err = prepare(out, [src], *fast, timeout=90)
    assert rc == 0, err
    report = json.loads((out / "report" / "report.json").read_text())
    assert report["inputs_skipped"] == {"broken_link": 1, "not_regular_file": 1, "no_reader": 1}
    assert report["documents"]["read"] == 20 and len(doc_ids(out)) == 20


def test_an_output_folder_inside_the_input_is_not_read_back(tmp_path, data, fast):
    _, small, _ = data
    src = tmp_path / "in"
    shutil.copytree(small, src)
    out = tmp_path / "out"
    out.mkdir()
    (src / "results").symlink_to(out)  # OUT, reached through a symlink in the input folder
    ids = []
    for _ in range(2):  # the second run finds the first one's docs, shards, report and inputs.jsonl there
        rc, _, report = run_prepare(out, [src], sets=fast[1::2])
        assert rc == 0 and report["inputs_skipped"] == {"output_folder": 1}
        ids.append(doc_ids(out))
    assert ids[0] == ids[1] and len(ids[0]) == 20


def test_an_exit_handler_that_never_returns_does_not_keep_a_run_alive(tmp_path):
    """A Beam verb's process ends with its code even when an atexit handler hangs (a CI run saw
    one hang after `tokenmill: interrupted`): the handlers get EXIT_HANDLERS_S, then it ends."""
    code = ("import atexit, sys, threading; from tokenmill import cli, ending; ending.EXIT_HANDLERS_S = 1.0; "
            "atexit.register(threading.Event().wait); "
            f"sys.argv = ['tokenmill', 'prepare', '--output', {str(tmp_path / 'out')!r}, '--input', '/nope']; "
            "cli.entry()")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and time.monotonic() - t0 < 30, p.stderr
    assert "/nope" in one_error_line(p.stderr)


def test_a_thread_that_fails_just_before_the_interrupt_is_not_printed_but_others_are():
    """SIGTERM to the process group ends the workers too, and Beam's threads that watch them can
    fail before the launcher's main thread has run its handler (CI: two "Exception in thread
    run_worker" tracebacks before `tokenmill: terminated`). A thread's failure waits for an
    interrupt on its way; one with none coming is still printed."""
    code = """
import os, signal, sys, threading, time
from tokenmill.pipelines import launch
launch.THREAD_FAILURE_GRACE_S = 1.0
def fail():  # (a lost worker's "Worker subprocess exited" is never printed: the run's line says it)
    raise RuntimeError("a thread watching a worker failed: return code -15")
try:
    with launch.interruptible():
        threading.Thread(target=fail, name="run_worker", daemon=True).start()
        time.sleep(0.3)
        if sys.argv[1] == "signal":
            os.kill(os.getpid(), signal.SIGTERM)
        if sys.argv[1] != "exit":
            time.sleep(2)
except KeyboardInterrupt as e:
    print(type(e).__name__)
sys.stderr.flush()
os._exit(0)  # as a Beam verb ends: a thread still waiting would never print
"""
    quiet = subprocess.run([sys.executable, "-c", code, "signal"], capture_output=True, text=True, timeout=60)
    assert quiet.stdout.split() == ["Terminated"] and quiet.stderr == "", quiet.stderr
    for mode in ("none", "exit"):  # no signal: printed, also where the run ends before the grace
        loud = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=60)
        assert loud.stdout == "" and "Exception in thread run_worker" in loud.stderr, (mode, loud.stderr)
        assert "return code -15" in loud.stderr


def test_an_interrupted_run_that_cannot_unwind_ends_with_every_threads_stack():
    """Past UNWIND_DEADLINE_S after the interrupt, a run whose teardown is stuck (here: on a lock
    no one releases) is ended, and stderr shows where each thread was."""
    code = """
import os, signal, threading
from tokenmill.pipelines import launch
launch.UNWIND_DEADLINE_S = 1.0
with launch.interruptible():
    try:
        os.kill(os.getpid(), signal.SIGINT)
        signal.pause()
    finally:
        lock = threading.Lock(); lock.acquire(); lock.acquire()  # never returns
"""
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and time.monotonic() - t0 < 30, p.stderr
    stuck = next(i for i, ln in enumerate(code.splitlines(), 1) if "never returns" in ln)
    assert "Timeout" in p.stderr and "Thread 0x" in p.stderr and f'File "<string>", line {stuck}' in p.stderr, p.stderr


def test_a_worker_started_after_an_interrupt_is_ended_too():
    """Beam may start a multi_processing worker after the interrupt's sweep of the workers, and its
    teardown then waits for that worker, which waits for work forever (a stress run of 40
    interrupts hung once so): workers are ended until the run has unwound."""
    code = """
import os, signal, subprocess, sys
from tokenmill.pipelines import launch, warm
late = None
try:
    with launch.interruptible():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            signal.pause()
        except KeyboardInterrupt:
            late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", warm.WORKER_MODULE])
            late.wait(timeout=20)  # what Beam's teardown does
except KeyboardInterrupt:
    pass
print(late.returncode)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.split() == [str(-signal.SIGTERM)], p.stderr


def test_a_tokenizer_that_fails_on_one_document_drops_only_that_one(tmp_path):
    """A tokenizer.json whose pre-tokenizer regex passes the regex engine's retry limit on one
    document (Rust panics: pyo3's PanicException): that document is one counted drop,
    `tokenize:tokenizer_error`; the others are kept and tokenized (this ended the job with a
    108-line traceback)."""
    import json
    import subprocess
    import sys

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<|endoftext|>": 1, **{w: i + 2 for i, w in enumerate("the a of and to in is it".split())}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex("(a|aa)+b"), "isolated"),
                                                 pre_tokenizers.Whitespace()])
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(tmp_path / "tok.json"))
    text = "the cat sat on the mat and it is in the house of the dog " * 4
    rows = [{"id": "good-1", "text": text}, {"id": "bad", "text": "a" * 3000 + "c"},
            {"id": "good-2", "text": text.replace("cat", "bird")}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "tokenmill.cli", "prepare", "--input", str(tmp_path / "in.jsonl"),
                        "--output", str(out), "--quiet", "--set", f"tokenize.tokenizer={tmp_path / 'tok.json'}",
                        "--set", "tokenize.eos_token=<|endoftext|>", "--set", "quality.enabled=false",
                        "--set", "language.enabled=false", "--set", "dedup.enabled=false"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    docs = {d["id"]: d for d in read_output(out)[0]}
    assert docs["bad"]["dropped_by"] == "tokenize:tokenizer_error"
    assert not docs["good-1"]["dropped_by"] and docs["good-1"]["n_tokens"] > 10 and not docs["good-2"]["dropped_by"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert sum(info["docs"] for info in manifest["splits"].values()) == 2


@pytest.mark.slow
def test_a_worker_killed_mid_run_is_one_line_and_keeps_the_previous_output(previous, data, fast):
    """SIGKILL to one multi_processing worker mid-run, as the kernel's OOM killer sends it: the run
    ends in one line saying a worker died and what to do (it was ~100 lines of Beam's thread
    tracebacks, then "Channel closed prematurely"), and the previous output is untouched."""
    from netwatch import _tree

    _, _, big = data
    before = snapshot(previous)
    run = start_prepare(previous, [big], *fast, *MULTI)
    with reaped(run):
        wait_for(lambda: stage_started(previous), proc=run)

        def a_worker():
            found = [p for p in _tree(run.pid) - {run.pid}
                     if b"tokenmill.pipelines.worker" in open(f"/proc/{p}/cmdline", "rb").read()
                     or b"sdk_worker_main" in open(f"/proc/{p}/cmdline", "rb").read()]
            return max(found) if found else None

        victim = wait_for(a_worker, proc=run)
        time.sleep(1.0)  # bundles running
        assert run.poll() is None
        os.kill(victim, signal.SIGKILL)
        out, err = run.communicate(timeout=120)
    assert run.returncode == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "a worker process died" in lines[0] and "Traceback" not in err, err
    assert leftovers(previous) == [] and snapshot(previous) == before
