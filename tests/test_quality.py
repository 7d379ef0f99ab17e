"""Every quality rule on small hand-written texts, including non-English and CJK."""

import sys

import pyarrow as pa
import pytest

from tokenmill.config import QualityConfig
from tokenmill.transforms.quality import SIGNALS, QualityFn, fields, first_failure, measure, signals

CFG = QualityConfig()
PROSE = ("The river runs past the old mill and into the town. People have lived along its banks for "
         "a very long time, and they still fish there with their children on quiet mornings. ")


def verdict(text, lang="en", cfg=CFG):
    return first_failure(signals(text, lang, cfg), lang, cfg)


SENTENCES = [
    "The river runs past the old mill and into the town.",
    "People have lived along its banks for a very long time.",
    "On quiet mornings they still fish there with their children.",
    "In spring the water rises and covers the lower meadows.",
    "Farmers move their sheep to the hills before the flood arrives.",
    "The mill itself was rebuilt twice, once after a fire and once after a storm.",
    "Today it houses a small museum that explains how grain was ground.",
    "Visitors can watch the wheel turn and buy bread baked on site.",
    "A footpath follows the river to the next village, about six kilometres away.",
    "Along the way there are benches, a few old oaks and a ruined chapel.",
    "Local volunteers keep the path clear and repair the wooden bridges.",
    "Every summer the town holds a festival with music, boats and food stalls.",
    "Children race paper boats from the mill to the stone bridge.",
    "The winner gets a cake and has their name painted on a board in the square.",
]


def para(i):
    return " ".join(SENTENCES[(i * 3 + k) % len(SENTENCES)] for k in range(3))


GOOD = "\n\n".join(" ".join(SENTENCES[i:i + 2]) for i in range(0, len(SENTENCES), 2))


def test_good_english_prose_passes():
    assert verdict(GOOD) is None


@pytest.mark.parametrize("text, reason", [
    ("Too short to be a document at all.", "gopher_min_words"),
    ("\n".join(f"supercalifragilisticexpialidocious{i} extraordinarilyunbelievable{i}." for i in range(40)),
     "gopher_mean_word_len"),
    (GOOD + "\n" + " ".join("#tag" for _ in range(60)), "gopher_hash_ratio"),
    (GOOD + "\n" + " ".join("so..." for _ in range(60)), "gopher_ellipsis_ratio"),
    ("\n".join(f"• item number {i} of the and to of with list here." for i in range(60)), "gopher_bullet_lines"),
    ("\n".join(f"Line {i} the story goes on and on with the river and that..." for i in range(40)),
     "gopher_ellipsis_lines"),
    (" ".join(f"the {i * 7} river {i}" for i in range(60)) + ".", "gopher_alpha_words"),
    (" ".join(["Lorem dolor sit amet consectetur adipiscing elit sed do eiusmod tempor."] * 1)
     + " " + " ".join(f"word{i}x" for i in range(60)) + ".", "gopher_stop_words"),
])
def test_gopher_quality_rules(text, reason):
    assert verdict(text) == reason


def test_gopher_repetition_rules():
    repeated_lines = "\n".join([PROSE.strip()] * 10 + [GOOD])
    assert verdict(repeated_lines).startswith("gopher_dup_")
    spam = " ".join(["buy cheap shoes online"] * 40) + " " + PROSE
    assert verdict(spam) in ("gopher_top_2gram", "gopher_top_3gram", "gopher_top_4gram", "gopher_dup_5gram")
    s = signals(spam, "en", CFG)
    assert s["top_2gram_frac"] > 0.2 and s["dup_5gram_frac"] > 0.15


def test_c4_min_sentences():
    s = signals(GOOD, "en", CFG)
    assert s["c4_sentences"] == len(SENTENCES) and s["words_per_line"] > 10
    two = "\n".join(SENTENCES[:2]) + "\n" + "\n".join(SENTENCES[2:]).replace(".", ",")
    assert signals(two, "en", CFG)["c4_sentences"] == 2 and verdict(two) == "c4_min_sentences"
    assert CFG.c4_value("min_sentences") == 3 and CFG.c4_value("min_words_per_line") == 5  # C4's code
    assert QualityConfig(c4={"min_sentences": 2}).c4_value("min_sentences") == 2


