"""Tests of the HTML main-text extraction core (tokenmill.transforms.extract)."""

from __future__ import annotations

import gzip
import json
import os
import re
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from tokenmill.transforms.extract import Extracted, decode_html, extract_html

ARTICLE = [
    "The river rose three metres overnight, flooding the lower town and forcing hundreds of families "
    "to leave their homes before dawn.",
    "Officials said the water would recede slowly, and that schools, shops and the market would stay "
    "closed until at least Thursday.",
    "Volunteers from neighbouring villages brought boats, food and blankets, while engineers checked "
    "the old stone bridge for damage.",
]

PAGE = f"""<!DOCTYPE html>
<html><head><title>Flood in the lower town - Example News</title>
<style>p {{ color: red; }} .secret {{ display: none }}</style>
<script>var tracking = "SCRIPT_TEXT";</script></head>
<body>
<header class="site-header"><a href="/">Example News</a>
  <nav><ul><li><a href="/world">World</a></li><li><a href="/sport">Sport</a></li></ul></nav></header>
<div id="cookie-banner" class="cookie-consent">We use cookies to improve your experience. <a href="#">Accept all</a></div>
<main>
<article>
  <h1>Flood in the lower town</h1>
  <div class="share-tools"><a href="#">Facebook</a> <a href="#">Twitter</a> <a href="#">Email</a></div>
  <div class="article-body">
    <p>{ARTICLE[0]}</p>
    <p>{ARTICLE[1]}</p>
    <h2>Help arrives</h2>
    <p>{ARTICLE[2]}</p>
  </div>
</article>
<section id="comments" class="comments-area">
  <h3>3 comments</h3>
  <div class="comment"><p>COMMENT_TEXT: what a terrible night, I hope everyone is safe and dry now, truly.</p></div>
</section>
<aside class="sidebar"><h3>Most read</h3><ul><li><a href="/a">SIDEBAR_LINK one</a></li><li><a href="/b">Two</a></li></ul></aside>
</main>
<footer><p>Copyright 2024 Example News. FOOTER_TEXT All rights reserved.</p></footer>
<noscript>NOSCRIPT_TEXT</noscript>
</body></html>"""


def lines(result: Extracted) -> list[str]:
    assert result.text is not None, result
    return result.text.split("\n")


# --------------------------------------------------------------------------- content and boilerplate


def test_main_text_kept_and_boilerplate_removed():
    r = extract_html(PAGE.encode("utf-8"))
    assert r.reason is None and r.encoding == "utf-8"
    out = lines(r)
    for paragraph in ARTICLE:
        assert paragraph in out
    assert "Help arrives" in out  # a subheading inside the article stays, on its own line
    for junk in (
        "SCRIPT_TEXT",
        "color: red",
        "COMMENT_TEXT",
        "SIDEBAR_LINK",
        "FOOTER_TEXT",
        "NOSCRIPT_TEXT",
        "cookies",
        "World",
        "Facebook",
        "Most read",
    ):
        assert junk not in r.text, junk


def test_title_is_metadata_unless_asked_for():
    r = extract_html(PAGE)
    assert r.title == "Flood in the lower town"  # the headline, cleaner than <title>
    assert "Flood in the lower town" not in r.text  # not repeated in the body
    r = extract_html(PAGE, include_title=True)
    assert lines(r)[0] == "Flood in the lower town"
    assert r.text.count("Flood in the lower town") == 1


def test_blocks_lines_inline_and_br():
    html = """<html><body><div class="content">
      <h2>Heading   here</h2>
      <p>One <b>bold</b> and <a href="/x">linked</a> and <em>emphasised</em>
         words, on several     source lines.</p>
      <ul><li>First item in the list of things</li><li>Second <span>item</span></li></ul>
      <p>Line one<br>Line two<br/><br>Line three</p>
      <table><tr><td>cell a</td><td>cell b</td></tr></table>
      <p>A final paragraph, long enough, with commas, so that this box is the content, clearly.</p>
    </div></body></html>"""
    out = lines(extract_html(html))
    assert "Heading here" in out
    assert "One bold and linked and emphasised words, on several source lines." in out
    assert "First item in the list of things" in out and "Second item" in out
    assert out[out.index("Line one") + 1 : out.index("Line one") + 3] == ["Line two", "Line three"]
    assert all(line == line.strip() and "  " not in line for line in out)


def test_paragraphs_blank_lines_list_and_table_lines_newlines():
    html = """<html><body><div class="content">
      <h2>Heading here</h2>
      <p>A first paragraph, long enough, with commas, so that this box is the content, clearly.</p>
      <p>Line one<br>Line two</p>
      <ul><li>First item in the list of things</li><li>Second item<ul><li>Nested item here</li></ul></li></ul>
      <table><tr><td>cell a of the table</td><td>cell b of the table</td></tr><tr><td>row two</td></tr></table>
      <ul><li><p>Loose item one</p></li><li><p>Loose item two</p></li></ul>
      <p>A final paragraph, long enough, with commas, so that this box is the content, clearly.</p>
    </div></body></html>"""
    r = extract_html(html)
    assert r.text.split("\n\n") == [
        "Heading here",
        "A first paragraph, long enough, with commas, so that this box is the content, clearly.",
        "Line one\nLine two",
        "First item in the list of things\nSecond item\nNested item here",
        "cell a of the table\ncell b of the table\nrow two",
        "Loose item one",  # a list of paragraphs (Markdown's loose list) keeps them
        "Loose item two",
        "A final paragraph, long enough, with commas, so that this box is the content, clearly.",
    ]
    assert extract_html(html, include_title=False) == r  # deterministic
    titled = extract_html(html.replace("<body>", "<head><title>Page title</title></head><body>"), include_title=True)
    assert titled.text.startswith("Page title\n\nHeading here\n\n")


