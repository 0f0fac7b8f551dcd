"""The repository list's and the audit log's rows rendered in Python
(``dashboard.web.prerendered_rows``): the same characters as the template loops they
replaced — kept here as fixtures (``tests/support/fixtures/tablerows/``) — over hostile, empty
and edge-case rows, and no markup from the database ever reaches the page unescaped.

Real database rows (``Repository``, ``AuditEntry``), shaped by the real readers
(``repositories.repository_rows``, ``audit.audit_page``, the audit view's links)."""

from __future__ import annotations

import html
from datetime import UTC, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import pytest
from django.contrib.auth.models import User
from django.template import Context, Template
from django.test import Client
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from dashboard.accounts.audit import audit_page, run_links
from dashboard.models import AuditEntry, Commit, CommitCount, Repository
from dashboard.repositories.commits import commit_page
from dashboard.repositories.lifecycle import current_fingerprint, repository_rows, submit_repository
from dashboard.templatetags import gitward
from dashboard.web import humanize, ops, prerendered_rows
from tests.conftest import run_workers
from tests.support.gitrepo import GitRepo

pytestmark = pytest.mark.django_db(transaction=True)
FIXTURES = Path(__file__).resolve().parents[2] / "support" / "fixtures" / "tablerows"

HOSTILE = [
    "<script>alert(1)</script>",
    "\"quoted\" & 'single' <b>",
    "a&amp;b &lt;already&gt;",
    "日本語 — ünïcødé ✓ 🚀",
    "{braces} {0} %s %(x)s",
    "",
    "  spaced  \n newline\ttab",
    "javascript:alert(1)",
]


def old_loop(name: str, **context: Any) -> str:
    """What the template loop printed (the engine the pages use: builtins, autoescape)."""
    return Template((FIXTURES / name).read_text()).render(Context(context))


# ---------------------------------------------------------------------------- repositories


def _repositories() -> list[dict[str, Any]]:
    now = timezone.now()
    fp = current_fingerprint()
    statuses = list(Repository.Status.values)
    when = [None, now - timedelta(minutes=10), now - timedelta(days=3),
            now + timedelta(hours=5), now - timedelta(days=800)]  # fmt: skip
    for i, text in enumerate(HOSTILE):
        repo = Repository.objects.create(
            url=f"https://user:secret@example.com/team/{text}/r{i}.git" if i % 3 == 0
            else f"https://example.com/{text}/r{i}{text}",
            branch=text if i % 2 else "",
            status=statuses[i % len(statuses)],
            fingerprint=fp if i % 2 else "other",
            commits_total=[0, 1, 3, 1204, 1_000_000, 7, 2, 12][i],
            analyzed_at=when[i % len(when)],
        )  # fmt: skip
        if i % 4:
            CommitCount.objects.create(repository=repo, fingerprint=fp, commits=[0, 1, 2, 3][i % 4])
    rows = repository_rows(Repository.objects.order_by("-id"))
    assert {r["status"] for r in rows} == set(statuses)  # every status badge
    assert len({r["progress"] for r in rows}) > 2  # 100.0, 0.0, fractions
    return rows


def test_it_prints_the_repository_rows_exactly_as_the_template_loop_did() -> None:
    rows = _repositories()
    for filters in ({}, {"q": "x"}, {"status": "ready"}, ""):
        want = old_loop("repository_loop.html", repositories=rows, filters=filters)
        assert str(prerendered_rows.repository_rows(rows, filters)) == want


def test_it_prints_odd_values_of_the_repository_rows_as_the_template_did() -> None:
    """Fields the loop met other than as the reader shapes them: None everywhere,
    numbers where text is, text where numbers are, a safe string."""
    rows = [
        {"id": 5, "status": None, "name": None, "url": None, "branch": None, "progress": None,
         "commits_analyzed": None, "commits_total": None,
         "repo": SimpleNamespace(analyzed_at=None)},
        {"id": 1234567, "status": 3, "name": 1.5, "url": True, "branch": 0, "progress": 33.3,
         "commits_analyzed": 10**9, "commits_total": "many <x>",
         "repo": SimpleNamespace(analyzed_at="2020-01-02T03:04:05+00:00")},
        {"id": 6, "status": "ready", "name": mark_safe("<i>safe</i>"), "url": ["<l>"],
         "branch": {"b": "<d>"}, "progress": 1e-7, "commits_analyzed": -1,
         "commits_total": 2.5, "repo": SimpleNamespace(analyzed_at="not a time")},
    ]  # fmt: skip
    want = old_loop("repository_loop.html", repositories=rows, filters={})
    assert str(prerendered_rows.repository_rows(rows, {})) == want


