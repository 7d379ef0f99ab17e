"""Benchmark HTML main-text extraction: tokenmill's ``extract_html`` against other extractors.

Usage::

    python bench/extraction.py                      # every dataset, every installed extractor
    python bench/extraction.py --datasets scrapinghub --extractors tokenmill,trafilatura
    python bench/extraction.py --limit 20 --dump /tmp/out   # also write each output to a file

Datasets (read-only, from the shared data folder, see ../shared/data/SOURCES.md section 1):

* ``scrapinghub``  (scrapinghub_aeb): gold ``articleBody`` per page. Token precision/recall/F1
  per page, averaged over pages (the "mean" columns), plus micro totals over all tokens.
* ``trafilatura``  (trafilatura_eval): "with" snippets that must appear and "without" snippets
  that must not. R = fraction of "with" snippets found, P = fraction of "without" snippets
  absent, F1 = their harmonic mean; counted over all snippets of the dataset (like trafilatura's
  own evaluation, which sums the counts). Whitespace is collapsed on both sides before matching.
* ``readability``  (mozilla_readability): gold = text of ``expected.html`` (Readability.js's
  reviewed output, tags stripped); token F1 like scrapinghub. The synthetic unit-test fixtures
  listed in SYNTHETIC_FIXTURES.txt are skipped.

Tokens are ``\\w+`` runs of the lower-cased text (the same tokenisation as the upstream
scrapinghub ``evaluate.py``), compared as bags (multisets), not shingles.

Speed: pages/s on one core, single process, timing only the extraction call (the bytes are
read and gunzipped beforehand; each extractor gets one untimed warm-up call). The clock is the
process's CPU time, so that other work on the machine does not count against an extractor.
Every extractor gets the raw page bytes, as the pipeline does. This machine's speed drifts by a
third within minutes, more than the gaps between extractors: ``--repeat N`` times N more rounds
over each dataset, the extractors taking turns on every 16 pages (their order rotating), and
reports each one's median round; with two or more extractors it also prints the ratio of
tokenmill's pages/s to each other's, per round, as a median (min-max).

The shared data folder is ``$TOKENMILL_SHARED_DATA`` or ``../shared/data`` relative to the repo
root. When it is absent the script prints a message and exits 0; an extractor whose library is
not installed is skipped with a message.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing


def shared_data_dir() -> Path:
    env = os.environ.get("TOKENMILL_SHARED_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


# --------------------------------------------------------------------------- datasets


@dataclass
class Page:
    id: str
    raw: bytes
    gold: str | None = None  # full gold text (token metrics)
    with_: list[str] = field(default_factory=list)  # snippets that must appear
    without: list[str] = field(default_factory=list)  # snippets that must not appear
    url: str | None = None


def load_scrapinghub(root: Path) -> list[Page]:
    base = root / "html_extraction" / "scrapinghub_aeb"
    truth = json.loads((base / "ground-truth.json").read_text(encoding="utf-8"))
    pages = []
    for item_id, rec in sorted(truth.items()):
        path = base / "html" / f"{item_id}.html.gz"
        if path.exists():
            pages.append(
                Page(item_id, gzip.decompress(path.read_bytes()), gold=rec["articleBody"], url=rec.get("url"))
            )
    return pages


def load_trafilatura(root: Path) -> list[Page]:
    base = root / "html_extraction" / "trafilatura_eval"
    evaldata = json.loads((base / "evaldata.json").read_text(encoding="utf-8"))
    pages = []
    for url, rec in sorted(evaldata.items()):
        path = base / "html" / f"{rec['file']}.gz"
        if path.exists():
            pages.append(
                Page(
                    rec["file"],
                    gzip.decompress(path.read_bytes()),
                    with_=rec.get("with", []),
                    without=rec.get("without", []),
                    url=url,
                )
            )
    return pages


def _html_to_text(html: str) -> str:
    import lxml.html

    root = lxml.html.fromstring(html)
    # Block tags separate words that the markup separates; itertext alone would glue them.
    for el in root.iter("p", "div", "li", "h1", "h2", "h3", "h4", "h5", "h6", "br", "td", "th", "tr", "pre"):
        el.tail = "\n" + (el.tail or "")
    return root.text_content()


def load_readability(root: Path) -> list[Page]:
    base = root / "html_extraction" / "mozilla_readability"
    synthetic_file = base / "SYNTHETIC_FIXTURES.txt"
    synthetic = set(synthetic_file.read_text().split()) if synthetic_file.exists() else set()
    pages = []
    for d in sorted((base / "test-pages").iterdir()):
        if d.name in synthetic or not (d / "source.html.gz").exists() or not (d / "expected.html").exists():
            continue
        gold = _html_to_text((d / "expected.html").read_text(encoding="utf-8"))
        pages.append(Page(d.name, gzip.decompress((d / "source.html.gz").read_bytes()), gold=gold))
    return pages


DATASETS: dict[str, Callable[[Path], list[Page]]] = {
    "scrapinghub": load_scrapinghub,
    "trafilatura": load_trafilatura,
    "readability": load_readability,
}

# --------------------------------------------------------------------------- extractors
# Each factory returns a function bytes -> text (or None), or raises ImportError.


def make_tokenmill():
    from tokenmill.transforms.extract import extract_html

    return lambda raw: extract_html(raw).text


def make_trafilatura():
    import trafilatura

    return lambda raw: trafilatura.extract(raw, include_comments=False)


def make_bs4():
    import warnings

    from bs4 import BeautifulSoup, XMLParsedAsHTMLWarning

    warnings.filterwarnings("ignore", category=XMLParsedAsHTMLWarning)

    def run(raw: bytes) -> str:
        soup = BeautifulSoup(raw, "lxml")
        for el in soup(["script", "style", "noscript", "template"]):
            el.decompose()
        return soup.get_text("\n")

    return run


def make_resiliparse():
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding

    return lambda raw: extract_plain_text(bytes_to_str(raw, detect_encoding(raw)), main_content=True)


def make_selectolax():
    from selectolax.lexbor import LexborHTMLParser

    def run(raw: bytes) -> str:
        tree = LexborHTMLParser(raw)
        tree.strip_tags(["script", "style", "noscript", "template"])
        node = tree.body or tree.root
        return node.text(separator="\n") if node is not None else ""

    return run


EXTRACTORS = {
    "tokenmill": make_tokenmill,
    "trafilatura": make_trafilatura,
    "bs4_get_text": make_bs4,
    "resiliparse": make_resiliparse,
    "selectolax_strip": make_selectolax,
}

# --------------------------------------------------------------------------- metrics

_TOKEN_RE = re.compile(r"\w+")


def tokens(text: str | None) -> Counter:
    return Counter(_TOKEN_RE.findall((text or "").lower()))


def token_prf(pred: str | None, gold: str) -> tuple[int, int, int]:
    """(true positives, predicted tokens, gold tokens) for bags of tokens."""
    p, g = tokens(pred), tokens(gold)
    tp = sum((p & g).values())
    return tp, sum(p.values()), sum(g.values())


def f1(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if p + r else 0.0


def _ws(s: str) -> str:
    return " ".join(s.split())


@dataclass
class Result:
    n: int = 0
    seconds: float = 0.0
    failed: int = 0  # None / empty output
    per_page: list[tuple[str, float, float, float]] = field(default_factory=list)  # id, P, R, F1
    tp: int = 0
    npred: int = 0
    ngold: int = 0
    # snippet counts (trafilatura dataset)
    with_found: int = 0
    with_total: int = 0
    without_absent: int = 0
    without_total: int = 0

    def add_tokens(self, page: Page, out: str | None) -> None:
        tp, npred, ngold = token_prf(out, page.gold or "")
        self.tp, self.npred, self.ngold = self.tp + tp, self.npred + npred, self.ngold + ngold
        p = tp / npred if npred else (1.0 if not ngold else 0.0)
        r = tp / ngold if ngold else 1.0
        self.per_page.append((page.id, p, r, f1(p, r)))

    def add_snippets(self, page: Page, out: str | None) -> None:
        text = _ws(out or "")
        found = sum(_ws(s) in text for s in page.with_)
        absent = sum(_ws(s) not in text for s in page.without)
        self.with_found += found
        self.with_total += len(page.with_)
        self.without_absent += absent
        self.without_total += len(page.without)
        p = absent / len(page.without) if page.without else 1.0
        r = found / len(page.with_) if page.with_ else 1.0
        self.per_page.append((page.id, p, r, f1(p, r)))

    def row(self, snippets: bool) -> tuple[float, float, float, float, float, float]:
        """(P, R, F1, micro-P, micro-R, micro-F1)"""
        if snippets:
            p = self.without_absent / self.without_total if self.without_total else 1.0
            r = self.with_found / self.with_total if self.with_total else 1.0
            return p, r, f1(p, r), p, r, f1(p, r)
        n = len(self.per_page) or 1
        mp = sum(x[1] for x in self.per_page) / n
        mr = sum(x[2] for x in self.per_page) / n
        mf = sum(x[3] for x in self.per_page) / n
        up = self.tp / self.npred if self.npred else 0.0
        ur = self.tp / self.ngold if self.ngold else 0.0
        return mp, mr, mf, up, ur, f1(up, ur)


def run_one(
    name: str, fn: Callable[[bytes], str | None], dataset: str, pages: list[Page], dump: Path | None
) -> Result:
    res = Result()
    try:  # warm-up: imports, regex compilation, lazy tables
        fn(pages[0].raw)
    except Exception:
        pass
    snippets = dataset == "trafilatura"
    for page in pages:
        t0 = time.process_time()
        try:
            out = fn(page.raw)
        except Exception as exc:  # a crashing extractor scores an empty output
            print(f"  {name} failed on {page.id}: {type(exc).__name__}: {exc}", file=sys.stderr)
            out = None
        res.seconds += time.process_time() - t0
        res.n += 1
        if not out:
            res.failed += 1
        if snippets:
            res.add_snippets(page, out)
        else:
            res.add_tokens(page, out)
        if dump is not None:
            d = dump / dataset / name
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{page.id}.txt").write_text(out or "", encoding="utf-8")
    return res


def timed_rounds(
    fns: dict[str, Callable[[bytes], str | None]], pages: list[Page], rounds: int, chunk: int = 16
) -> dict[str, list[float]]:
    """pages/s of each extractor in each of ``rounds`` rounds over ``pages``. Within a round the
    extractors take turns on each run of ``chunk`` pages (tens of milliseconds: the machine's
    drift is slower), in an order that rotates from one chunk to the next."""
    names = list(fns)
    speeds: dict[str, list[float]] = {name: [] for name in names}
    turn = 0
    for _ in range(rounds):
        seconds = dict.fromkeys(names, 0.0)
        for start in range(0, len(pages), chunk):
            part = pages[start : start + chunk]
            turn += 1
            for name in names[turn % len(names):] + names[: turn % len(names)]:
                fn = fns[name]
                t0 = time.process_time()
                for page in part:
                    try:
                        fn(page.raw)
                    except Exception:
                        pass
                seconds[name] += time.process_time() - t0
        for name in names:
            speeds[name].append(len(pages) / max(seconds[name], 1e-9))
    return speeds


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated: " + ",".join(DATASETS))
    ap.add_argument(
        "--extractors", default=",".join(EXTRACTORS), help="comma-separated: " + ",".join(EXTRACTORS)
    )
    ap.add_argument("--limit", type=int, default=0, help="at most this many pages per dataset (0 = all)")
    ap.add_argument(
        "--dump", type=Path, default=None, help="write every output to DUMP/<dataset>/<extractor>/<id>.txt"
    )
    ap.add_argument("--worst", type=int, default=0, help="list the N worst tokenmill pages per dataset")
    ap.add_argument(
        "--repeat", type=int, default=0,
        help="N more timing rounds, extractors taking turns; pages/s is then the median round",
    )
    args = ap.parse_args(argv)

    root = shared_data_dir()
    if not (root / "html_extraction").is_dir():
        print(
            f"shared data not found at {root} (set TOKENMILL_SHARED_DATA); skipping the extraction benchmark"
        )
        return 0

    extractors = {}
    for name in args.extractors.split(","):
        if name not in EXTRACTORS:
            print(f"unknown extractor {name!r}; known: {', '.join(EXTRACTORS)}")
            continue
        try:
            extractors[name] = EXTRACTORS[name]()
        except ImportError as exc:
            print(f"skipping extractor {name}: not installed ({exc})")
    header = f"{'dataset':<12} {'extractor':<17} {'pages':>5} {'P':>6} {'R':>6} {'F1':>6}  {'microP':>6} {'microR':>6} {'microF1':>7} {'empty':>5} {'pages/s':>8}"
    print(header)
    print("-" * len(header))
    for dataset in args.datasets.split(","):
        if dataset not in DATASETS:
            print(f"unknown dataset {dataset!r}; known: {', '.join(DATASETS)}")
            continue
        pages = DATASETS[dataset](root)
        if args.limit:
            pages = pages[: args.limit]
        if not pages:
            print(f"{dataset:<12} (no pages found)")
            continue
        rounds = timed_rounds(extractors, pages, args.repeat) if args.repeat > 0 else {}
        for name, fn in extractors.items():
            res = run_one(name, fn, dataset, pages, args.dump)
            p, r, f, up, ur, uf = res.row(dataset == "trafilatura")
            speed = res.n / res.seconds if res.seconds else float("inf")
            if rounds:
                speed = _median(rounds[name])
            print(
                f"{dataset:<12} {name:<17} {res.n:>5} {p:>6.3f} {r:>6.3f} {f:>6.3f}  {up:>6.3f} {ur:>6.3f} {uf:>7.3f} {res.failed:>5} {speed:>8.1f}",
                flush=True,
            )
            if args.worst and name == "tokenmill":
                for pid, pp, rr, ff in sorted(res.per_page, key=lambda x: x[3])[: args.worst]:
                    print(f"    worst {pid[:40]:<40} P={pp:.2f} R={rr:.2f} F1={ff:.2f}")
        if "tokenmill" in rounds:
            for name in rounds:
                if name != "tokenmill":
                    ratios = [a / b for a, b in zip(rounds["tokenmill"], rounds[name])]
                    print(
                        f"{dataset:<12} tokenmill / {name}: {_median(ratios):.2f}x pages/s "
                        f"(rounds {min(ratios):.2f}-{max(ratios):.2f}x, {len(ratios)} rounds)",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