def test_hidden_elements_are_dropped():
    html = """<html><body><div class="post">
      <p>Visible paragraph one, with enough words, commas, and length to be the content.</p>
      <p style="display: none">HIDDEN_STYLE text that no reader sees on the rendered page.</p>
      <p hidden>HIDDEN_ATTR text that no reader sees on the rendered page either.</p>
      <span class="sr-only">SR_ONLY</span>
      <p>Visible paragraph two, with enough words, commas, and length to be the content.</p>
    </div></body></html>"""
    r = extract_html(html)
    assert "Visible paragraph two" in r.text
    assert "HIDDEN_STYLE" not in r.text and "HIDDEN_ATTR" not in r.text and "SR_ONLY" not in r.text


BODY = "".join(
    f"<p>Body paragraph {i}, long enough, with commas, words and more words, to be the content.</p>"
    for i in range(6)
)
LEAD = "The lead paragraph says in two sentences what the article is about. It sits in a box of its own."


def test_the_lead_between_the_headline_and_the_body_is_kept():
    # No <article>: the lead sits in a teaser box between the <h1> and the body's wrapper.
    html = f"""<html><head><title>The headline - Site</title></head><body>
      <div class="top"><h1>The headline</h1><div class="intro"><p>{LEAD}</p></div>
      <p class="byline">By A. Writer</p></div>
      <div class="main-col"><div class="story">{BODY}</div></div></body></html>"""
    r = extract_html(html)
    assert r.title == "The headline"  # the headline before the content is the title
    out = lines(r)
    assert out[0] == LEAD and "By A. Writer" not in r.text and "The headline" not in r.text


def test_a_short_paragraph_that_is_mostly_a_link_is_a_cross_reference():
    html = f"""<html><body><div class="story">{BODY}
      <p>Read more: <a href="/other">Another story about something else entirely</a></p>
      <p><a href="/x">A sentence whose words are a link, which ends as sentences do.</a></p>
      <ul><li><a href="/a">A list item that is a link stays with its list</a></li>
      <li>and a second item of the same list, long enough</li></ul>
    </div></body></html>"""
    text = extract_html(html).text
    assert "Read more" not in text
    assert "A sentence whose words are a link" in text
    assert "A list item that is a link" in text


def test_noscript_is_the_fallback_of_a_page_without_text():
    body = BODY.replace("Body paragraph", "Script-written paragraph")
    html = f"""<html><body><div id="post"><script>document.write("...")</script>
      <noscript>{body}</noscript></div></body></html>"""
    assert "Script-written paragraph 3" in extract_html(html).text
    html = "<html><body><noscript>Please enable JavaScript to view this page.</noscript></body></html>"
    assert extract_html(html).reason == "no_text"  # too little to be believed
    html = (
        f"<html><body><div>{BODY}</div><noscript>NOSCRIPT_TEXT, long enough? {BODY}</noscript></body></html>"
    )
    assert "NOSCRIPT_TEXT" not in extract_html(html).text  # only where the page has no text
    assert "Script-written paragraph 3" in extract_html(f"<html><body><NOSCRIPT class=x>{body}</NoScript ></body></html>").text
    from tokenmill.transforms.extract.core import _noscript_contents

    got = _noscript_contents("<NoScript>a</noscript><noscripts>b<noscript\n>c</noscript><noscript>d")
    assert got == ["a", "c"]  # <noscripts> is no <noscript>; the last one never closes
    # The fallback's page gets the same headline step as any: the <h1> that repeats the title.
    html = f"<html><head><title>My Post - Blog</title></head><body><noscript><h1>My Post</h1>{body}</noscript></body></html>"
    got = extract_html(html)
    assert got.title == "My Post" and got.text.startswith("Script-written paragraph 0")


@pytest.mark.parametrize("tags", ["<noscript>" * 100_000, "<noscript></noscript>" * 50_000,
                                  "<noscript>" + "</noscript>" * 100_000])
def test_the_noscript_fallback_reads_a_page_once(tags):
    """A page without text whose <noscript> tags never close (or are many) is read in one pass:
    a lazy pattern scanned to the end again from each one (16,000 of them: 24 s)."""
    t0 = time.process_time()
    assert extract_html(f"<html><body>{tags}</body></html>").reason == "no_text"
    assert time.process_time() - t0 < 3


def test_soft_hyphens_and_ruby_annotations_leave_the_text():
    html = (
        "<html><body><div><p>Ein Wort mit wei\u00adchen Trenn\u00adstrichen in einem langen Satz, "
        "der lang genug ist.</p><p><ruby>子<rp>(</rp><rt>こ</rt><rp>)</rp></ruby>どもへの"
        "虐待をなくすための法律ができて、親が子どもを教育するために、たたいてはいけないことになりました。</p></div></body></html>"
    )
    text = extract_html(html).text
    assert "weichen Trennstrichen" in text and "\u00ad" not in text
    assert "子どもへの虐待" in text and "こ" not in text.split("子")[1][:1]
    text = extract_html(html.replace("<ruby>子", "<ruby><rb>子</rb>")).text  # the base text's own tag
    assert "子どもへの虐待" in text


