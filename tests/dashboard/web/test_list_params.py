"""dashboard.web.list_params: the list pages' integer parameters and pager-link prefixes
(the pages using them are covered in tests/dashboard/web/test_pages.py)."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest

from dashboard.web.list_params import positive_int, query_prefix


@pytest.mark.parametrize("raw", ["1", "42", str(2**62 - 1)])
def test_it_reads_a_positive_integer(raw: str) -> None:
    assert positive_int(raw, None) == int(raw)


# "²" and "٣" are digits to str.isdigit(); int() refuses the first (it was a 500 page).
@pytest.mark.parametrize("raw", [None, "", "0", "-3", "1.5", "x1", " 7", str(2**62), "²", "٣"])
def test_it_falls_back_to_the_default_for_a_hand_edited_value(raw: str | None) -> None:
    assert positive_int(raw, 1) == 1
    assert positive_int(raw, None) is None


def test_it_prefixes_only_the_filters_that_are_set() -> None:
    prefix = query_prefix({"q": "a b&c=d", "state": "", "kind": "sync"})
    assert prefix.endswith("&")
    assert parse_qsl(prefix[:-1]) == [("q", "a b&c=d"), ("kind", "sync")]


def test_no_filter_is_no_prefix() -> None:
    assert query_prefix({"q": "", "state": ""}) == ""
