"""The house rules of the package layout: which layer may import which, and module size.

The trainer and the output format work without the pipeline layer (no Beam on a GPU box), and
the pure cores of the stages can be called and tested without Beam.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "tokenmill"
MAX_LINES = 500


def _modules(folder: Path) -> list[str]:
    return sorted(".".join(p.relative_to(PKG.parent).with_suffix("").parts) for p in folder.glob("*.py")
                  if p.name != "__init__.py")


TRAINER_SIDE = ["tokenmill.format", "tokenmill.data", "tokenmill.page", *_modules(PKG / "trainer")]
PURE_CORES = ([m for m in _modules(PKG / "transforms" / "extract") if not m.endswith(".stage")]
              + [m for m in _modules(PKG / "transforms" / "dedup")
                 if m.rsplit(".", 1)[1] not in ("components", "stage", "stats")])


def _loaded_after_import(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    """The modules under ``prefixes`` that importing ``modules`` loads, in a fresh interpreter."""
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            f"print('\\n'.join(sorted(k for k in sys.modules if k.startswith({prefixes!r}))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=PKG.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_the_trainer_and_the_format_load_no_pipeline_layer():
    loaded = _loaded_after_import(TRAINER_SIDE, ("apache_beam", "tokenmill.transforms", "tokenmill.pipelines"))
    assert loaded == []


def test_the_trainer_imports_nothing_from_the_pipeline_layer_anywhere():
    """Also imports inside functions, which the runtime check above cannot see."""
    for path in (PKG / "trainer").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(("apache_beam", "tokenmill.transforms", "tokenmill.pipelines")), \
                    f"{path.name}:{node.lineno} imports {name}"


def test_the_pure_cores_load_no_beam():
    assert len(PURE_CORES) >= 15  # extract's and dedup's pure modules are all here
    assert _loaded_after_import(PURE_CORES, ("apache_beam",)) == []


def test_no_module_is_over_500_lines():
    long = {str(p.relative_to(PKG.parent)): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