def test_a_header_that_is_the_content_is_not_read_as_its_lead():
    """A site may call its body a <header>: chosen as the content, its short paragraphs stay
    (the lead's rule keeps only long ones, for a <header> inside the content)."""
    paras = "".join(f"<p>Short para {i}, with commas, and words.</p>" for i in range(12))
    text = extract_html(f'<html><body><div class="nav">x</div><header class="entry">{paras}</header>'
                        "<footer>f</footer></body></html>").text
    assert text is not None and all(f"Short para {i}," in text for i in range(12))


def test_a_link_paragraph_that_ends_with_a_full_stop_stays():
    """The cross-reference rule drops a short link paragraph that is not a sentence (a headline
    ends without a full stop, or with "?" or "!"); one ending in a full stop of any script, a
    closing quote after it, stays."""
    kept = ("这是一个很重要的问题，大家都在讨论它的答案，我们也应该认真地想一想这个问题的答案到底是什么。",
            'He said it was the best thing they could ever do, and then he left."')
    dropped = ("Read more: The headline of another story", "Is this the question everyone asks about it?")
    for last in kept + dropped:
        html = f"<html><body><div>{BODY}<p><a href='/x'>{last}</a></p>{BODY}</div></body></html>"
        assert (last in extract_html(html).text) == (last in kept), last


@pytest.mark.parametrize("n", [64_000])
def test_many_headings_before_the_content_are_looked_through_once(n):
    """The lead's headline is the last usable <h2> before the content where there is no <h1>:
    excluded ones (in a sidebar) are skipped in one backward pass, not one pass each."""
    html = (f'<html><body><div class="sidebar">{"<h2>x</h2>" * n}</div><div class="story">{BODY}</div>'
            "</body></html>")
    t0 = time.process_time()
    assert "Body paragraph 5" in extract_html(html, timeout_s=30).text
    assert time.process_time() - t0 < 3


# --------------------------------------------------------------------------- encodings

FRENCH = "Le café crème était très «bon», naïve façade; déjà vu à la fenêtre — où est l’œuvre?"
JAPANESE = "日本語のテキストです。これはテストのページです。東京は日本の首都です。"


def _page(text: str, head: str = "") -> str:
    return f"<html><head>{head}<title>t</title></head><body><p>{text}</p></body></html>"


@pytest.mark.parametrize("head", ['<meta charset="windows-1252">', ""])
def test_windows_1252(head):
    r = extract_html(_page(FRENCH, head).encode("cp1252"))
    assert r.reason is None
    assert r.text == FRENCH
    assert r.encoding == "cp1252"


@pytest.mark.parametrize(
    "head",
    [
        '<meta http-equiv="Content-Type" content="text/html; charset=Shift_JIS">',
        '<meta charset="shift_jis">',
        "",
    ],
)
def test_shift_jis(head):
    r = extract_html(_page(JAPANESE, head).encode("shift_jis"))
    assert r.text == JAPANESE
    assert r.encoding == "cp932"  # what browsers use for the shift_jis label


def test_http_hint_and_a_wrong_hint():
    raw = _page(JAPANESE).encode("shift_jis")
    assert extract_html(raw, encoding_hint="Shift_JIS").text == JAPANESE
    # A server default of ISO-8859-1 is not believed over bytes that are clean Shift_JIS.
    assert extract_html(raw, encoding_hint="iso-8859-1").text == JAPANESE
    raw = _page(FRENCH).encode("cp1252")
    assert extract_html(raw, encoding_hint="iso-8859-1").text == FRENCH


def test_other_legacy_encodings_and_boms():
    russian = "Привет, как дела? Это тестовая страница на русском языке, не правда ли."
    chinese = "这是一个测试页面，我们在这里写中文，看看能不能正确识别编码。"
    assert extract_html(_page(russian).encode("koi8-r")).text == russian
    assert extract_html(_page(russian, '<meta charset="windows-1251">').encode("cp1251")).text == russian
    assert extract_html(_page(chinese, '<meta charset="gb2312">').encode("gbk")).text == chinese
    assert extract_html(_page(FRENCH).encode("utf-16")).text == FRENCH
    assert extract_html(b"\xef\xbb\xbf" + _page(FRENCH).encode("utf-8")).text == FRENCH


def test_utf8_wins_over_a_wrong_declaration():
    raw = _page(FRENCH, '<meta charset="iso-8859-1">').encode("utf-8")
    r = extract_html(raw, encoding_hint="windows-1252")
    assert r.text == FRENCH and r.encoding == "utf-8"


def test_decode_html_fast_path():
    text, enc = decode_html(b"<p>plain ascii</p>")
    assert (text, enc) == ("<p>plain ascii</p>", "utf-8")


