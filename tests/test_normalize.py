from tokenmill.config import NormalizeConfig
from tokenmill.transforms.normalize import normalize_text


def test_repairs_mojibake_and_quotes():
    assert normalize_text("CafÃ© â€œniceâ€\x9d", NormalizeConfig()) == 'Café "nice"'
    assert normalize_text("it\u2019s \u201cfine\u201d", NormalizeConfig()) == "it's \"fine\""


def test_whitespace_collapsed_line_breaks_kept():
    text = "  a\u00a0\u00a0b\t c \r\nnext\u3000line\n\n\n\n\nlast\u200b word  "
    assert normalize_text(text, NormalizeConfig()) == "a b c\nnext line\n\nlast word"


def test_cjk_punctuation_untouched():
    assert normalize_text("東京は晴れ。（本当に）", NormalizeConfig()) == "東京は晴れ。（本当に）"


def test_destructive_steps_off_by_default_and_opt_in():
    text = "Él va a la Ópera"
    assert normalize_text(text, NormalizeConfig()) == text
    cfg = NormalizeConfig(lowercase=True, ascii_only=True, drop_short_words=True)
    assert normalize_text(text, cfg) == "pera"
    assert normalize_text("An ox is big", NormalizeConfig(drop_short_words=True)) == "big"


def test_curly_quotes_can_stay():
    assert normalize_text("\u201cq\u201d", NormalizeConfig(straight_quotes=False)) == "\u201cq\u201d"
