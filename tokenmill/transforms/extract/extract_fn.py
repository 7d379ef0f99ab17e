"""The extract stage: records that carry raw HTML get their main text; text records pass.

The HTML algorithm itself is ``extract_html`` in ``core`` (a pure function); this module is its
thin Beam wrapper and the place that turns its result into a drop reason."""

from __future__ import annotations

from tokenmill.config import ExtractConfig
from tokenmill.errors import UserError
from tokenmill.transforms.doc import drop
from tokenmill.transforms.stage_base import Stage, StageFn


def extract_doc(doc: dict, cfg: ExtractConfig) -> dict:
    html, doc["html"] = doc.get("html"), None  # raw HTML is heavy: never carried further
    if html is None:
        return doc if doc.get("text") else drop(doc, "extract", "no_text")
    if not cfg.enabled:
        return drop(doc, "extract", "disabled")
    from .core import extract_html  # lxml import only where HTML is met

    res = extract_html(html, encoding_hint=doc.get("encoding"), url=doc.get("url"),
                       max_bytes=cfg.max_html_bytes, timeout_s=cfg.timeout_s, include_title=cfg.include_title)
    if res.reason:
        return drop(doc, "extract", res.reason)
    doc["text"] = res.text
    return doc


class ExtractFn(StageFn):
    stage = "extract"

    def __init__(self, cfg: ExtractConfig):
        super().__init__(cfg)
        from .tree import identity

        self.identity = identity()  # the launcher's: a worker must match it (setup)

    def setup(self):
        from .tree import TEXT_DECIDING, identity

        mine = identity()
        differ = ", ".join(f"{k} {mine.get(k)} (launcher: {self.identity.get(k)})" for k in TEXT_DECIDING
                           if mine.get(k) != self.identity.get(k))
        if differ:
            raise UserError(f"extract: this worker's extractor differs from the launcher's ({differ}); one job would "
                            "mix texts of two builds: install the same tokenmill build on the workers")

    def apply(self, doc):
        return extract_doc(doc, self.cfg)


# The stored text is its result; with extract off, raw HTML is dropped as extract:disabled.
SPEC = Stage("extract", "extract", ExtractFn, changed_text=lambda doc: True, runs_disabled=True)