def test_compiled_utf8_test_answers_as_the_decoder():
    """accelerated.is_utf8 (decode.py's lazy path) against bytes.decode, on every lead byte
    before every second byte, and on random mixes of valid characters and broken bytes."""
    compiled = pytest.importorskip("tokenmill.transforms.extract.accelerated", reason="compiled walk not built")
    import random

    def decodes(b: bytes) -> bool:
        try:
            b.decode("utf-8")
            return True
        except UnicodeDecodeError:
            return False

    cases = [bytes([a, b]) + tail for a in range(256) for b in (0x41, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0)
             for tail in (b"", b"\x80", b"\x80\x80")]
    rng = random.Random(3)
    chars = ["a", "\u00e9", "\u07ff", "\u0800", "\ud7ff", "\ue000", "\uffff", "\U00010000", "\U0010ffff", "<p> "]
    for _ in range(20_000):
        b = bytearray("".join(rng.choice(chars) for _ in range(rng.randint(0, 12))).encode())
        for _ in range(rng.randint(0, 2)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        cases.append(bytes(b[: rng.randint(0, len(b))] if rng.random() < 0.3 else b))
    for b in cases:
        assert compiled.is_utf8(b) == decodes(b), b
        assert compiled.is_utf8(b"x" * 13 + b) == decodes(b), b  # past the eight-byte steps
    assert sum(map(decodes, cases)) > len(cases) // 4


def test_pages_read_from_their_bytes_as_from_their_text():
    """The lazy path (no str of a UTF-8 page) finds what the str input finds, NULs and pages of
    spaces included."""
    for page in (_page(FRENCH), _page(FRENCH).replace("Le", "L\x00e"), "\u3000" * 50, "  \n", "",
                 "<noscript>" + _page(FRENCH * 3) + "</noscript>"):
        a, b = extract_html(page.encode("utf-8")), extract_html(page)
        assert (a.text, a.reason, a.title) == (b.text, b.reason, b.title), page


def test_bytes_and_str_agree_on_the_flat_fallback_past_the_attribute_cap():
    """A page the lxml path takes and libxml2 gives up on (3,000 nested <div>) is rebuilt by the
    flat fallback from the page's own text, attributes past the cap included: from bytes as
    from str, the hidden box stays out (review of the lazy decoding)."""
    prose = "This is a long sentence of prose that keeps going, with commas, and more words. " * 8
    attrs = " ".join(f"a{i}=1" for i in range(1000))
    deep = "<div>" * 3000 + "<p>" + prose + "</p>" + "</div>" * 3000
    for extra in ("hidden", 'class="sidebar comments"', 'style="display:none"'):
        page = f"<html><body><div {attrs} {extra}><p>SECRET {prose}</p></div>{deep}</body></html>"
        a, b = extract_html(page.encode()), extract_html(page)
        assert (a.text, a.reason) == (b.text, b.reason), extra
        assert a.text and "SECRET" not in a.text, extra


def test_a_compiled_module_without_the_utf8_test_still_reads_bytes(monkeypatch):
    """A build of the compiled module from before is_utf8 (a checkout pulled, not rebuilt) loads
    for its walk; pages given as bytes are then decoded in Python, not refused."""
    from tokenmill.transforms.extract import decode, walk

    class Stale:
        pass

    monkeypatch.setattr(walk, "ACCELERATED", Stale())
    decode._utf8_test.cache_clear()
    try:
        r = extract_html(_page(FRENCH).encode("utf-8"))
        assert (r.text, r.reason, r.encoding) == (FRENCH, None, "utf-8")
    finally:
        decode._utf8_test.cache_clear()


def test_str_input_with_xml_declaration():
    r = extract_html('<?xml version="1.0" encoding="iso-8859-1"?>' + _page(FRENCH))
    assert r.text == FRENCH and r.encoding is None


# --------------------------------------------------------------------------- robustness


@pytest.mark.parametrize(
    "raw",
    [
        b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 20,
        b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n" + bytes(range(256)) * 20,
        b"PK\x03\x04\x14\x00\x00\x00" + bytes(range(256)) * 20,
        bytes((i * 7919) % 256 for i in range(20000)),  # looks random
        b"<html>" + b"\x00\x01\x02\x03garbage" * 500,
    ],
)
def test_binary_content(raw):
    assert extract_html(raw).reason == "binary_content"


def test_too_large_is_refused_before_parsing():
    t0 = time.monotonic()
    r = extract_html(b"<p>" + b"x" * 2000 + b"</p>", max_bytes=1000)
    assert r == Extracted(None, "too_large")
    assert time.monotonic() - t0 < 0.1


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"   \n\t ",
        "<html><body></body></html>",
        b"<html><head><title>x</title><script>var a = 1;</script></head><body><!-- c --></body></html>",
    ],
)
def test_empty_pages(raw):
    r = extract_html(raw)
    assert r.text is None and r.reason == "no_text"


@pytest.mark.parametrize(
    "html",
    [
        "<html><body>"
        + "<div>" * 100_000
        + "deep text at the bottom"
        + "</div>" * 100_000
        + "</body></html>",
        "<html><body>" + "<span><b>" * 50_000 + "deep inline text" + "</body></html>",
        "<table><tr><td>" * 30_000 + "deep cell",
    ],
)
def test_deep_nesting_finishes_without_recursion(html):
    t0 = time.monotonic()
    r = extract_html(html.encode())
    assert time.monotonic() - t0 < 10
    assert r.reason in (None, "no_text")
    if r.text is not None:
        assert "deep" in r.text


def test_text_after_a_too_deep_region_is_kept():
    # libxml2 stops at depth 2048; the fallback parser must still see what follows.
    html = (
        "<html><body>"
        + "<font>" * 5000
        + "<p>Inside the deep part, a real paragraph, with commas, for readers.</p>"
        + "</font>" * 5000
        + "<p>After the deep part, another real paragraph, with commas, for readers.</p></body></html>"
    )
    r = extract_html(html)
    assert "Inside the deep part" in r.text and "After the deep part" in r.text


def test_timeout_is_cooperative():
    big = (
        "<html><body>"
        + "<div><p>Some paragraph text, with commas, and words.</p><a href='#'>link</a></div>" * 20_000
    )
    r = extract_html(big, timeout_s=0.001)
    assert r.text is None and r.reason == "timeout"


