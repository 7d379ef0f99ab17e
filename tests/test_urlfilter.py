"""URL block and allow lists: the pure core on its entry kinds, and a real prepare run on the
bundled WARC and JSONL records (their URLs), with the one-line errors."""

import json

import pytest
from conftest import run_prepare

from tokenmill.cli import main
from tokenmill.transforms.urlfilter import UrlList, blocked, read_list

SAMPLE = __import__("pathlib").Path(__file__).parent.parent / "tokenmill" / "sample"


def urls(*entries: str) -> UrlList:
    return UrlList([(e, "list.txt", i) for i, e in enumerate(entries, 1)])


def test_domains_prefixes_and_regexes():
    block = urls("example.com", "news.site.org/ads/", "re:casino|poker", "WWW.Upper.NET")
    assert block.match("https://example.com/x") and block.match("http://a.b.example.com")
    assert not block.match("https://notexample.com/") and not block.match("https://example.com.evil.io/")
    assert block.match("https://www.news.site.org/ads/1?x") and block.match("news.site.org/ads/")
    assert not block.match("https://news.site.org/adsense") and not block.match("https://other.site.org/ads/")
    assert block.match("https://fun.io/online-casino/") and block.match("https://upper.net:8080/p")
    assert len(block) == 4 and not block.match("https://fine.io/page")


def test_allow_entries_are_exceptions_and_no_url_is_never_blocked():
    block, allow = urls("example.com"), urls("blog.example.com", "example.com/public/")
    assert blocked("https://example.com/shop", block, allow)
    assert not blocked("https://blog.example.com/post", block, allow)
    assert not blocked("https://www.example.com/public/a", block, allow)
    assert not blocked(None, block, allow) and not blocked("", block, None)
    assert not blocked("http://[::1/x", block, None) and blocked("http://[::1/x", urls("re:::1"), None)  # malformed


def test_list_files_and_their_errors(tmp_path):
    f = tmp_path / "block.txt"
    f.write_text("# ad servers\nexample.com\n\n  re:^https://[^/]*\\.bad/  \n")
    lst = read_list([str(f)])
    assert lst.match("https://x.example.com") and lst.match("https://a.bad/") and not lst.match("http://a.bad/")
    f.write_text("ok.com\nre:(unclosed\n")
    with pytest.raises(Exception, match=r"block.txt:2: bad regex"):
        read_list([str(f)])


def test_prepare_drops_blocked_urls_from_warc_and_jsonl(tmp_path, capsys):
    block = tmp_path / "block.txt"
    block.write_text("harbourtimes.example\nmaison-energie.example/guide/\nre:example\\.org/blog/\n")
    allow = tmp_path / "allow.txt"
    allow.write_text("www.example.org/blog/backyard-hens\n")
    out = tmp_path / "out"
    rc, rows, report = run_prepare(out, [SAMPLE / "crawl.warc.gz", SAMPLE / "docs.jsonl"],
                                   [f"url.block_files=[{block}]", f"url.allow_files=[{allow}]"])
    assert rc == 0
    gone = {r["url"] for r in rows if r["dropped_by"] == "url:blocked"}
    assert gone and all("harbourtimes.example" in u or "maison-energie.example/guide/" in u
                        or "example.org/blog/" in u for u in gone)
    assert "https://www.example.org/blog/backyard-hens" not in gone  # allowed
    assert any("harbourtimes" in u for u in gone) and any(u.startswith("https://www.example.org/blog/") for u in gone)
    assert not any(r["dropped_by"] != "url:blocked" and r["url"] in gone for r in rows)
    funnel = {f["stage"]: f for f in report["funnel"]}
    assert funnel["url"]["dropped"] == len(gone) == report["dropped_by"]["url:blocked"]
    assert [f["stage"] for f in report["funnel"]][:3] == ["read", "url", "extract"]
    # A missing list is one line before anything runs.
    capsys.readouterr()
    assert main(["prepare", "--output", str(tmp_path / "o2"), "--input", str(SAMPLE / "docs.jsonl"),
                 "--set", f"url.block_files=[{tmp_path / 'nope.txt'}]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.txt: no such file" in err[0]
    assert json.loads((out / "report" / "report.json").read_text())["config"]["url"]["enabled"] is True
