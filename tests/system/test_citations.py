"""Every citation in the repository can be followed from a clone.

No tracked source file cites a document that is not in the repository (design notes,
research notes, files beside the checkout) or an issue number: a comment says what it means in
words, or cites the repository's own page under ``docs/``. And every ``docs/<page>.md``
a source file cites exists.

Sources are the files ``git ls-files`` lists, except binaries and this module; Markdown
counts too (the README, BENCHMARKS.md and every page under ``docs/``).
"""

from __future__ import annotations

import re
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().relative_to(ROOT).as_posix()

#: What a citation of something outside the repository looks like, by what it cites.
FORBIDDEN = {
    "the design notes": re.compile(r"\bDESIGN\b|DESIGN\.md"),
    "the style notes": re.compile(r"\bSTYLE\.md|\bSTYLE\s*§"),
    "an issue number": re.compile(r"\b[Ii]ssues? #?\d+\b"),
    "an attack catalog row without its page": re.compile(
        r"\bcatalog [GD]\d+\b(?!\S*\s*\(?`?docs/security\.md)"
    ),
    "a file beside the repository": re.compile(r"\.\./shared\b"),
    "the research notes": re.compile(r"\bresearch/[\w.-]+\.md"),
}

#: A page of the repository's own documentation, as comments cite it.
DOCS_PAGE = re.compile(r"(?<![\w./-])docs/([a-z-]+)\.md")


def _sources() -> dict[str, str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no tracked-file list to scan")
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    texts = {}
    for name in filter(None, listed.split("\0")):
        if name == HERE:
            continue
        path = ROOT / name
        if not path.is_file():  # deleted in the work tree, not yet committed
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue
        texts[name] = data.decode("utf-8", errors="replace")
    return texts


def _matches(text: str, pattern: re.Pattern[str]) -> list[tuple[int, str]]:
    return [
        (number, match.group(0))
        for number, line in enumerate(text.splitlines(), start=1)
        for match in pattern.finditer(line)
    ]


def test_the_patterns_catch_what_they_are_for() -> None:
    def caught(text: str) -> set[str]:
        return {what for what, pattern in FORBIDDEN.items() if pattern.search(text)}

    # The citations are put together here, so that this file does not make them itself.
    section, design, style, issue, up = "§", "DESIGN", "STYLE", "ssue", ".."
    assert caught(f"the lifecycle ({design} {section}5)") == {"the design notes"}
    assert caught(f"see {design}.md") == {"the design notes"}
    assert caught(f"{style}.md {section}11") == {"the style notes"}
    assert caught(f"I{issue} 14.4: only the new commits") == {"an issue number"}
    assert caught(f"(i{issue} #9, item 6)") == {"an issue number"}
    assert caught("Websocket Origin policy (catalog D5).") == {
        "an attack catalog row without its page"
    }
    assert caught("catalog D5 (docs/security.md#d5)") == set()
    assert caught(f"see {up}/shared/research/reliability.md") == {
        "a file beside the repository",
        "the research notes",
    }
    assert caught("(docs/locks.md#what-holds; tissue 5; issues with git; G20)") == set()
    assert DOCS_PAGE.findall("(docs/locks.md, `docs/security.md#g3`)") == ["locks", "security"]
    assert DOCS_PAGE.findall("zulip's docs/subsystems/x.md, a/docs/b.md") == []


def test_no_source_cites_a_document_outside_the_repository_or_an_issue() -> None:
    sources = _sources()
    assert len(sources) > 200  # the scan itself works
    found = [
        f"{name}:{number}: {text!r} ({what})"
        for name, source in sorted(sources.items())
        for what, pattern in FORBIDDEN.items()
        for number, text in _matches(source, pattern)
    ]
    assert not found, "citations that cannot be followed from a clone:\n" + "\n".join(found)


def test_every_cited_docs_page_exists() -> None:
    cited: dict[str, list[str]] = defaultdict(list)
    for name, source in sorted(_sources().items()):
        for number, text in _matches(source, DOCS_PAGE):
            cited[text].append(f"{name}:{number}")
    assert cited  # the scan itself works
    missing = {page: where for page, where in sorted(cited.items()) if not (ROOT / page).is_file()}
    assert not missing, "cited pages that do not exist:\n" + "\n".join(
        f"{page} ({len(where)} citations, first {where[0]})" for page, where in missing.items()
    )