@pytest.mark.parametrize("raw", [12345, object(), ["<p>x</p>"]])
def test_never_raises(raw):
    assert extract_html(raw).reason == "parse_error"


def test_control_characters_and_nul_in_real_html():
    r = extract_html(
        b"<html><body><p>Text with a NUL\x00 inside, and a form feed\x0c too, still text.</p></body></html>"
    )
    assert r.reason is None and "\x00" not in r.text and "NUL inside" in r.text


# --------------------------------------------------------------------------- real pages


def _shared_data() -> Path:
    env = os.environ.get("TOKENMILL_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def _token_f1(pred: str | None, gold: str) -> float:
    p = Counter(re.findall(r"\w+", (pred or "").lower()))
    g = Counter(re.findall(r"\w+", gold.lower()))
    tp = sum((p & g).values())
    if not tp:
        return 0.0
    precision, recall = tp / sum(p.values()), tp / sum(g.values())
    return 2 * precision * recall / (precision + recall)


def test_scrapinghub_pages_mean_f1():
    base = _shared_data() / "html_extraction" / "scrapinghub_aeb"
    if not (base / "ground-truth.json").exists():
        pytest.skip(f"shared data not found at {base}")
    truth = json.loads((base / "ground-truth.json").read_text(encoding="utf-8"))
    scores = []
    for item_id in sorted(truth)[:10]:
        raw = gzip.decompress((base / "html" / f"{item_id}.html.gz").read_bytes())
        scores.append(_token_f1(extract_html(raw).text, truth[item_id]["articleBody"]))
    assert sum(scores) / len(scores) >= 0.9, scores


@pytest.mark.parametrize("attr", ["a{i}", 'a{i}=">"', "a{i}='x'b{i}", "=a{i}", "a{i}/"])
def test_a_tag_with_a_huge_number_of_attributes_is_bounded(attr):
    # libxml2's parse time grows with the square of a tag's attribute count (40k: ~11 s) in C,
    # where the extraction deadline cannot reach: the attributes are capped before parsing.
    tag = "<div " + " ".join(attr.format(i=i) for i in range(200_000)) + ">"
    page = f"<html><body>{tag}<p>{'The river rose over the old stone bridge at dawn. ' * 20}</p></div></body></html>"
    start = time.monotonic()
    r = extract_html(page.encode(), max_bytes=10_000_000)
    assert time.monotonic() - start < 3
    assert r.reason is None and "stone bridge" in r.text


def test_attribute_cap_leaves_ordinary_pages_byte_identical():
    from tokenmill.transforms.extract.tree import _cap_attributes

    page = PAGE.encode() + b'<a href="x" title="a > b" data-x=\'<y z>\'>link</a><script>if (a<b) c = "d"</script>'
    assert _cap_attributes(page) is page
    long = b"<div " + b" ".join(b"a%d" % i for i in range(1500)) + b' class="kept">text</div>'
    capped = _cap_attributes(long)
    assert capped.count(b" a") == 1000 and capped.endswith(b">text</div>") and b'class="kept"' not in capped


# ------------------------------------------------------------------ the compiled walk (#36)

def _compiler() -> bool:
    import shutil
    import sysconfig

    return bool(shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]))


def _pages():
    """(name, text) of every shared page and of hand-made pages with every case the walk tells
    apart."""
    pages = []
    root = _shared_data() / "html_extraction"
    for p in sorted(root.rglob("*.html.gz")) if root.exists() else []:
        if p.name != "expected.html.gz":
            pages.append((str(p.relative_to(root)), decode_html(gzip.decompress(p.read_bytes()))[0]))
    hand = [
        "<p>a <a href=x>link <b>bold</b> tail</a> after<br>line two<br/><br>three</p><pre>x\n  y\n</pre>",
        "<div hidden>gone</div><div aria-hidden=true>gone</div><div aria-hidden=false>kept</div>"
        "<div style='display: none'>gone</div><p class='sr-only x'>gone</p><span class=share-count>9</span>tail",
        "<nav class=menu><ul><li>Home<li>About</ul></nav><article class=comment><p>one, two</p></article>"
        "<main><div role=navigation>nav text</div><div itemprop=articleBody><p>body, text</p></div></main>",
        "<h2 id=nav-heading class=title>Head</h2><div id=sidebar class=content>x</div><footer>f</footer>",
        "<table><tr><td>a<td>b<tr><td>c</table><ul><li>one<ul><li>nested</ul></ul><dl><dt>t<dd>d</dl>",
        "<p class=''>empty class</p><p id=''>empty id</p><p class='a  b\tc'>spaces</p>tail text",
        "<font>" * 3000 + "<p>deep, flat tree</p>" + "</font>" * 3000 + "<p>after</p>",
        "<p>caf\u00e9 \u65e5\u672c <b>\U0001f600</b>&amp; &lt;x&gt;</p>",
        # every kind of whitespace str.split() knows, prose commas of four scripts, empty lines
        "<p>a\u00a0b\u3000c\u2028d\u0085e\x1cf\u2009g\u205fh,\n i\uff0cj\u3001k\u060c l" + "x" * 30 + "</p>"
        "<p><br> <br>one, two<br>\u00a0\u00a0<br>" + "y, " * 40 + "<br></p><pre>a  b\n\n c, d\n</pre>"
        "<div>,<br>,, ,\u060c\uff0c</div><a href=x>link\u00a0text, in <b>bold</b></a>",
    ]
    pages += [(f"hand-made {i}", f"<html><body>{h}</body></html>") for i, h in enumerate(hand)]
    return pages


