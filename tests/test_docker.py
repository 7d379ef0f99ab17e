"""The Dockerfiles, checked without a Docker engine.

- The worker image's base (apache/beam_python<PY>_sdk:<BEAM_VERSION>) must match the
  apache-beam and Python that launch jobs: the build-arg defaults must equal the versions
  installed here, so bumping apache-beam without bumping the Dockerfile fails.
- Every COPY source exists, and the pip install lines resolve: the files the Dockerfile
  copies are laid out in a temp build context and the same requirement strings go through
  `pip install --dry-run --ignore-installed`, with no pip config of this machine (no local
  wheels, no constraints), as in the image. Skipped when no package index can be reached.
- The trainer image installs a CUDA torch >= 2.13, and its entry script hands the right
  command line to torchrun (run here with stand-ins for torchrun and tokenmill).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "docker" / "worker" / "Dockerfile"
TRAINER = REPO / "docker" / "trainer" / "Dockerfile"
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
MIN_TORCH = Version("2.13")


# --- a small Dockerfile reader -------------------------------------------------------------

class Dockerfile:
    def __init__(self, path: Path):
        self.path = path
        self.args: dict[str, str] = {}  # ARG defaults, global and per stage (one stage here)
        self.instructions: list[tuple[str, str]] = []  # (INSTRUCTION, rest), continuations joined
        self.heredocs: dict[str, str] = {}  # COPY <<EOF dest: dest -> content
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            while line.rstrip().endswith("\\") and i < len(lines):
                line = line.rstrip()[:-1] + " "
                nxt = lines[i]
                i += 1
                if not nxt.lstrip().startswith("#"):
                    line += nxt.strip()
            op, _, rest = line.strip().partition(" ")
            op, rest = op.upper(), rest.strip()
            m = re.match(r"<<-?(['\"]?)(\w+)\1\s+(\S+)$", rest)
            if op in ("COPY", "RUN") and m:  # heredoc: the body runs to the delimiter line
                body = []
                while i < len(lines) and lines[i].strip() != m.group(2):
                    body.append(lines[i])
                    i += 1
                i += 1
                self.heredocs[m.group(3)] = "\n".join(body) + "\n"
            if op == "ARG":
                name, eq, default = rest.partition("=")
                if eq:
                    self.args[name] = default.strip().strip('"')
                else:
                    self.args.setdefault(name, "")
            self.instructions.append((op, rest))

    def expand(self, text: str) -> str:
        """Shell-style ${VAR}, ${VAR:+word}, ${VAR:-word} and $VAR with the ARG defaults."""
        def alt(m):
            value = self.args.get(m.group(1), "")
            if m.group(2) == ":+":
                return self.expand(m.group(3)) if value else ""
            return value or self.expand(m.group(3))
        text = re.sub(r"\$\{(\w+)(:[+-])([^}]*)\}", alt, text)
        text = re.sub(r"\$\{(\w+)\}", lambda m: self.args.get(m.group(1), ""), text)
        return re.sub(r"\$(\w+)", lambda m: self.args.get(m.group(1), ""), text)

    def all(self, op: str) -> list[str]:
        return [rest for o, rest in self.instructions if o == op]

    def base_image(self) -> str:
        return self.expand(self.all("FROM")[-1].split()[0])

    def pip_requirements(self) -> list[str]:
        """Requirement strings of every `pip install` in a RUN (options and their values left out)."""
        reqs = []
        for run in self.all("RUN"):
            lex = shlex.shlex(self.expand(run), posix=True, punctuation_chars=True)
            lex.whitespace_split = True
            cmds: list[list[str]] = [[]]
            for tok in lex:  # split the shell line into its commands (&&, ;, |, ||)
                if tok in ("&&", ";", "|", "||", "&"):
                    cmds.append([])
                else:
                    cmds[-1].append(tok)
            for words in cmds:
                for j in range(len(words) - 1):
                    if words[j] == "pip" and words[j + 1] == "install":
                        k = j + 2
                        while k < len(words):
                            w = words[k]
                            if w in ("--index-url", "-i", "--extra-index-url", "-c", "-r", "--constraint",
                                     "--requirement", "-f", "--find-links"):
                                k += 2
                                continue
                            if not w.startswith("-"):
                                reqs.append(w)
                            k += 1
        return reqs

    def copies(self) -> list[tuple[list[str], str]]:
        out = []
        for rest in self.all("COPY"):
            words = [w for w in shlex.split(rest) if not w.startswith("--")]
            if words and not words[0].startswith("<<"):
                out.append((words[:-1], words[-1]))
        return out


@pytest.fixture(scope="module")
def worker() -> Dockerfile:
    return Dockerfile(WORKER)


@pytest.fixture(scope="module")
def trainer() -> Dockerfile:
    return Dockerfile(TRAINER)


# --- offline checks -------------------------------------------------------------------------

def test_worker_base_image_matches_installed_beam_and_python(worker):
    import apache_beam

    assert worker.args.get("BEAM_VERSION") == apache_beam.__version__, (
        f"{WORKER.relative_to(REPO)}: ARG BEAM_VERSION={worker.args.get('BEAM_VERSION')} but apache-beam "
        f"{apache_beam.__version__} is installed: the workers must run the launcher's Beam")
    assert worker.args.get("PY") == PY, f"{WORKER.relative_to(REPO)}: ARG PY={worker.args.get('PY')}, launcher is {PY}"
    assert worker.base_image() == f"apache/beam_python{PY}_sdk:{apache_beam.__version__}"
    # The pip line must keep the base image's Beam, not upgrade it past the launcher's.
    beams = [Requirement(r) for r in worker.pip_requirements() if r.startswith("apache-beam")]
    assert beams and all(str(b.specifier) == f"=={apache_beam.__version__}" for b in beams), beams


def test_trainer_python_and_torch_defaults(trainer):
    tomllib = pytest.importorskip("tomllib")
    assert trainer.args.get("PY") == PY
    assert trainer.base_image() == f"python:{PY}-slim-bookworm"
    torch_version = Version(trainer.args["TORCH_VERSION"])
    assert torch_version >= MIN_TORCH
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]
    spec = next(Requirement(r) for r in extra if Requirement(r).name == "torch").specifier
    assert spec.contains(torch_version), f"TORCH_VERSION {torch_version} is outside pyproject's train extra {spec}"
    assert f"torch=={torch_version}" in trainer.pip_requirements()
    assert ".[train]" in trainer.pip_requirements()


@pytest.mark.parametrize("path", [WORKER, TRAINER], ids=["worker", "trainer"])
def test_copy_sources_exist(path):
    d = Dockerfile(path)
    assert d.copies()
    for sources, _ in d.copies():
        for s in sources:
            assert (REPO / s).exists(), f"{path.relative_to(REPO)}: COPY {s}: no such file in the repo"
    # pyproject's readme must be in the image, or building the package fails there.
    copied = {s for sources, _ in d.copies() for s in sources}
    assert {"pyproject.toml", "README.md", "tokenmill"} <= copied


def test_trainer_entry_script_runs_torchrun(trainer, tmp_path):
    script = trainer.heredocs.get("/usr/local/bin/tokenmill-train")
    assert script, "the trainer Dockerfile writes /usr/local/bin/tokenmill-train from a heredoc"
    assert json.loads(trainer.all("ENTRYPOINT")[-1]) == ["tokenmill-train"]
    assert any("chmod" in r and "/usr/local/bin/tokenmill-train" in r for r in trainer.all("RUN"))
    entry = tmp_path / "tokenmill-train"
    entry.write_text(script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("torchrun", "tokenmill"):  # stand-ins that print the command line they got
        (bin_dir / name).write_text(f'#!/bin/sh\nprintf "%s\\n" {name} "$@"\n')
        (bin_dir / name).chmod(0o755)

    def run(*args: str, **env: str) -> list[str]:
        e = {k: v for k, v in os.environ.items() if k not in ("NPROC", "TORCHRUN_ARGS")}
        e.update(env, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        out = subprocess.run(["sh", str(entry), *args], env=e, capture_output=True, text=True, check=True)
        return out.stdout.splitlines()

    # "--" before tokenmill: torchrun would otherwise take `--run` for its own --run-path.
    assert run("--data", "/data", "--run", "/runs/r1") == [
        "torchrun", "--nproc-per-node", "gpu", "--no-python", "--", "tokenmill", "train",
        "--data", "/data", "--run", "/runs/r1"]
    assert run("--data", "/d", "--run", "r", NPROC="2", TORCHRUN_ARGS="--nnodes 2 --node-rank 1") == [
        "torchrun", "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--no-python", "--",
        "tokenmill", "train", "--data", "/d", "--run", "r"]
    assert run("--help") == ["tokenmill", "train", "--help"]  # the help needs no GPU


def test_trainer_entry_script_with_real_torchrun(trainer, tmp_path):
    """The real torchrun (CPU torch here) accepts the command line and runs `tokenmill train ARGS` as given."""
    pytest.importorskip("torch")
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("no torchrun next to this interpreter")
    entry = tmp_path / "tokenmill-train"
    entry.write_text(trainer.heredocs["/usr/local/bin/tokenmill-train"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    got = tmp_path / "argv"
    (bin_dir / "tokenmill").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{got}.$LOCAL_RANK"\n')
    (bin_dir / "tokenmill").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("NPROC", "TORCHRUN_ARGS")}
    # --standalone: a free local port, so parallel test runs do not collide on 29500.
    env.update(NPROC="1", TORCHRUN_ARGS="--standalone", OMP_NUM_THREADS="1",
               PATH=f"{bin_dir}{os.pathsep}{torchrun.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run(["sh", str(entry), "--data", "/data", "--run", "/runs/r1", "--set", "train.steps=1"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert Path(f"{got}.0").read_text().split() == ["train", "--data", "/data", "--run", "/runs/r1", "--set",
                                                     "train.steps=1"]


# --- pip resolution (needs a package index) ---------------------------------------------------

_NETWORK_ERRORS = re.compile(
    r"NewConnectionError|ConnectTimeout|ReadTimeout|Max retries exceeded|Temporary failure in name resolution|"
    r"Name or service not known|Network is unreachable|No route to host|ProxyError|Connection refused|"
    r"Failed to establish a new connection|nodename nor servname")


def _clean_pip_env() -> dict[str, str]:
    """This machine's environment without its pip config (local wheels, constraints): as in the image.
    Kept: the index, certificates and proxies, which say how to reach it."""
    keep = {"PIP_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_CERT", "PIP_CLIENT_CERT", "PIP_PROXY"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in keep}
    # Retries and timeout also for the pip that installs the build backend (it reads only env).
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1",
               PIP_RETRIES="1", PIP_DEFAULT_TIMEOUT="20")
    return env


def _build_context(d: Dockerfile, ctx: Path) -> None:
    """The files the Dockerfile COPYs, where its WORKDIR would hold them."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for sources, dest in d.copies():
        if dest.startswith("/"):
            continue  # outside WORKDIR: not part of what pip builds
        into_dir = dest.endswith("/") or len(sources) > 1
        for s in sources:
            src = REPO / s
            target = ctx / dest / Path(s).name if into_dir else ctx / dest
            target.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, target, ignore=ignore)
            else:
                shutil.copyfile(src, target)


