"""HTML main-text extraction: a pure core, and the pipeline's extract stage around it.

``extract_html(raw)`` turns one page (bytes or str) into its main text: paragraphs (p, headings,
div-level runs of text, whole lists and tables) separated by a blank line, one line per list
item, table cell or <br>-broken line inside them, with menus, headers, footers, sidebars, cookie banners,
comments, share widgets and related-article lists left out. It never raises: a page it cannot
use comes back with ``text=None`` and a short ``reason``.

How it works, and why this way (bench/MEASUREMENTS.md: HTML extraction):

1. Sniff and decode. Binary junk is refused by magic numbers and control-byte ratio. Bytes are
   decoded by BOM, then strict UTF-8 (most of the web, and the cheapest test), then the declared
   charsets (HTTP header hint, <meta>), and only then statistical detection (charset-normalizer),
   which costs milliseconds and is needed only for undeclared legacy pages.
2. Parse with lexbor (selectolax's HTML5 parser: the tree browsers build, in a third of libxml2's
   time) and walk its nodes in compiled code (lexbor_walk.pyx). Pages nested past what lexbor
   parses in linear time (tree.py's limits), and installs where that walk was not built, parse
   with lxml's libxml2 HTML parser instead (the same text on all but a few malformed pages).
   libxml2 stops at a nesting depth of 2048 even with
   huge_tree; such pages are re-parsed by a flat tokenizer (the stdlib's html.parser) into a tree
   capped in depth, so nothing here ever recurses over the tree.
3. Walk the tree once, iteratively (walk.py's ``py_walk`` is the reference), into "nodes" (block-level elements:
   tag, parent, class/id hints) and "blocks" (runs of text between block boundaries, with their
   link-text share). Everything afterwards works on these flat lists.
4. Choose the main content like Readability does: paragraphs score their ancestors (length,
   commas), scores are damped by link density and by class/id name hints, the best node is
   widened to ancestors and siblings that look like article text (and to the lead: the real
   paragraphs and subheadings between the headline, or the start of its <article>, and the
   body), and inside it, link-heavy or negatively named boxes are removed. If that yields too
   little text, retry with fewer filters. Class names are "hard" (comments, cookie banners,
   share bars: always out) or "soft" (sidebar, nav, ad: out unless the box holds real prose,
   since layout wrappers are often named so). Last, line-level polish: short link lines and
   cross-references ("Read more: <headline>") go. A page left without text falls back on its
   <noscript> content (pages that write their body with a script).

The core is pure functions; no signals (Beam runs DoFns in threads): a cooperative deadline is
checked while walking and scoring.

The package, a module a concern: ``sniff`` and ``decode`` (step 1), ``tree`` (step 2: parsing,
the attribute cap, lexbor's limits, the flat fallback), ``walk`` (step 3) with ``hints`` (the class/id vocabularies),
``score`` and ``content`` (step 4: scoring and choosing the node; cleaning, retries, polish)
(the cooperative deadline is every stage's: transforms/deadline.py); ``core`` holds ``extract_html`` and ``Extracted``,
``extract_fn`` the Beam stage ``ExtractFn`` and ``SPEC``, extract's entry in the stage list
(transforms/stages.py).

Other packages use the names in ``__all__``; the modules' other public names are the package's
own seams between its modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .decode import decode_html

if TYPE_CHECKING:
    from .core import Extracted, extract_html
    from .extract_fn import SPEC, ExtractFn, extract_doc

__all__ = ["SPEC", "ExtractFn", "Extracted", "decode_html", "extract_doc", "extract_html"]


def __getattr__(name: str):
    # Loaded on first use: ``core`` imports lxml, which a pipeline that never meets HTML does not
    # pay for; ``extract_fn`` imports Beam, which the pure core does not need.
    if name in ("Extracted", "extract_html"):
        from . import core

        return getattr(core, name)
    if name in ("SPEC", "ExtractFn", "extract_doc"):
        from . import extract_fn

        return getattr(extract_fn, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