def test_it_prints_the_empty_repository_list_as_the_template_did() -> None:
    for filters in ({}, {"q": "nothing"}, {"status": "failed"}, {"q": "", "status": ""}, ""):
        want = old_loop("repository_loop.html", repositories=[], filters=filters)
        assert str(prerendered_rows.repository_rows([], filters)) == want
    assert "No repositories match." in prerendered_rows.repository_rows([], {"q": "a"})
    assert "No repositories yet." in prerendered_rows.repository_rows([], "")


# ---------------------------------------------------------------------------- audit log


def _entries() -> list[AuditEntry]:
    now = timezone.now()
    details: list[Any] = [
        {}, {"reason": "<script>x</script> & \"why\""}, {"reason": 0}, {"reason": 42},
        {"reason": ["a", "<b>"]}, {"reason": {"k": "<v>"}}, ["reason"], "reason", {"reason": None},
        {"reason": True}, {"reason": 2.5}, {"holder": {"job": "analyze-<1>-\"x\""}},
        {"holder": "not a dict"},
    ]  # fmt: skip
    actions = ["repo.submit", "dlq.retry", "lock.release", "queue.pause", "rollout.start",
               "weird <act> & \"x\"", "日本.語"]  # fmt: skip
    targets = [*HOSTILE, "runs [3, 4, 17]", "runs []", "runs [1,2]"]
    for i in range(max(len(details), len(targets))):
        entry = AuditEntry.objects.create(
            actor=HOSTILE[i % len(HOSTILE)] or "system",
            action=actions[i % len(actions)],
            target=targets[i % len(targets)],
            outcome=HOSTILE[(i + 3) % len(HOSTILE)],
            detail=details[i % len(details)],
        )
        # Times in minutes and more: the two renders a few ms apart read the same text.
        AuditEntry.objects.filter(pk=entry.pk).update(
            created_at=now - timedelta(minutes=10 * i) + timedelta(days=2 if i == 3 else 0)
        )
    entries, _ = audit_page()
    ops._link_targets(entries)  # the audit view's own preparation
    for e in entries:
        e.runs = run_links(e)
    assert any(e.target_link for e in entries) and any(not e.target_link for e in entries)
    assert any(e.runs for e in entries)
    # Values the view never makes, to cover every branch of the loop's cells.
    odd = AuditEntry(pk=99999, actor="", action="", target="<t>", outcome="", detail=None)
    odd.created_at = None  # type: ignore[assignment]
    odd.target_link = 'javascript:alert("x")&<y>'
    odd.runs = [("<label>", '/runs/"1"/?a=1&b=<2>'), ("plain", "/runs/2/")]
    return [*entries, odd, AuditEntry(pk=100000, actor="a", action="b", target="c", outcome="d")]


def test_it_prints_the_audit_rows_exactly_as_the_template_loop_did() -> None:
    entries = _entries()
    last = entries[-1]
    last.created_at = timezone.now() - timedelta(days=40)
    for filters in ({}, {"action": "x"}, {"actor": "y"}, {"q": "z"}, ""):
        want = old_loop("audit_loop.html", entries=entries, filters=filters)
        assert str(prerendered_rows.audit_rows(entries, filters)) == want


def test_it_prints_the_empty_audit_log_as_the_template_did() -> None:
    for filters in ({}, {"action": "a"}, {"actor": "b"}, {"q": "c"}, {"q": ""}, ""):
        want = old_loop("audit_loop.html", entries=[], filters=filters)
        assert str(prerendered_rows.audit_rows([], filters)) == want
    assert "Nothing recorded that matches." in prerendered_rows.audit_rows([], {"actor": "b"})
    assert "Nothing recorded yet." in prerendered_rows.audit_rows([], {})


# ---------------------------------------------------------------------------- the pages


def test_no_markup_from_the_database_reaches_the_pages_unescaped(client: Client) -> None:
    client.force_login(User.objects.create_superuser("ops", password="pw-ops-12345"))
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    Repository.objects.create(url=f"https://example.com/{evil}/r.git", branch=evil,
                              status="ready")  # fmt: skip
    AuditEntry.objects.create(actor=evil, action=f"repo.{evil}", target=evil, outcome=evil,
                              detail={"reason": evil})  # fmt: skip
    for path in ("/repos/", "/audit/", "/"):
        page = client.get(path).content.decode()
        body = page.split("<tbody>", 1)[1]
        assert "<script>alert" not in body and "<img src=x" not in body, path
        assert html.escape("<script>alert(", quote=False) in body, path  # shown, as text
    audit = client.get("/audit/").content.decode()
    assert audit.count("&lt;img src=x onerror=alert(1)&gt;") >= 4  # who, action, target, why
    assert 'href="?action=repo.%3Cscript%3Ealert%28%22x%22%29' in audit