def test_c4_rules():
    assert verdict(GOOD + "\n\nLorem ipsum dolor sit amet.") == "c4_lorem_ipsum"
    assert verdict(GOOD + "\n\nfunction f() { return 1; }") == "c4_curly_bracket"
    js = ("Please enable JavaScript in your browser to view this page. The site needs it for the map, "
          "the search and the comments, and without it nothing will load at all for you or for the others.\n") * 1
    js += " ".join(SENTENCES[:4])
    assert verdict(js) == "c4_javascript"


def test_fineweb_rules():
    no_punct = GOOD.replace(".", "")
    assert verdict(no_punct) == "c4_min_sentences"  # C4 runs first: no line ends a sentence
    no_c4 = QualityConfig(c4={"enabled": False})
    assert verdict(no_punct, cfg=no_c4) == "fineweb_terminal_punct"
    short = GOOD + "\n" + "\n".join(f"{w.strip('.,').capitalize()} now." for w in set(" ".join(SENTENCES).split()))
    assert verdict(short) == "fineweb_short_lines"
    one_dup = GOOD + "\n" + "\n".join(["Share this article with your friends and the family today."] * 2)
    assert verdict(one_dup) == "fineweb_dup_line_chars"
    many_lines = "\n".join(f"the {w}." for w in PROSE.split()) * 2
    s = signals(many_lines, "en", CFG)
    assert s["newline_word_ratio"] > 0.3


def test_cjk_is_not_one_word():
    ja = ("土鍋でご飯を炊くと、電気炊飯器とは違う香ばしさが出ます。まず米を研いで三十分ほど水に浸します。"
          "火加減は最初は中火で、沸騰したら弱火にして十五分ほど炊きます。最後に火を止めて十分蒸らします。\n") * 1
    ja += "おこげができたら成功です。家族みんなで食べると、いつもより美味しく感じられます。"
    s = signals(ja, "ja", CFG)
    assert s["n_words"] > 100
    assert verdict(ja, "ja") is None  # mean word length and stop words are skipped for ja
    zh = ("电饭煲的评测结果显示，这款产品煮饭均匀，米饭口感软硬适中。价格合理，操作简单，适合家庭使用。"
          "我们连续两周每天用它做早饭和晚饭，内胆没有粘锅，清洗也很方便。缺点是预约功能的按钮有点小。"
          "总的来说，我们会推荐给三口之家。")
    assert signals(zh, "zh", CFG)["n_words"] > 50 and verdict(zh, "zh") is None


def test_german_stop_words_and_russian_without_list():
    de = ("Der Fluss fließt an der alten Mühle vorbei und mündet in der Stadt. Die Menschen leben seit langer Zeit "
          "an seinen Ufern und angeln dort an ruhigen Morgen mit ihren Kindern.\n\nIm Frühling steigt das Wasser "
          "und überflutet die Wiesen. Die Bauern bringen ihre Schafe vorher auf die Hügel. Die Mühle wurde zweimal "
          "neu gebaut, einmal nach einem Brand und einmal nach einem Sturm. Heute ist darin ein kleines Museum, "
          "das erklärt, wie früher Getreide gemahlen wurde. Besucher sehen das Rad und kaufen Brot aus dem Ofen.")
    assert verdict(de, "de") is None and signals(de, "de", CFG)["stop_words"] >= 2
    ru = ("Река течёт мимо старой мельницы и впадает в озеро за городом. Люди живут на её берегах уже много "
          "веков и по утрам ловят рыбу вместе с детьми.\n\nВесной вода поднимается и заливает нижние луга. "
          "Крестьяне заранее уводят овец на холмы. Мельницу перестраивали дважды: после пожара и после бури. "
          "Сегодня в ней работает небольшой музей, где рассказывают, как раньше мололи зерно. Посетители "
          "смотрят на колесо и покупают свежий хлеб, испечённый прямо здесь.")
    assert verdict(ru, "ru") is None  # no Russian stop-word list: that rule does not apply


def test_thresholds_are_config_and_families_can_be_off():
    text = "Too short to be a document at all."
    cfg = QualityConfig(gopher={"min_words": 3}, fineweb={"enabled": False}, c4={"min_sentences": 1})
    assert verdict(text, cfg=cfg) is None
    assert QualityConfig(repetition={"enabled": False}).repetition.enabled is False


def test_entropy_signals():
    s = signals(GOOD, "en", CFG)
    assert 3.5 < s["char_entropy"] < 5.5 and s["word_entropy"] > 4
    assert signals("aaaa aaaa aaaa", "en", CFG)["char_entropy"] == 0.0


# ------------------------------------------------------------------ the definitions, fixed (#35)