@pytest.fixture(scope="module")
def resolved(tmp_path_factory) -> dict:
    """Both images' pip lines dry-run at once (~30 s, mostly network): name -> {package: version},
    and "name:sdists" -> the packages pip would build from source."""
    procs = {}
    for name, path in (("worker", WORKER), ("trainer", TRAINER)):
        d = Dockerfile(path)
        ctx = tmp_path_factory.mktemp(f"ctx-{name}")
        _build_context(d, ctx)
        report = ctx.parent / f"{name}-report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--report", str(report), *d.pip_requirements()]
        procs[name] = (subprocess.Popen(cmd, cwd=ctx, env=_clean_pip_env(), stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True), report, cmd)
    out = {}
    for name, (proc, report, cmd) in procs.items():
        try:
            log, _ = proc.communicate(timeout=170)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.skip(f"pip did not finish resolving the {name} image in 170 s (slow or no package index)")
        if proc.returncode != 0:
            hit = next((ln for ln in log.splitlines() if _NETWORK_ERRORS.search(ln)), None)
            if hit:
                pytest.skip(f"no package index reachable: {hit.strip()[:200]}")
            pytest.fail(f"the {name} image's pip install would fail:\n$ {shlex.join(cmd)}\n{log[-4000:]}")
        data = json.loads(report.read_text())
        out[name] = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in data["install"]}
        out[f"{name}:sdists"] = {i["metadata"]["name"].lower() for i in data["install"]
                                 if not i["download_info"]["url"].endswith(".whl")} - {"tokenmill"}
    return out


def test_worker_pip_install_resolves(resolved):
    import apache_beam

    pkgs = resolved["worker"]
    assert pkgs.get("apache-beam") == apache_beam.__version__
    assert "tokenmill" in pkgs
    assert {"google-cloud-storage", "boto3"} <= set(pkgs), "gcp and aws extras (gs://, s3://)"


def test_trainer_pip_install_resolves_cuda_torch(resolved):
    pkgs = resolved["trainer"]
    assert "tokenmill" in pkgs
    # python:*-slim has no compiler: everything but tokenmill itself must come as a wheel.
    assert not resolved["trainer:sdists"], f"would be built from source in the slim image: {resolved['trainer:sdists']}"
    assert Version(pkgs["torch"]) >= MIN_TORCH, pkgs["torch"]
    if sys.platform == "linux" and platform.machine() == "x86_64":
        # PyPI's Linux torch is the CUDA build: it pulls the CUDA runtime as nvidia-* wheels.
        assert any(p.startswith("nvidia-") for p in pkgs), f"torch {pkgs['torch']} without CUDA libraries"
