"""Language identification with fastText.

The default model is lid.176.ftz, shipped inside tokenmill (tokenmill/models/).
Any other fastText model works (lid.176.bin, GlotLID); labels are mapped to ISO 639-1 where
one exists (``__label__eng_Latn`` -> ``en``, ``__label__deu`` -> ``de``).
"""

from __future__ import annotations

import contextlib
import functools
import os

from tokenmill import native
from tokenmill.beamfs import FileSystems
from tokenmill.config import LanguageConfig
from tokenmill.errors import UserError
from tokenmill.private import is_throwaway, local_copy
from tokenmill.transforms.doc import drop, stored
from tokenmill.transforms.stage_base import Stage, StageFn


def default_model_path() -> str:
    """lid.176.ftz, shipped inside tokenmill (tokenmill/models/README.md)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "lid.176.ftz")
    if not os.path.isfile(path):
        raise UserError(f"language: lid.176.ftz not found at {path} (a broken install: reinstall tokenmill)")
    return path


def resolve_model_path(cfg: LanguageConfig) -> str:
    path = cfg.model or default_model_path()
    exists = FileSystems.exists(path) if "://" in path else os.path.isfile(path)
    if not exists:
        raise UserError(f"language.model: file not found: {path}")
    return path


def load_model(path: str, what: str = "language.model", probe: bool = False):
    """The fastText model at ``path``. ``probe``: load it in a child process first (the pre-flight
    checks do; see tokenmill.native), so a crafted model that crashes fastText is one line."""
    import fasttext

    local = local_copy(path)
    try:
        if probe and os.path.realpath(local) != os.path.realpath(default_model_path()):
            native.check_fasttext(local, what)
        return fasttext.load_model(local)
    except UserError:
        raise
    except Exception as e:  # fastText raises ValueError on a file that is not a model
        raise UserError(f"{what}: {path} is not a fastText model ({e})") from None
    finally:  # fastText reads the whole file: a copy of this process's own is done with
        if is_throwaway(local):
            with contextlib.suppress(OSError):
                os.unlink(local)


@functools.lru_cache(maxsize=4096)
def iso_code(label: str) -> str:
    """``__label__eng_Latn`` / ``__label__deu`` / ``__label__de`` -> ISO 639-1 where one exists."""
    code = label.removeprefix("__label__").split("_")[0].split("-")[0].lower()
    if len(code) == 3:
        import pycountry

        lang = pycountry.languages.get(alpha_3=code)
        if lang is not None and getattr(lang, "alpha_2", None):
            return lang.alpha_2
    return code


def check_languages(cfg: LanguageConfig, more: dict[str, list[str]] | None = None) -> None:
    """The model loads, and every code in ``keep`` and ``thresholds`` is one of its labels: a code
    it never predicts (``eng``, ``en-US``, ``klingon``) would drop the whole corpus."""
    path = resolve_model_path(cfg)
    # Every label: k=-1 with a threshold below any probability.
    labels, _ = load_model(path, probe=True).predict("", k=-1, threshold=-1.0)
    known = {iso_code(label) for label in labels}
    keys = {"language.keep": cfg.keep, "language.thresholds": list(cfg.thresholds), **(more or {})}
    for key, codes in keys.items():
        for code in codes:
            if code not in known:
                near = iso_code(code.replace("-", "_"))
                hint = f"did you mean {near!r}? " if near in known and near != code else ""
                raise UserError(f"{key}: {code!r} is not a language the model {os.path.basename(path)} "
                                f"knows ({hint}it knows {len(known)}, e.g. {', '.join(sorted(known)[:8])}, ...)")


def model_text(text: str, max_chars: int) -> str:
    # fastText predicts on one line; a prefix settles the label and bounds the cost.
    return text[:max_chars].replace("\n", " ")


def predict(model, text: str, max_chars: int) -> tuple[str, float]:
    """(ISO code, probability) of the top label of one text."""
    labels, scores = model.predict(model_text(text, max_chars), k=1)
    if not labels:
        return "und", 0.0
    return iso_code(labels[0]), min(1.0, float(scores[0]))


def decide(lang: str, score: float, cfg: LanguageConfig) -> str | None:
    """The drop reason for a labelled doc, or None to keep it. An empty keep list only labels."""
    if not cfg.keep:
        return None
    if lang not in cfg.keep:
        return "not_in_keep"
    if score < cfg.thresholds.get(lang, cfg.threshold):
        return "low_score"
    return None


# ---------------------------------------------------------------- Beam wrapper


class LanguageFn(StageFn):
    stage = "language"
    model = None  # loaded in setup

    def setup(self):
        # Loaded once per worker, from the installed package or the path the config names.
        self.model = load_model(resolve_model_path(self.cfg))

    def apply(self, doc):
        doc["lang"], score = predict(self.model, doc["text"], self.cfg.max_chars)
        doc["lang_score"] = stored(score)
        return self.redecide(doc)

    def redecide(self, doc):
        """The decision on the document's label and score (as stored: refilter calls this on a
        stored row, without setup)."""
        reason = decide(doc.get("lang"), doc.get("lang_score"), self.cfg)
        return drop(doc, self.stage, reason) if reason else doc


def _check(cfg: LanguageConfig, job) -> None:
    # quality.per_lang names languages too: they must be ones this model can label.
    check_languages(cfg, {"quality.per_lang": list(job.quality.per_lang)} if job.quality.enabled else None)


def _refilter_check(new: dict, old: dict, src: str) -> None:
    if new["enabled"] != old["enabled"] or (new["enabled"] and (
            new["model"] != old["model"] or new["max_chars"] != old["max_chars"])):
        raise UserError(f"refilter: language labels come from {src} (on or off, its model, max_chars): "
                        f"run prepare again to label them anew")


SPEC = Stage("language", "language", LanguageFn, check=_check,
             report={"lang": None, "lang_score": (0.0, 1.0, 20, False)},
             refilter="redecide", refilter_check=_refilter_check,
             reads=lambda cfg: {"language.model": [cfg.model] if cfg.model else []})