def only(**sections):
    """A config where only the named families are on (each with the given settings)."""
    off = {f: {"enabled": False} for f in ("gopher", "repetition", "c4", "fineweb")}
    return QualityConfig(**{**off, **{k: {"enabled": True, **v} for k, v in sections.items()}})


def stage(text, cfg, lang="en"):
    (out,) = list(QualityFn(cfg).process({"id": "t", "text": text, "lang": lang}))
    return out


def stored_row(doc, cfg):
    """``doc``'s signal columns through the docs Parquet schema, as refilter reads them back."""
    schema = pa.schema(fields(cfg))
    table = pa.Table.from_pylist([{f.name: doc.get(f.name) for f in schema}], schema=schema)
    return table.to_pylist()[0]


def test_a_value_at_its_threshold_decides_the_same_live_and_stored():
    # 3 of 10 lines repeat against max 0.3; 3 of 25 lines end a sentence against min 0.12. Stored
    # as float32, 0.3 became 0.30000001 (> 0.3: dropped) and 0.12 became 0.11999999 (< 0.12).
    lines = [f"Line number {w} of the page" for w in "abcdefg"] + ["Line number a of the page"] * 3
    cfg = only(repetition={"dup_para_frac": 1, "dup_line_char_frac": 1, "dup_para_char_frac": 1,
                           "top_ngram_fracs": [1] * 3, "dup_ngram_fracs": [1] * 6})
    doc = stage("\n".join(lines), cfg)
    assert doc["dup_line_frac"] == 0.3 and not doc.get("dropped_by")
    assert QualityFn(cfg).redecide(stored_row(doc, cfg)).get("dropped_by") is None
    lines = [f"A line about item {i}." if i < 3 else f"A line about item {i}" for i in range(25)]
    cfg = only(fineweb={"max_short_lines": 1.0})
    doc = stage("\n".join(lines), cfg)
    assert doc["terminal_punct_line_ratio"] == 0.12 and not doc.get("dropped_by")
    assert QualityFn(cfg).redecide(stored_row(doc, cfg)).get("dropped_by") is None
    assert all(f.type in (pa.int32(), pa.float64()) for f in pa.schema(fields(cfg)) if f.name in SIGNALS)


def test_stop_words_are_distinct_words_of_the_list():
    cfg = only(gopher={"min_words": 1})
    the_only = " ".join(["the river bank"] * 30) + "."
    assert signals(the_only, "en", cfg)["stop_words"] == 1 and verdict(the_only, cfg=cfg) == "gopher_stop_words"
    assert verdict(the_only + " And so to bed.", cfg=cfg) is None


def test_hash_and_ellipsis_are_bounded_each():
    cfg = only(gopher={"min_words": 1})
    words = [f"word{i}" for i in range(100)]
    both = " ".join(words[:92]) + " #a #b #c #d #e #f #g #h and... so... on... we... go... on... and... on..."
    s = signals(both, "en", cfg)
    assert s["hash_word_ratio"] <= 0.1 and s["ellipsis_word_ratio"] <= 0.1  # their sum is 0.16
    assert verdict(both + " the to", cfg=cfg) is None


def test_c4_sentences_leave_out_ellipsis_lines_and_cjk_stops():
    cfg = only(c4={})
    text = "\n".join(["We walked along the river for an hour...", "Then we sat down on a bench by the water。",
                      "The ducks came over to look at us.", "Nobody had brought any bread for them!"])
    assert signals(text, "en", cfg)["c4_sentences"] == 2 and verdict(text, cfg=cfg) == "c4_min_sentences"


