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
- The image that runs the trainer apt-installs a C compiler (torch.compile's Triton builds its
  launcher with gcc or clang at run time) with the C headers, from fresh apt lists it removes after.
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

    def commands(self, run: str) -> list[list[str]]:
        """A RUN line split into its shell commands (at &&, ;, |, ||, &), each a list of words."""
        lex = shlex.shlex(self.expand(run), posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        cmds: list[list[str]] = [[]]
        for tok in lex:
            if tok in ("&&", ";", "|", "||", "&"):
                cmds.append([])
            else:
                cmds[-1].append(tok)
        return [c for c in cmds if c]

    def pip_requirements(self) -> list[str]:
        """Requirement strings of every `pip install` in a RUN (options and their values left out)."""
        reqs = []
        for run in self.all("RUN"):
            for words in self.commands(run):
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

    def stages(self) -> list[dict]:
        """Each FROM: {"base": its image or stage (ARGs expanded), "name": AS name, "instructions"}."""
        stages: list[dict] = []
        for op, rest in self.instructions:
            if op == "FROM":
                words = [w for w in rest.split() if not w.startswith("--")]  # --platform=...
                name = words[2].lower() if len(words) > 2 and words[1].lower() == "as" else None
                stages.append({"base": self.expand(words[0]), "name": name, "instructions": []})
            elif stages:
                stages[-1]["instructions"].append((op, rest))
        return stages

    def final_image(self) -> list[dict]:
        """The stages the default build target is made of: the last one and, first, the earlier
        stages it is built FROM (not those it only copies files from)."""
        stages = self.stages()
        chain = [len(stages) - 1]
        while parent := [i for i in range(chain[-1]) if stages[i]["name"] == stages[chain[-1]]["base"].lower()]:
            chain.append(parent[-1])
        return [stages[i] for i in reversed(chain)]

    def copies(self) -> list[tuple[list[str], str]]:
        out = []
        for rest in self.all("COPY"):
            words = [w for w in shlex.split(rest) if not w.startswith("--")]
            if words and not words[0].startswith("<<"):
                out.append((words[:-1], words[-1]))
        return out


_APT_OPTS_WITH_VALUE = {"-o", "--option", "-t", "--target-release", "--default-release", "-c", "--config-file"}


def apt_command(words: list[str]) -> tuple[list[str], list[str]] | None:
    """(options with their values, other words) when the shell command is `[VAR=x ...] apt-get|apt ...`."""
    while words and re.match(r"\w+=", words[0]):
        words = words[1:]
    if not words or words[0].rsplit("/", 1)[-1] not in ("apt-get", "apt"):
        return None
    opts, args, k = [], [], 1
    while k < len(words):
        w = words[k]
        if w in _APT_OPTS_WITH_VALUE:
            opts += words[k:k + 2]
            k += 2
            continue
        (opts if w.startswith("-") else args).append(w)
        k += 1
    return opts, args


def apt_install(words: list[str]) -> tuple[list[str], list[str]] | None:
    """(options, package names) when the shell command is an `apt-get install` (or `apt install`)."""
    cmd = apt_command(words)
    if cmd is None or cmd[1][:1] != ["install"]:
        return None
    return cmd[0], [re.split(r"[=/:]", a)[0] for a in cmd[1][1:]]  # gcc=VERSION, gcc/RELEASE, gcc:ARCH


# Triton (torch.compile's GPU code generator) builds its launcher at run time with $CC, else `gcc`,
# else `clang` from PATH: these packages install one (a versioned gcc-12 or clang-14 installs only
# gcc-12 / clang-14, which Triton finds only through ENV CC). The C headers and crt files come from
# libc6-dev, which gcc only Recommends; g++, clang and build-essential Depend on it.
_CC_PACKAGES = {"gcc", "g++", "clang", "build-essential"}
_VERSIONED_CC = re.compile(r"(gcc|g\+\+|clang)-\d+")
_LIBC_DEV = {"libc6-dev", "libc-dev"}
_DEPEND_ON_LIBC_DEV = re.compile(r"g\+\+(-\d+)?|clang(-\d+)?|build-essential")


def c_compiler_problems(d: Dockerfile) -> list[str]:
    """Why the image that `docker build` makes by default (the last stage, with the stages it is built
    FROM) could not compile Triton's launcher at run time; empty when it can."""
    image = d.final_image()
    instructions = [i for stage in image for i in stage["instructions"]]
    entry = [json.loads(rest) if rest.startswith("[") else shlex.split(rest)
             for op, rest in instructions if op == "ENTRYPOINT"]
    if not entry or entry[-1] != ["tokenmill-train"]:
        return [f"the last stage (FROM {image[-1]['base']}) does not run tokenmill-train: the compiler must "
                "be in the stage that runs the trainer"]
    problems, packages, cc_env, recommends = [], set(), False, False
    for op, rest in instructions:
        if op == "ENV":
            words = shlex.split(rest)  # ENV CC=gcc-12 [K=V ...], or the old ENV CC gcc-12
            cc_env |= words[:1] == ["CC"] or any(w.startswith("CC=") for w in words)
        if op != "RUN":
            continue
        cmds = d.commands(rest)
        for k, words in enumerate(cmds):
            got = apt_install(words)
            if got is None:
                continue
            opts, pkgs = got
            packages |= set(pkgs)
            no_rec = "--no-install-recommends" in opts or any(
                re.fullmatch(r"APT::Install-Recommends=[\"']?(false|0|no)[\"']?", o, re.I) for o in opts)
            recommends |= not no_rec and any(p in _CC_PACKAGES or _VERSIONED_CC.fullmatch(p) for p in pkgs)
            if not any((apt_command(c) or ([], []))[1][:1] == ["update"] for c in cmds[:k]):
                problems.append(f"RUN {rest[:80]}...: no `apt-get update` before the install in the same RUN "
                                "(the base image keeps no apt lists)")
            if not any(c[0] == "rm" and any(a.startswith("/var/lib/apt/lists") for a in c) for c in cmds[k + 1:]):
                problems.append(f"RUN {rest[:80]}...: the apt lists are not removed (rm -rf /var/lib/apt/lists/*) "
                                "in the same RUN, so they stay in the layer")
    compilers = {p for p in packages if p in _CC_PACKAGES or (cc_env and _VERSIONED_CC.fullmatch(p))}
    if not compilers:
        problems.append(f"no C compiler apt-installed in the image that runs the trainer (apt packages: "
                        f"{sorted(packages)}): torch.compile (parallel.compile=true) fails there; install one "
                        f"of {sorted(_CC_PACKAGES)}")
    elif not (packages & _LIBC_DEV or recommends or any(_DEPEND_ON_LIBC_DEV.fullmatch(p) for p in packages)):
        problems.append(f"{sorted(compilers)} without libc6-dev (a Recommends of gcc, left out by "
                        "--no-install-recommends): no C headers or crt files to build with")
    # Python.h: the python:* images build CPython into /usr/local and keep its headers
    # (/usr/local/include/python3.X, also in the -slim ones); a distribution Python needs its -dev package.
    if not re.match(r"(docker\.io/)?(library/)?python:", image[0]["base"]) and not packages & {
            "python3-dev", f"python{PY}-dev", "libpython3-dev"}:
        problems.append(f"base {image[0]['base']} is not a python:* image and python3-dev is not installed: "
                        "no Python.h for Triton's launcher")
    return problems


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


def test_trainer_image_has_a_c_compiler(trainer):
    assert not c_compiler_problems(trainer), "\n".join(c_compiler_problems(trainer))


_SLIM = "FROM python:3.11-slim-bookworm\n"
_APT = "RUN apt-get update && apt-get install -y --no-install-recommends {} && rm -rf /var/lib/apt/lists/*\n"
_RUNS = "ENTRYPOINT [\"tokenmill-train\"]\n"


@pytest.mark.parametrize(("text", "problem"), [
    (_SLIM + "RUN pip install torch\n" + _RUNS, "no C compiler"),
    (_SLIM + _APT.format("curl ca-certificates") + _RUNS, "no C compiler"),
    # the compiler only in a build stage the trainer's stage copies from, not in the image
    ("FROM python:3.11-slim-bookworm AS build\n" + _APT.format("gcc libc6-dev") + _SLIM
     + "COPY --from=build /x /x\n" + _RUNS, "no C compiler"),
    ("FROM python:3.11-slim-bookworm AS base\n" + _APT.format("gcc libc6-dev") + _RUNS
     + "FROM base AS other\nRUN true\n" + _SLIM + "CMD [\"x\"]\n", "does not run tokenmill-train"),
    (_SLIM + _APT.format("gcc") + _RUNS, "without libc6-dev"),
    (_SLIM + _APT.format("gcc-12 libc6-dev") + _RUNS, "no C compiler"),  # no `gcc` on PATH
    (_SLIM + "RUN apt-get install -y gcc libc6-dev && rm -rf /var/lib/apt/lists/*\n" + _RUNS, "apt-get update"),
    (_SLIM + "RUN apt-get update\nRUN apt-get install -y gcc libc6-dev && rm -rf /var/lib/apt/lists/*\n"
     + _RUNS, "apt-get update"),
    (_SLIM + "RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev\n" + _RUNS,
     "apt lists are not removed"),
    ("FROM debian:bookworm-slim\n" + _APT.format("python3 python3-pip gcc libc6-dev") + _RUNS, "Python.h"),
    # accepted
    (_SLIM + _APT.format("gcc libc6-dev") + _RUNS, None),
    (_SLIM + _APT.format("build-essential") + _RUNS, None),
    (_SLIM + _APT.format("clang") + _RUNS, None),
    (_SLIM + "RUN apt-get update && apt-get install -y gcc && rm -rf /var/lib/apt/lists/*\n" + _RUNS, None),
    (_SLIM + "ENV CC=gcc-12\n" + _APT.format("gcc-12 libc6-dev") + _RUNS, None),
    (_SLIM + "RUN set -eux; apt-get update; \\\n  DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Use-Pty=0 install \\\n"
     "  --no-install-recommends gcc=4:12.2.0-3 g++; \\\n  rm -rf /var/lib/apt/lists/*\n" + _RUNS, None),
    ("FROM python:3.11-slim-bookworm AS base\n" + _APT.format("gcc libc6-dev")
     + "FROM base AS trainer\n" + _RUNS, None),
    ("FROM debian:bookworm-slim\n" + _APT.format("python3-dev python3-pip gcc libc6-dev") + _RUNS, None),
], ids=["pip-only", "no-compiler-package", "compiler-in-build-stage", "last-stage-not-trainer", "gcc-no-libc-dev",
        "gcc-12-without-CC", "no-apt-update", "apt-update-in-other-RUN", "lists-kept", "debian-no-python-dev",
        "gcc-libc-dev", "build-essential", "clang", "gcc-with-recommends", "gcc-12-with-CC", "shell-variants",
        "FROM-a-stage", "debian-python3-dev"])
def test_c_compiler_check_itself(tmp_path, text, problem):
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    problems = c_compiler_problems(Dockerfile(path))
    if problem is None:
        assert not problems, problems
    else:
        assert any(problem in p for p in problems), problems


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_worker_pip_install_resolves(resolved):
    import apache_beam

    pkgs = resolved["worker"]
    assert pkgs.get("apache-beam") == apache_beam.__version__
    assert "tokenmill" in pkgs
    assert {"google-cloud-storage", "boto3"} <= set(pkgs), "gcp and aws extras (gs://, s3://)"


@pytest.mark.slow
def test_trainer_pip_install_resolves_cuda_torch(resolved):
    pkgs = resolved["trainer"]
    assert "tokenmill" in pkgs
    # Everything but tokenmill itself must come as a wheel: the image's compiler is there for
    # torch.compile, and an sdist would still miss the -dev packages it builds against.
    # apache-beam 2.62's own pins that PyPI has only as sdists build without a compiler (pure
    # Python; crcmod's C extension is optional and falls back to Python).
    sdists = resolved["trainer:sdists"] - {"dill", "crcmod", "docopt", "hdfs"}
    assert not sdists, f"would be built from source in the slim image: {sdists}"
    assert Version(pkgs["torch"]) >= MIN_TORCH, pkgs["torch"]
    if sys.platform == "linux" and platform.machine() == "x86_64":
        # PyPI's Linux torch is the CUDA build: it pulls the CUDA runtime as nvidia-* wheels.
        assert any(p.startswith("nvidia-") for p in pkgs), f"torch {pkgs['torch']} without CUDA libraries"
