import pytest

from tokenmill.transforms.pii import iban_ok, luhn_ok, redact

ALL = ["email", "phone", "ip", "card", "iban", "secret"]


@pytest.mark.parametrize("text, expected, kind", [
    ("mail jane.doe@example.com now", "mail <EMAIL> now", "email"),
    ("call +1 555 0100 today", "call <PHONE> today", "phone"),
    ("ring (555) 010-0199.", "ring <PHONE>.", "phone"),
    ("or +44 20 7946 0958", "or <PHONE>", "phone"),
    ("server 192.0.2.10.", "server <IP>.", "ip"),
    ("over 2001:db8::1 on", "over <IP> on", "ip"),
    ("card 4111 1111 1111 1111 ok", "card <CARD> ok", "card"),
    ("iban DE89 3704 0044 0532 0130 00 thanks", "iban <IBAN> thanks", "iban"),
    ("key sk_live_4eC39HqLyjWDarjtT1zdp7dc end", "key <SECRET> end", "secret"),
    ("token ghp_abcdefghijklmnopqrstuvwxyz0123456789 x", "token <SECRET> x", "secret"),
    ("aws AKIAIOSFODNN7EXAMPLE", "aws <SECRET>", "secret"),
])
def test_redacts_each_kind(text, expected, kind):
    out, found = redact(text, ALL)
    assert out == expected and found == {kind: 1}


@pytest.mark.parametrize("text", [
    "Python 3.11.2 and 2.4.1 released on 2024-05-01.",
    "It costs $49.99, or 1,299.00 EUR, see page 12 of 300.",
    "Meeting 2024-07-03 at 10:30 in room 4.12, port 8443.",
    "Order number 1234567890123 shipped.",  # 13 digits, fails Luhn
    "Version 1.2.3.400 of the firmware",  # not a valid IPv4
    "ISBN 978-3-16-148410-0 and the year 1999.",
    "Call me at 12:30:45 tomorrow.",
    "The ratio was 3.14159 and the total 100000.",
])
def test_no_false_positives(text):
    out, found = redact(text, ALL)
    assert out == text and not found


def test_kinds_can_be_chosen():
    out, found = redact("jane@example.com 192.0.2.1", ["ip"])
    assert out == "jane@example.com <IP>" and found == {"ip": 1}


def test_checksums():
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")
    assert iban_ok("DE89 3704 0044 0532 0130 00") and not iban_ok("DE89 3704 0044 0532 0130 01")