# ---------------------------------------------------------------------------- cells


def _ago_reference(value: Any) -> str:
    """``|ago`` as it was written with ``format_html`` (before
    ``dashboard.web.prerendered_rows``)."""
    when = humanize.parse_time(value)
    if when is None:
        return "—"
    if timezone.is_naive(when):
        when = timezone.make_aware(when, UTC)
    exact = when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = humanize.relative((timezone.now() - when).total_seconds())
    return format_html(
        '<time class="ago" datetime="{}" title="{}">{}</time>', when.isoformat(), exact, text
    )


def _copyable_reference(value: Any, link: str, short: str) -> str:
    """``|shortid``/``|shortsha``'s cell as it was written with ``format_html``."""
    if value in (None, ""):
        return "—"
    full = str(value)
    if link:
        quoted = quote(full, safe="")
        href = link.replace("{}", quoted) if "{}" in link else link + quoted
        cls = "run-link" if link.startswith("/runs/job/") else "id-link"
        label = format_html('<a class="{}" href="{}"><code>{}</code></a>', cls, href, short)
    else:
        label = format_html("<code>{}</code>", short)
    return format_html(
        '<span class="id" title="{}">{}<button type="button" class="copy" data-copy="{}" '
        'aria-label="copy {}">copy</button></span>',
        full, label, full, full,
    )  # fmt: skip


def test_the_time_and_id_cells_print_what_format_html_printed() -> None:
    now = timezone.now()
    times: list[Any] = [None, "", "nope", now - timedelta(days=3), now + timedelta(hours=2),
                        (now - timedelta(minutes=10)).replace(tzinfo=None),
                        "2020-01-02T03:04:05+02:00", "2020-01-02T03:04:05"]  # fmt: skip
    for value in times:
        assert gitward.ago(value) == _ago_reference(value)
        assert type(gitward.ago(value)) is type(_ago_reference(value))
    ids: list[Any] = [None, "", 0, 12345, "analyze-<1>-\"x\"&'y'", "a" * 60, "日本語/ü",
                      mark_safe("<b>safe</b>")]  # fmt: skip
    links = ["", "/runs/?q=", "/runs/job/{}/", '/repos/1/commits/{}/?a="1"&b=<2>']
    for value in ids:
        for link in links:
            for cell in (gitward.shortid, gitward.shortsha):
                short = gitward.shorten(str(value)) if cell is gitward.shortid else str(value)[:10]
                assert cell(value, link) == _copyable_reference(value, link, short), (value, link)


# ---------------------------------------------------------------------------- commits


def test_it_prints_the_commit_rows_exactly_as_the_template_loop_did(git_repo: GitRepo) -> None:
    git_repo.commit("<script>alert(1)</script> & \"q\"", {"x.py": "1\n"},
                    author=("Ünï <b>", "a@e.com"))  # fmt: skip
    repo, _ = submit_repository(url=str(git_repo.path))
    run_workers()
    stored, _ = commit_page(repo, fingerprint=current_fingerprint(), limit=50)
    assert len(stored) == len(git_repo.shas())
    now = timezone.now()
    odd = [
        Commit(sha="", subject="", author_name="", committed_at=None, files_changed=0,
               insertions=0, deletions=0, is_merge=True),
        Commit(sha="<sha>\"&'", subject=HOSTILE[1], author_name=HOSTILE[3],
               committed_at=now - timedelta(days=400), files_changed=12345, insertions=10**6,
               deletions=7, is_merge=False),
    ]  # fmt: skip
    rows = [*stored, *odd]
    for link in (f"/repos/{repo.pk}/commits/{{}}/", "", '/x/"<y>"&/{}/'):
        want = old_loop("commit_loop.html", commits=rows, commit_link=link)
        assert str(prerendered_rows.commit_rows(rows, link)) == want
        assert str(prerendered_rows.commit_rows([], link)) == old_loop(
            "commit_loop.html", commits=[], commit_link=link
        )
    page = Client()
    page.force_login(User.objects.create_superuser("ops", password="pw-ops-12345"))
    body = page.get(f"/repos/{repo.pk}/").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;q&quot;" in body
    assert "<script>alert(1)" not in body
