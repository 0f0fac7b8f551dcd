"""dashboard.management.terminal: control characters are printed escaped; everything else
(non-ASCII text included) unchanged, and the JSON form decodes to the same value."""

from __future__ import annotations

import json

from dashboard.management.terminal import json_text, plain


def test_plain_escapes_every_control_character_and_nothing_else() -> None:
    assert plain("a\x1b[2Jb\x07\x7f\x9b\u202e\u2066") == ("a\\x1b[2Jb\\x07\\x7f\\x9b\\u202e\\u2066")
    assert plain("Zoë 漢字 — tab-free") == "Zoë 漢字 — tab-free"
    assert all(plain(chr(c)) != chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)])


def test_json_text_is_the_same_value_with_no_raw_control_character() -> None:
    value = {"name": "Eve\x1b]0;x\x07\x9b\u202e", "path": "é/\x7f"}
    text = json_text(value)
    assert json.loads(text) == value
    assert not any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in text)
    assert "\u202e" not in text and "é" in text