def _trees():
    """(name, the body the walk starts at) of every page of _pages() and of hand-made trees."""
    from lxml import etree

    from tokenmill.transforms.extract.tree import body, parse

    pages = _pages()
    for name, text in pages:
        tree = parse(text, time.monotonic() + 60)
        if tree is not None:
            yield name, body(tree)
    # elements with a namespace (lxml's "{ns}tag") and a CDATA text node
    top = etree.Element("body")
    etree.SubElement(top, "{urn:x}box").text = "namespaced"
    p = etree.SubElement(top, "p")
    p.text = etree.CDATA("one, in CDATA")
    etree.SubElement(p, "b").tail = "and a tail"
    # comments and PIs (the parser drops them; neither walk visits them) and junk inside a link
    p.append(etree.Comment("a comment"))
    p[-1].tail = " after the comment"
    p.append(etree.ProcessingInstruction("pi", "x"))
    p[-1].tail = " after the PI"
    a = etree.SubElement(p, "a")
    a.text = "link "
    etree.SubElement(a, "img").tail = "tail of an image in a link"
    yield "built", top


def test_the_compiled_walk_is_built_and_in_use():
    from tokenmill.transforms.extract import walk

    if os.environ.get("TOKENMILL_PURE_PYTHON") or not _compiler():
        pytest.skip("pure Python chosen, or no C compiler to build the compiled walk")
    from tokenmill.transforms.extract import accelerated

    assert walk.walk is accelerated.walk


def test_a_compiled_module_built_against_another_version_is_not_used(monkeypatch):
    """The compiled modules read their library's node structs, whose layout is compiled in: one
    built against another lxml or selectolax than the running one is left for the Python path."""
    from tokenmill.transforms.extract import tree, walk

    loaded = walk.load_compiled("accelerated", "LXML_VERSION", lambda: walk.etree.LXML_VERSION)
    if loaded is None:
        pytest.skip("compiled walk not built")
    assert walk.load_compiled("accelerated", "LXML_VERSION", lambda: (4, 0, 0, 0)) is None
    if tree.lexbor_walk() is not tree.lexbor_py:
        assert walk.load_compiled("lexbor_walk", "SELECTOLAX_VERSION", lambda: "0.0.1") is None
    monkeypatch.setenv("TOKENMILL_PURE_PYTHON", "1")
    assert walk.accelerated() is None and tree.lexbor_walk() is tree.lexbor_py  # the twin, not lxml


def test_compiled_walk_gives_the_python_walks_pages():
    compiled = pytest.importorskip("tokenmill.transforms.extract.accelerated", reason="compiled walk not built")
    from tokenmill.transforms.extract.walk import Page, py_walk

    n = 0
    for name, top in _trees():
        a, b = py_walk(top, time.monotonic() + 60), compiled.walk(top, time.monotonic() + 60)
        assert [getattr(a, s) for s in Page.__slots__] == [getattr(b, s) for s in Page.__slots__], name
        n += 1
    assert n >= 9  # the hand-made trees, and every shared page where ../shared/data is


def test_compiled_walk_keeps_the_deadline():
    compiled = pytest.importorskip("tokenmill.transforms.extract.accelerated", reason="compiled walk not built")
    from lxml import etree

    from tokenmill.transforms.deadline import Timeout

    top = etree.fromstring("<body>" + "<div><p>x</p></div>" * 1000 + "</body>")
    with pytest.raises(Timeout):
        compiled.walk(top, time.monotonic() - 1)


@pytest.mark.parametrize("cap", [1, 2, 3, 5])
def test_compiled_sweep_answers_as_the_pattern(cap):
    compiled = pytest.importorskip("tokenmill.transforms.extract.accelerated", reason="compiled walk not built")
    import random

    from tokenmill.transforms.extract.tree import sweep

    pattern = sweep(cap)
    rng = random.Random(cap)
    pieces = [b"<", b"<a", b"<div", b" ", b"\t", b"/", b">", b"=", b'"', b"'", b"x", b"id", b"A", b"\n", b"<1"]
    for _ in range(20_000):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 24)))
        assert compiled.over_cap(data, cap) == (pattern.match(data).group(1) is not None), data
    page = ("<div " + " ".join(f'a{i}="v>"' if i % 2 else f"b{i}=w" for i in range(cap)) + "><p>x").encode()
    assert compiled.over_cap(page, cap) and not compiled.over_cap(page, cap + 1)


# ------------------------------------------------------------------ lexbor's tree (#36)

_WALKED_ATTRIBUTES = ("class", "id", "hidden", "aria-hidden", "style", "role", "itemprop")


def _lxml_copy(node):
    """An lxml tree of a selectolax node's subtree (the attributes the walk reads, the text as
    .text/.tail), for walk.py's reference walk; ValueError where a name is not one lxml takes."""
    from lxml import etree

    def element(parent, n):
        attrs = {k: v or "" for k, v in n.attributes.items() if k in _WALKED_ATTRIBUTES}
        return etree.Element(n.tag, attrs) if parent is None else etree.SubElement(parent, n.tag, attrs)

    top = element(None, node)
    stack = [(node, top)]
    while stack:
        src, dst = stack.pop()
        last = None
        for c in src.iter(include_text=True):
            if c.tag == "-text":
                if last is None:
                    dst.text = (dst.text or "") + c.text_content
                else:
                    last.tail = (last.tail or "") + c.text_content
            elif c.tag and not c.tag.startswith("-"):  # (comments, processing instructions)
                last = element(dst, c)
                stack.append((c, last))
    return top