def test_c4_removes_lines_as_its_code_does():
    cfg = only(c4={"remove_lines": True})
    keep = SENTENCES[:4]
    text = "\n".join(["Home | News | Contact", keep[0], "Please enable JavaScript to see the comments below.",
                      keep[1], "This site uses cookies to improve your experience, we hope you like them.",
                      "Too short.", keep[2][:-1] + ".[12]", "x" * 1200 + " is a long word in a sentence.", keep[3]])
    s, cleaned = measure(text, "en", cfg)
    assert cleaned == "\n".join(keep) and s["c4_sentences"] == 4
    doc = stage(text, cfg)
    assert doc["text"] == cleaned and not doc.get("dropped_by")  # the javascript line went, not the page
    assert stage(text, only(c4={}))["text"] == text  # remove_lines off: lines stay
    assert stage(text, only(c4={"javascript_max_words": 1000}))["dropped_by"] == "quality:c4_javascript"
    # lorem ipsum and "{" drop the page when on a line C4 keeps, as its code checks them
    assert verdict(GOOD + "\nlorem ipsum", cfg=cfg) is None
    assert verdict(GOOD + "\nThe page says lorem ipsum dolor sit amet.", cfg=cfg) == "c4_lorem_ipsum"
    assert verdict(GOOD + "\nfunction f() { return 1; }", cfg=cfg) is None
    assert verdict(GOOD + "\nThe set {a, b, c} has three members here.", cfg=cfg) == "c4_curly_bracket"
    # FineWeb measures what C4 leaves (FineWeb's pipeline: C4, then FineWeb)
    both = only(c4={"remove_lines": True}, fineweb={})
    assert measure(text, "en", both)[0]["terminal_punct_line_ratio"] == 1.0
    # text written without spaces: C4's line rules do not apply
    zh = "总的来说，我们会推荐给三口之家。\n价格合理，操作简单。"
    assert measure(zh, "zh", cfg)[1] is None and verdict(zh, "zh", cfg) is None


def test_fineweb_terminal_marks_and_token_count_are_datatroves():
    cfg = only(fineweb={"max_short_lines": 1.0, "max_newline_word_ratio": 10})
    quoted = "\n".join([f'He said "line {i} is done."' for i in range(5)] + [f"And then line {i} went on\u2026" for i in range(5)])
    assert signals(quoted, "en", cfg)["terminal_punct_line_ratio"] == 0.0
    text = "One, two.\nThree, four.\nFive, six."  # 2 line breaks, 6 words, 6 punctuation tokens
    assert signals(text, "en", cfg)["newline_word_ratio"] == 2 / 12


def test_datatrove_compat_is_one_setting():
    cfg = QualityConfig(compat="datatrove")
    assert cfg.c4_value("min_sentences") == 5 and cfg.c4_value("min_words_per_line") == 3  # datatrove's
    s = signals(GOOD + "\n" + "The the the.", "de", cfg)
    assert s["stop_words"] >= 2  # Gopher's English list, for every language
    assert verdict(GOOD, cfg=cfg) is None


def test_compat_without_spacy_is_one_line(monkeypatch):
    from tokenmill.errors import UserError
    from tokenmill.transforms import quality_datatrove
    from tokenmill.transforms.quality import SPEC

    monkeypatch.setattr(quality_datatrove, "_NLP", None)
    monkeypatch.setitem(sys.modules, "spacy", None)  # import spacy raises ImportError
    with pytest.raises(UserError, match=r"compat=datatrove needs spaCy.*tokenmill\[compat\]"):
        SPEC.check(QualityConfig(compat="datatrove"), None)


def _gopher_ngram_fracs(words: list[str]) -> dict[str, float]:
    """Gopher's n-gram repetition signals by their definition, by brute force: the reference."""
    from collections import Counter

    total = sum(map(len, words)) or 1
    out = {}
    for n in range(2, 11):
        grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
        counts = Counter(grams)
        if n <= 4:
            top = max(counts.values(), default=0)
            first = next((g for g in grams if counts[g] == top), None)
            out[f"top_{n}gram_frac"] = sum(map(len, first)) * top / total if top > 1 else 0.0
        else:
            seen, covered, i = set(), 0, 0
            while i < len(grams):
                if counts[grams[i]] >= 2:
                    if grams[i] in seen:
                        covered += sum(map(len, grams[i]))
                        i += n
                        continue
                    seen.add(grams[i])
                i += 1
            out[f"dup_{n}gram_frac"] = covered / total
    return out


@pytest.mark.parametrize("numpy_from", [0, 10**9, 40])
def test_ngram_repetition_signals_are_gophers_definition(monkeypatch, numpy_from):
    """The ranked n-grams (only those whose first n-1 words repeat are ranked), with numpy and
    with a dict, give what the definition gives, on random texts from a small vocabulary (many
    repeats) and a large one."""
    import random

    from tokenmill.transforms import quality_signals

    monkeypatch.setattr(quality_signals, "NUMPY_WORDS", numpy_from)
    rng = random.Random(11)
    for vocab in ([*"abc"], [*"abcdefgh"], [f"w{i}" for i in range(300)]):
        for _ in range(300):
            words = [rng.choice(vocab) for _ in range(rng.randint(0, 80))]
            s = signals(" ".join(words), "en", QualityConfig())
            want = _gopher_ngram_fracs(words)
            assert {k: s[k] for k in want} == want, words
