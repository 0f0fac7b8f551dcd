"""The rows of the longest tables (the repository list, the audit log, a repository's
commits) and their id cells, rendered in Python instead of a template loop (load test,
BENCHMARKS.md: 50-row tables were the pages' largest remaining CPU cost; Django's template
engine resolves every ``{{ }}`` through its variable lookup, filter and localisation
machinery, cell by cell).

Contract: each function returns, character for character, what the template loop it
replaces printed (``tests/dashboard/web/test_prerendered_rows.py`` keeps those loops as fixtures
and compares them over hostile and edge-case rows). So every value goes through ``_text``, which is
what ``{{ value }}`` does with autoescaping on: localise (numbers, booleans), ``str``, then
``conditional_escape`` (for a plain string ``html.escape`` directly, the function Django's
``escape`` calls) — every string from the database is escaped, and only markup built here or already
marked safe (``ago_html``) is emitted as is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape as html_escape
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.urls import reverse
from django.utils.formats import localize
from django.utils.html import conditional_escape
from django.utils.safestring import SafeString, mark_safe

from dashboard.web import humanize
from dashboard.web.humanize import ago_html

__all__ = ["audit_rows", "commit_rows", "copyable_html", "repository_rows"]

#: A repository id no row has, for building the row links from one ``reverse``.
_SENTINEL = 987654321987


def _text(value: Any) -> str:
    """``{{ value }}`` with autoescaping: ``render_value_in_context`` without a context.
    Plain strings (the common case, never safe) go straight to ``html.escape``, which is
    what Django's ``escape`` calls, without its lazy-string wrapper; ints print as
    ``str`` unless thousands are separated (``localize`` then adds the separators)."""
    kind = type(value)
    if kind is str:
        return html_escape(value)
    if kind is int and not settings.USE_THOUSAND_SEPARATOR:
        return str(value)
    value = localize(value)
    if not isinstance(value, str):
        value = str(value)
    return conditional_escape(value)


def _lookup(obj: Any, key: str) -> Any:
    """``{{ obj.key }}`` for the filter dicts: missing (or no dict at all) is ""."""
    if isinstance(obj, Mapping):
        return obj.get(key, "")
    return getattr(obj, key, "")


# ---------------------------------------------------------------------------- cells


def _esc(value: Any) -> str:
    """``format_html``'s escaping of one argument: ``html.escape`` for a plain string
    (without the lazy-string wrapper; a 50-commit table calls this 200 times),
    ``conditional_escape`` for anything else (a safe string stays as it is)."""
    return html_escape(value) if type(value) is str else conditional_escape(value)


def copyable_html(value: Any, link: str, short: str) -> SafeString | str:
    """``|shortid``/``|shortsha``'s cell: ``short`` with the full id on hover and a copy
    button, linked to ``link`` + the id (or ``link`` with the id at ``{}``) if given."""
    if value in (None, ""):
        return "—"
    full = _esc(str(value))
    if link:
        quoted = quote(str(value), safe="")
        href = link.replace("{}", quoted) if "{}" in link else link + quoted
        cls = "run-link" if link.startswith("/runs/job/") else "id-link"
        label = f'<a class="{cls}" href="{_esc(href)}"><code>{_esc(short)}</code></a>'
    else:
        label = f"<code>{_esc(short)}</code>"
    # format_html's characters: every argument escaped, the label built above
    return mark_safe(  # noqa: S308
        f'<span class="id" title="{full}">{label}<button type="button" class="copy" '
        f'data-copy="{full}" aria-label="copy {full}">copy</button></span>'
    )


# ---------------------------------------------------------------------------- repositories

_REPO_ROW = (
    '\n    <tr data-repo-id="{id}" data-status="{status}">'
    '\n      <td><a href="{href}">{name}</a><div class="muted small path">{url}</div></td>'
    "\n      <td>{branch}</td>"
    '\n      <td><span class="status s-{status}">{status}</span></td>'
    '\n      <td><progress max="100" value="{progress}" aria-label="{name}: analysed">'
    '{progress}%</progress> <span class="small">{progress}%</span></td>'
    "\n      <td>{analyzed} / {total}</td>"
    "\n      <td>{analyzed_at}</td>"
    "\n    </tr>\n  "
)


def repository_rows(rows: Iterable[Mapping[str, Any]], filters: Any = "") -> SafeString:
    """The ``<tr>``s of ``_repo_table.html`` for ``repositories.repository_rows`` dicts,
    or its "No repositories yet/match." row; ``filters`` is the page's ``q``/``status``."""
    link = reverse("repository", args=[_SENTINEL])
    head, _, tail = conditional_escape(link).partition(str(_SENTINEL))
    out = []
    for row in rows:
        repo = row["repo"]
        out.append(
            _REPO_ROW.format(
                id=_text(row["id"]),
                status=_text(row["status"]),
                href=f"{head}{html_escape(str(row['id']))}{tail}",  # reverse() prints str(id)
                name=_text(row["name"]),
                url=_text(row["url"]),
                branch=_text(row["branch"] or "(default)"),
                progress=_text(row["progress"]),
                analyzed=_text(row["commits_analyzed"]),
                total=_text(humanize.count(row["commits_total"], "commit")),
                analyzed_at=_text(ago_html(repo.analyzed_at)),
            )
        )
    if not out:
        which = "match" if _lookup(filters, "q") or _lookup(filters, "status") else "yet"
        out.append(f'\n    <tr><td colspan="6" class="muted">No repositories {which}.</td></tr>')
        out.append("\n  ")
    return mark_safe("".join(out))  # noqa: S308 - every value above went through _text


