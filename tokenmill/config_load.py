"""A YAML config file, then ``--set section.key=value`` overrides, validated as a pydantic model
(the job's, tokenmill/config.py, and the trainer's); every problem is one line."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from tokenmill.errors import UserError


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in override.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def format_validation_error(err: ValidationError, where: str) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        got = e.get("input")
        shown = "" if e["type"] == "extra_forbidden" or isinstance(got, dict) else f" (got {got!r})"
        parts.append(f"{loc}: {msg}{shown}")
    return f"bad config{where}: " + "; ".join(parts)


# A config is small: a YAML document whose aliases expand it past this many values (a "billion
# laughs" of nested anchors takes gigabytes and hours once validated) is refused.
MAX_YAML_VALUES = 100_000


def _yaml(text: str, where: str) -> Any:
    """``yaml.safe_load(text)``, refusing a document whose anchors and aliases expand it past
    MAX_YAML_VALUES values: counted on the composed node graph, each node once, before
    anything is built."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        sizes: dict[int, int] = {}

        def expanded(n) -> int:
            if id(n) not in sizes:
                kids = [c for pair in n.value for c in pair] if isinstance(n, yaml.MappingNode) else (
                    n.value if isinstance(n, yaml.SequenceNode) else [])
                sizes[id(n)] = min(1 + sum(expanded(k) for k in kids), MAX_YAML_VALUES + 1)
            return sizes[id(n)]

        if expanded(node) > MAX_YAML_VALUES:
            raise UserError(f"{where}: its anchors and aliases expand it to more than {MAX_YAML_VALUES:,} values; "
                            "refused (a config needs far fewer)")
        return loader.construct_document(node)
    except RecursionError:
        raise UserError(f"{where}: nested too deeply to be a config") from None
    finally:
        loader.dispose()


def parse_set(item: str) -> tuple[list[str], Any]:
    """``language.keep=[en,de]`` -> (["language", "keep"], ["en", "de"]); the value is YAML."""
    if "=" not in item:
        raise UserError(f"--set {item!r}: expected section.key=value")
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise UserError(f"--set {item!r}: empty key")
    try:
        value = _yaml(raw, f"--set {key.strip()}") if raw.strip() else ""
    except yaml.YAMLError as e:
        # A broken list or mapping ("[en") taken as a string would be validated as something
        # the user did not mean; a string that YAML cannot read can be quoted.
        problem = getattr(e, "problem", None) or "cannot be parsed"
        raise UserError(f"--set {item!r}: the value is not valid YAML ({problem}); "
                        f"quote it to pass a string: {key}='...'") from None
    return path, value


def load_validated(model: type[BaseModel], path: str | None = None, overrides: list[str] | None = None,
                   base: dict[str, Any] | None = None):
    """YAML file, then ``--set`` overrides, validated as ``model``; every problem is one line.
    Shared by the pipeline and the trainer config. ``base``: settings the file and the
    overrides apply to (refilter: the original run's)."""
    data: dict[str, Any] = {}
    if path:
        p = Path(path)
        if not p.is_file():
            raise UserError(f"config file not found: {path}")
        try:
            loaded = _yaml(p.read_text(encoding="utf-8"), f"config file {path}")
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            mark = getattr(e, "problem_mark", None)
            at = f" line {mark.line + 1}" if mark else ""
            raise UserError(f"config file {path}{at}: not valid YAML") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise UserError(f"config file {path}: expected a mapping of sections, got {type(loaded).__name__}")
        data = loaded
    if base is not None:
        data = deep_merge(copy.deepcopy(base), data)
    for item in overrides or []:
        keys, value = parse_set(item)
        node = data
        for k in keys[:-1]:
            nxt = node.setdefault(k, {})
            if not isinstance(nxt, dict):
                raise UserError(f"--set {item!r}: {k} is not a section")
            node = nxt
        node[keys[-1]] = value
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise UserError(format_validation_error(e, f" in {path}" if path else "")) from None
