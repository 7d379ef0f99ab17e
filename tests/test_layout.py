"""The house rules of the package layout: which layer may import which, module size and names,
and that modules meet through public names.

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
PURE_CORES = ([m for m in _modules(PKG / "transforms" / "extract") if not m.endswith(".extract_fn")]
              + [m for m in _modules(PKG / "transforms" / "dedup")
                 if m.rsplit(".", 1)[1] not in ("components", "dedup_transform", "stats")])


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


def test_module_names_are_unique_and_shadow_no_standard_module():
    """A module's name says what it holds: no two share one (``stage.py`` five times over), and
    none is also a standard library module's (``tempfile``, ``inspect``, ``tokenize``)."""
    names: dict[str, list[str]] = {}
    for p in PKG.rglob("*.py"):
        if p.name != "__init__.py":
            names.setdefault(p.stem, []).append(str(p.relative_to(PKG.parent)))
    assert {n: ps for n, ps in names.items() if len(ps) > 1} == {}
    assert sorted(n for n in names if n in sys.stdlib_module_names) == []


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_from(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name of the module an ``from X import ...`` reads, relative ones resolved."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")[: None if is_package else -1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_imports() -> list[str]:
    """Every import of an underscore name (``_x``, not ``__x__``) from another tokenmill module,
    relative imports within a package included, and of a module whose own name is private."""
    found = []
    for path in sorted(PKG.rglob("*.py")):
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                source = _imported_from(module, path.name == "__init__.py", node)
                if source.split(".")[0] != "tokenmill" or source == module:
                    continue
                names = [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [part for a in node.names if a.name.split(".")[0] == "tokenmill"
                         for part in a.name.split(".")]
                source = "import"
            else:
                continue
            found += [f"{module}:{node.lineno} {source} {n}" for n in names
                      if n.startswith("_") and not n.startswith("__")]
    return found


def test_no_module_imports_another_modules_private_name():
    """Modules meet through public names: a name another module needs loses its underscore (a
    package's ``__init__`` names what other packages use); an underscore name stays in its module."""
    assert private_imports() == []