def _lexbor():
    from tokenmill.transforms.extract import tree

    if tree._LEXBOR is tree.lexbor_py:
        pytest.skip("lexbor walk not built")
    return tree


def test_the_lexbor_walk_is_built_and_in_use():
    from tokenmill.transforms.extract import tree

    if os.environ.get("TOKENMILL_PURE_PYTHON") or not _compiler():
        pytest.skip("pure Python chosen, or no C compiler to build the compiled walk")
    assert tree._LEXBOR is not tree.lexbor_py, "setup.py did not build lexbor_walk (see its message)"


def test_lexbor_walk_gives_the_python_walks_pages():
    """The compiled walk over lexbor's nodes makes walk.py's steps: the same Page as py_walk over
    an lxml copy of the same tree, and the same title."""
    tree = _lexbor()
    from selectolax.lexbor import LexborHTMLParser

    from tokenmill.transforms.extract.walk import Page, py_walk

    n = skipped = 0
    for name, text in _pages():
        parsed = LexborHTMLParser(tree._utf8(text))
        title, pg = tree._LEXBOR.walk(parsed, time.monotonic() + 60)
        try:
            ref = py_walk(_lxml_copy(parsed.body), time.monotonic() + 60)
        except ValueError:  # a tag name ("o:p") or a control character lxml refuses
            skipped += 1
            continue
        assert [getattr(pg, s) for s in Page.__slots__] == [getattr(ref, s) for s in Page.__slots__], name
        el = parsed.css_first("head > title")
        assert title == ((" ".join(el.text().split()) or None) if el is not None else None), name
        n += 1
    assert n >= 8 and skipped <= 1 + n // 10, (n, skipped)


def _random_pages(n: int, seed: int = 7):
    """Random pages of the walk's vocabulary: nested and misnested tags (blocks, inline,
    formatting, tables, lists, junk, headings, <pre>, <br>, links, SVG), the attributes it reads
    (hidden, classes and ids of both hint kinds, styles, roles, itemprop; bare, empty,
    duplicated), text with entities, CJK, emoji and whitespace, comments and CDATA."""
    import random

    rng = random.Random(seed)
    tags = ("div p span a b i em strong font li ul ol table tr td th h1 h2 h3 pre code br hr img script style "
            "noscript nav footer header article main section aside form button select option svg title "
            "dl dt dd blockquote figure figcaption sup sub ruby rt iframe template o:p").split()
    attrs = ["hidden", "aria-hidden=true", "aria-hidden=false", "style='display:none'", "style='color:red'",
             "class=content", "class='share-count x'", "class=sidebar", "class='article-body'", "class=sr-only",
             "class", "class=''", "id=nav", "id=main", "id=comments", "role=navigation", "role=main",
             "itemprop=articleBody", "href=x", "class=a class=b", "id=x id=y"]
    texts = ["Hello, world.", " ", "\n", "  spaced   text  ", "&amp; &lt;x&gt; &nbsp;", "\u65e5\u672c\u8a9e\u3001\u6587",
             "caf\u00e9", "\U0001f600", "a, b, c, d, e, f", "x" * 40, "<!-- c -->", "<![CDATA[d]]>", "\t\t"]
    pages = []
    for k in range(n):
        out, open_ = [], []
        for _ in range(rng.randint(1, 120)):
            r = rng.random()
            if r < 0.35:
                tag = rng.choice(tags)
                out.append(f"<{tag}{''.join(' ' + rng.choice(attrs) for _ in range(rng.randint(0, 3)))}>")
                open_.append(tag)
            elif r < 0.55 and open_:
                out.append(f"</{open_.pop() if rng.random() < 0.8 else rng.choice(tags)}>")
            else:
                out.append(rng.choice(texts))
        head = f"<head><title>{rng.choice(texts)}</title></head>" if rng.random() < 0.7 else ""
        pages.append((f"random {k}", f"<html>{head}<body>{''.join(out)}</body></html>"))
    return pages


def test_the_python_lexbor_walk_gives_the_compiled_walks_bytes():
    """One extractor whatever the build: the lexbor path's Python twin (lexbor_py, used where the
    compiled walk could not be built) gives the compiled walk's title and Page, and so the same
    text, on every shared page, the hand-made ones and 1,500 random ones; its most_open the
    compiled one's counts."""
    tree = _lexbor()
    from tokenmill.transforms.extract import extract_html, lexbor_py
    from tokenmill.transforms.extract.walk import Page

    pages = _pages() + _random_pages(1500)
    for name, text in pages:
        data = tree._utf8(text)
        assert lexbor_py.most_open(data) == tree._LEXBOR.most_open(data), name
        title, pg = tree._LEXBOR.parse_and_walk(data, time.monotonic() + 60)
        title_py, pg_py = lexbor_py.parse_and_walk(data, time.monotonic() + 60)
        assert title_py == title, name
        assert [getattr(pg_py, s) for s in Page.__slots__] == [getattr(pg, s) for s in Page.__slots__], name
    for name, text in pages[::7]:  # and the text the whole extractor gives
        fast = extract_html(text)
        try:
            compiled, tree._LEXBOR = tree._LEXBOR, lexbor_py
            slow = extract_html(text)
        finally:
            tree._LEXBOR = compiled
        assert (slow.text, slow.title) == (fast.text, fast.title), name