# ---------------------------------------------------------------------------- audit log

_AUDIT_ROW = (
    '<tr data-entry="{pk}"><td>{when}</td><td>{actor}</td>'
    '<td><a href="?action={action_q}">{action}</a></td>'
    '<td class="path">{target}{runs}</td><td>{outcome}</td><td class="reason">{reason}</td></tr>'
)


def _reason(detail: Any) -> Any:
    """``{{ e.detail.reason|default:"" }}``: a JSON detail that is no object, or has no
    reason, prints nothing (the template's failed lookup), as does a falsy reason."""
    value = detail.get("reason", "") if isinstance(detail, dict) else ""
    return value or ""


def audit_rows(entries: Iterable[Any], filters: Any = "") -> SafeString:
    """The ``<tr>``s of ``audit.html`` for ``AuditEntry`` rows carrying the view's
    ``target_link`` and ``runs`` (``ops._link_targets``, ``audit.run_links``), or its
    "Nothing recorded yet / that matches." row."""
    out = []
    for e in entries:
        target = _text(e.target)
        link = getattr(e, "target_link", "")
        if link:
            target = f'<a href="{_text(link)}">{target}</a>'
        runs = "".join(
            f' · <a class="run-link" href="{_text(href)}">{_text(label)}</a>'
            for label, href in getattr(e, "runs", None) or ()
        )
        out.append(
            _AUDIT_ROW.format(
                pk=_text(e.pk),
                when=_text(ago_html(e.created_at)),
                actor=_text(e.actor),
                action_q=_text(quote(str(e.action))),
                action=_text(e.action),
                target=target,
                runs=runs,
                outcome=_text(e.outcome),
                reason=_text(_reason(e.detail)),
            )
        )
    if not out:
        matching = any(_lookup(filters, k) for k in ("action", "actor", "q"))
        which = " that matches" if matching else " yet"
        out.append(f'<tr><td colspan="6" class="muted">Nothing recorded{which}.</td></tr>')
    return mark_safe("".join(out))  # noqa: S308 - every value above went through _text


# ---------------------------------------------------------------------------- commits

_COMMIT_ROW = (
    '<tr><td>{sha}{merge}</td><td class="subject">{subject}</td><td>{author}</td>'
    "<td>{when}</td><td>{files}</td><td>+{insertions} −{deletions}</td></tr>\n  "
)


def commit_rows(commits: Iterable[Any], link: str = "") -> SafeString:
    """The ``<tr>``s of the repository page's commit table for ``Commit`` rows, each sha
    linked to ``link`` (``/repos/<id>/commits/{}/``), or its "No commits" row."""
    out = [
        _COMMIT_ROW.format(
            sha=_text(copyable_html(c.sha, link, str(c.sha)[:10])),
            merge=' <span class="pill">merge</span>' if c.is_merge else "",
            subject=_text(c.subject),
            author=_text(c.author_name),
            when=_text(ago_html(c.committed_at)),
            files=_text(c.files_changed),
            insertions=_text(c.insertions),
            deletions=_text(c.deletions),
        )
        for c in commits
    ]
    if not out:
        out.append('<tr><td colspan="6" class="muted">No commits analysed yet.</td></tr>')
    return mark_safe("".join(out))  # noqa: S308 - every value above went through _text
