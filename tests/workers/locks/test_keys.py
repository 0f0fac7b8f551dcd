"""workers/locks/keys.py: every lock key (docs/locks.md) round-trips through parse/build."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.locks import keys

SHA = st.text("0123456789abcdef", min_size=40, max_size=40)
QUEUE = st.from_regex(r"\A[A-Za-z0-9_.@-]{1,40}\Z")
FP = st.text("0123456789abcdef", min_size=16, max_size=64)
REPO = st.integers(min_value=0, max_value=10**12)


def test_it_builds_the_documented_shapes() -> None:
    assert keys.mirror(7) == "locks:git:repo:7:mirror"
    assert keys.chunk(7, "aa11..bb22") == "locks:git:repo:7:commit:aa11..bb22"
    assert keys.chunk(7, "aa11") == "locks:git:repo:7:commit:aa11"
    assert keys.deploy("analysis") == "locks:queue:analysis:deploy"
    assert keys.warm("analysis", "3f2a9c1e") == "locks:queue:analysis:warm:3f2a9c1e"


@given(REPO)
def test_it_round_trips_mirror_keys(repo_id: int) -> None:
    key = keys.mirror(repo_id)
    parsed = keys.parse(key)
    assert (parsed.kind, parsed.repo_id) == ("mirror", repo_id)
    assert keys.build(parsed) == key


@given(REPO, SHA, st.one_of(st.none(), SHA))
def test_it_round_trips_chunk_keys(repo_id: int, first: str, last: str | None) -> None:
    span = f"{first}..{last}" if last else first
    key = keys.chunk(repo_id, span)
    parsed = keys.parse(key)
    assert (parsed.kind, parsed.repo_id, parsed.first, parsed.last) == (
        "chunk",
        repo_id,
        first,
        last,
    )
    assert keys.build(parsed) == key
    assert key.startswith(keys.repo_prefix(repo_id))


@given(QUEUE, FP)
def test_it_round_trips_queue_keys(queue: str, fp: str) -> None:
    for key, kind in ((keys.deploy(queue), "deploy"), (keys.warm(queue, fp), "warm")):
        parsed = keys.parse(key)
        assert parsed.kind == kind and parsed.queue == queue
        assert keys.build(parsed) == key
    assert keys.parse(keys.warm(queue, fp)).fingerprint == fp


@given(st.text(max_size=80))
def test_it_never_raises_on_foreign_keys(key: str) -> None:
    parsed = keys.parse(key)
    assert keys.build(parsed) == key


@pytest.mark.parametrize(
    "key",
    [
        "locks:git:repo:07:mirror",  # not canonical: would not round-trip
        "locks:git:repo:7:mirror:extra",
        "locks:git:repo:7:commit:XYZ",
        "locks:queue:a b:deploy",
        "other:git:repo:7:mirror",
    ],
)
def test_it_treats_malformed_keys_as_other(key: str) -> None:
    assert keys.parse(key).kind == "other"
    assert keys.parse(key).label() == key


def test_it_labels_keys_for_people() -> None:
    assert keys.parse(keys.chunk(1, "a" * 40 + ".." + "b" * 40)).label() == (
        "commits aaaaaaaa..bbbbbbbb"
    )
    assert keys.parse(keys.mirror(1)).label() == "mirror"
    assert keys.parse(keys.deploy("analysis")).label() == "deploy analysis"


@pytest.mark.parametrize(
    "build",
    [
        lambda: keys.mirror(-1),
        lambda: keys.chunk(1, "not-a-sha"),
        lambda: keys.deploy("bad queue"),
        lambda: keys.warm("analysis", "XYZ"),
    ],
)
def test_it_refuses_to_build_invalid_keys(build: object) -> None:
    with pytest.raises(ValueError):
        build()  # type: ignore[operator]
