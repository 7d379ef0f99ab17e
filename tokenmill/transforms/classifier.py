"""Learned quality classifiers, offline: fastText models (``tokenmill classifier train``, the
DCLM recipe) scored on every document as ``quality_classifier`` signals, with an optional
threshold (``quality:classifier_low``). Scoring uses fastText, as language ID does.

Training and scoring see the same text: ``fasttext_line`` lower-cases it and puts it on one
line (fastText reads a newline as the end of an example).
"""

from __future__ import annotations

from typing import Any

from tokenmill.config import ClassifierConfig
from tokenmill.errors import UserError
from tokenmill.transforms.doc import stored

SIGNAL = "quality_classifier"
REASON = "classifier_low"
LABEL_PREFIX = "__label__"


def fasttext_line(text: str, max_chars: int = 100_000) -> str:
    return " ".join(text[:max_chars].lower().split())


def models(cfg: ClassifierConfig) -> dict[str, str]:
    """Column -> model path, in a fixed order."""
    if cfg.model is None:
        return {}
    if isinstance(cfg.model, str):
        return {SIGNAL: cfg.model}
    return {f"{SIGNAL}_{name}": path for name, path in sorted(cfg.model.items())}


def thresholds(cfg: ClassifierConfig) -> dict[str, float]:
    """Column -> the score a document must reach."""
    if cfg.threshold is None:
        return {}
    if isinstance(cfg.threshold, dict):
        return {f"{SIGNAL}_{name}": t for name, t in cfg.threshold.items()}
    return {column: cfg.threshold for column in models(cfg)}


def load(path: str, probe: bool = False):
    """A fastText model, with one line if it does not load (the language model's loader;
    ``probe``: tried in a child process first)."""
    from tokenmill.transforms.langid import load_model

    try:
        return load_model(path, "quality.classifier.model", probe)
    except (OSError, ValueError, RuntimeError) as e:
        raise UserError(f"quality.classifier.model {path}: not a fastText model that loads ({e})") from None


def score(model, text: str, label: str) -> float:
    """P(``label``) for ``text``."""
    labels, probs = model.predict(fasttext_line(text), k=-1, threshold=-1.0)
    want = LABEL_PREFIX + label
    return next((stored(round(float(p), 6)) for lab, p in zip(labels, probs) if lab == want), 0.0)


def check(cfg: ClassifierConfig) -> None:
    """Every model loads and knows ``label``: a misnamed label would score every document 0."""
    for path in models(cfg).values():
        labels, _ = load(path, probe=True).predict("", k=-1, threshold=-1.0)
        if LABEL_PREFIX + cfg.label not in labels:
            raise UserError(f"quality.classifier.label {cfg.label!r}: {path} has labels "
                            f"{', '.join(sorted(lab.removeprefix(LABEL_PREFIX) for lab in labels))}")


class Scorer:
    """The configured models of one worker: ``apply`` stores each model's score."""

    def __init__(self, cfg: ClassifierConfig):
        self._label = cfg.label
        self._models = {column: load(path) for column, path in models(cfg).items()}

    def apply(self, doc: dict[str, Any]) -> None:
        for column, model in self._models.items():
            doc[column] = score(model, doc.get("text") or "", self._label)


def low(doc: dict[str, Any], cfg: ClassifierConfig) -> str | None:
    """The reason when a stored score is below its threshold (``cfg``: the thresholds of the
    document's language), else None."""
    for column, limit in thresholds(cfg).items():
        value = doc.get(column)
        if value is not None and value < limit:
            return REASON + column.removeprefix(SIGNAL)
    return None