@pytest.mark.parametrize("seed", range(3))
def test_the_python_most_open_counts_as_the_compiled_one(seed):
    tree = _lexbor()
    import random

    from tokenmill.transforms.extract import lexbor_py

    rng = random.Random(seed)
    pieces = [b"<", b"</", b"<b", b"<B", b"<p", b"<div", b"</div", b"<option", b"<i", b"<select", b"</b", b" ",
              b"/", b">", b"x", b"\t", b"<1", b"<abcdefghi", b"</p", b"<font", b"\xc3\xa9", b"<br"]
    for _ in range(5000):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        assert lexbor_py.most_open(data) == tree._LEXBOR.most_open(data), data


def test_lexbor_and_lxml_give_the_same_text_on_nearly_every_page():
    """The two parsers build different trees only for malformed markup (HTML5's tree building
    against libxml2's): the extractor's text is the same on all but a few shared pages."""
    tree = _lexbor()
    from tokenmill.transforms.extract import extract_html

    pages = [(n, t) for n, t in _pages() if not n.startswith("hand-made")]
    if not pages:
        pytest.skip("shared data absent")
    differ = []
    for name, text in pages:
        fast = extract_html(text).text
        try:  # every page past lexbor's limits: the lxml path
            lexbor, tree._LEXBOR = tree._LEXBOR, SimpleNamespace(most_open=lambda data: (1 << 62,) * 4)
            slow = extract_html(text).text
        finally:
            tree._LEXBOR = lexbor
        if fast != slow:
            differ.append(name)
    assert len(differ) <= len(pages) // 50, differ


@pytest.mark.parametrize(
    "body, past",
    [
        ("<div>" * 40_000, 0),  # elements open
        ("".join(f"<b id={i}>" for i in range(20_000)), 1),  # formatting elements open
        ("<select>" + "<option>x</option>" * 40_000, 2),  # options
        ("".join(f"<p><i class=c{i}>" for i in range(100)) + "<p>x" * 10_000, 3),  # re-opened
    ],
)
def test_pages_lexbor_parses_in_quadratic_time_take_the_lxml_path(body, past):
    tree = _lexbor()
    data = tree._utf8("<html><body>" + body)
    counts = tree._LEXBOR.most_open(data)
    assert [c > limit for c, limit in zip(counts, tree._LEXBOR_LIMITS)] == [i == past for i in range(4)]
    t0 = time.process_time()
    extract_html(data)
    assert time.process_time() - t0 < 5


def test_most_open_counts():
    tree = _lexbor()
    most_open = tree._LEXBOR.most_open
    assert most_open(b"") == (0, 0, 0, 0)
    assert most_open(b"<div><DIV class=x></div><p><p><br><img></div><div>") == (2, 0, 0, 0)
    assert most_open(b"<div><p></p></div>" * 3) == (1, 0, 0, 0)  # an end tag closes its own kind only
    assert most_open(b"<b><i>x</i><p><span>") == (1, 2, 0, 2)  # <p> and <span> re-open <b>
    assert most_open(b"<select><option>a<option>b</select>") == (3, 0, 2, 0)
    assert most_open(b"< div></ x><-a><a><a>") == (2, 0, 0, 0)


def test_the_class_table_stays_bounded():
    """The compiled walk remembers class attributes across pages: never more than its bounds
    (2 MB of values, 32,768 of them), and values over 1 KB not at all."""
    tree = _lexbor()
    import random

    rng = random.Random(5)
    most = 0
    for k in range(40):
        classes = ["c%d-%s" % (k, "x" * rng.randint(600, 1000)) for _ in range(200)]
        body = "".join(f'<div class="{c} {i}"><p>{"word " * 20}{i}</p></div>' for i, c in enumerate(classes))
        huge = f'<div class="{"h" * 5000}{k}"><p>{"word " * 20}</p></div>'  # read, not remembered
        text = extract_html(("<html><body>" + body + huge + "</body></html>").encode()).text
        assert text and text.startswith("word word"), (k, text[:80])
        values, size = tree._LEXBOR.class_table()
        assert values <= 32768 and size <= 2 * 1024 * 1024, (values, size)
        most = max(most, size)
    assert most > 1.5 * 1024 * 1024  # (the pages did fill it: 40 x 200 values of 600-1,000 bytes)


def test_compiled_hints_answer_as_hints_py():
    """page_walk.pxi's hints (both compiled walks use it) against hints.py's, on every class and
    id of the shared pages and on random names made of the vocabularies' pieces."""
    import random

    compiled = pytest.importorskip("tokenmill.transforms.extract.accelerated", reason="compiled walk not built")
    from tokenmill.transforms.extract.hints import VOCABULARIES, hints

    pairs = set()
    for _, text in _pages():
        for m in re.finditer(r"""<[a-zA-Z][^>]*?\b(class|id)\s*=\s*["']([^"']*)["']""", text):
            pairs.add((m.group(2), "") if m.group(1) == "class" else ("", m.group(2)))
    rng = random.Random(7)
    pieces = [p for _, w in VOCABULARIES for p in (*w.literals, *w.words)]
    pieces += ["-", "_", " ", "\t", "\x1c", "0", "42", "X", "\u00e9", "\u0130", "tag-", "topic-", "a" * 300]
    for _ in range(20_000):
        pairs.add(("".join(rng.choice(pieces) for _ in range(rng.randint(0, 6))),
                   "".join(rng.choice(pieces) for _ in range(rng.randint(0, 4)))))
    for cls, id_ in sorted(pairs):
        assert compiled.compiled_hints(cls, id_) == hints(cls, id_), (cls, id_)
    assert len(pairs) > 15_000 + 50_000 * bool(_shared_data().exists())
