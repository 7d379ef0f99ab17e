"""``tokenmill config``: a config model's defaults as commented YAML, every key under its help.

The help is each field's ``description`` (declared once, in the model); the values are the
model's defaults, so the text, given back to ``--config``, is the default config.
"""

from __future__ import annotations

import textwrap

import yaml
from pydantic import BaseModel

WIDTH = 100


def _comment(text: str, indent: str) -> list[str]:
    return textwrap.wrap(" ".join(text.split()), WIDTH - len(indent) - 2, initial_indent=f"{indent}# ",
                         subsequent_indent=f"{indent}# ", break_long_words=False, break_on_hyphens=False)


def _flow(value) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=1 << 16)
    return text.removesuffix("\n...\n").strip()  # a scalar is dumped as a document: "5\n...\n"


def _value(name: str, value, indent: str) -> list[str]:
    """``name: value`` in YAML, in flow style; a mapping of lists or mappings as a block of them."""
    if isinstance(value, dict) and any(isinstance(v, (dict, list)) for v in value.values()):
        return [f"{indent}{_flow(name)}:"] + [line for k, v in value.items() for line in _value(k, v, indent + "  ")]
    return [f"{indent}{_flow(name)}: {_flow(value)}"]


def _lines(model: BaseModel, indent: str) -> list[str]:
    out: list[str] = []
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if not indent and out:
            out.append("")  # top-level keys (the sections) apart
        out += _comment(field.description or "", indent)
        if isinstance(value, BaseModel):
            out += [f"{indent}{name}:"] + _lines(value, indent + "  ")
        else:
            out += _value(name, model.model_dump(mode="python", include={name})[name], indent)
    return out


def config_yaml(model: BaseModel, title: str) -> str:
    """``model`` (a default instance) as YAML under a ``title`` comment, each key under its help."""
    return "\n".join([*_comment(title, ""), "", *_lines(model, "")]) + "\n"


def default_yaml(train: bool = False) -> str:
    """`tokenmill config`: the job's default config, or (``train``) the trainer's."""
    if train:
        from tokenmill.trainer.train_config import TrainJobConfig  # pydantic only: no torch

        model, title = TrainJobConfig(), "tokenmill train --config: the trainer's default config"
    else:
        from tokenmill.config import JobConfig

        model, title = JobConfig(), "tokenmill prepare --config: the default job config"
    return config_yaml(model, f"{title}. Every key with its default under its help; a file needs only the keys it changes.")
