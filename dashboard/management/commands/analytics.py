"""``manage.py analytics hotspots|coupling|ownership|age|authors|files REPO [--since D]
[--until D] [--last 30|90|365] [--depth N] [--limit N] [--path P] [--author EMAIL]
[--min-revs N] [--min-shared-revs N] [--min-coupling N] [--max-changeset-size N]
[--inactive-days N] [--exclude LENS[,LENS]] [--json | --csv TABLE]`` — REPO is an id or a
URL (docs/analytics.md)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from dashboard import analytics
from dashboard.models import Repository
from dashboard.repositories import resolve_repository

#: The columns of each table the text output prints, per analysis and section.
COLUMNS: dict[str, list[tuple[str, str]]] = {
    "hotspots": [("revs", "revs"), ("churn", "churn"), ("authors", "authors"), ("trend", "trend")],
    "coupling": [("degree", "degree"), ("shared_revs", "shared"), ("average_revs", "avg revs")],
    "ownership": [
        ("revs", "revs"),
        ("main_dev", "main developer"),
        ("ownership", "share"),
        ("fragmentation", "fragmentation"),
        ("bus_factor", "bus factor"),
    ],
    "age": [("age_months", "months"), ("last_change_at", "last change"), ("revs", "revs")],
    "authors": [
        ("commits", "commits"),
        ("insertions", "+"),
        ("deletions", "-"),
        ("last_commit_at", "last commit"),
    ],
    "files": [("revs", "revs"), ("added", "+"), ("deleted", "-")],
    "weeks": [("commits", "commits"), ("insertions", "+"), ("deletions", "-")],
    "commits": [
        ("name", "author"),
        ("committed_at", "date"),
        ("added", "+"),
        ("deleted", "-"),
        ("subject", "subject"),
    ],
}


def _table(rows: list[dict[str, Any]], first: tuple[str, str], kind: str) -> list[str]:
    cols = [first, *COLUMNS[kind]]
    if not rows:
        return ["  (none)"]
    cells = [[str(r[key]) for key, _ in cols] for r in rows]
    widths = [max(len(title), *(len(c[i]) for c in cells)) for i, (_, title) in enumerate(cols)]
    lines = ["  " + "  ".join(t.ljust(w) for (_, t), w in zip(cols, widths, strict=True))]
    lines += [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells
    ]
    return [line.rstrip() for line in lines]


def render(body: dict[str, Any]) -> str:
    """The report as text tables (what ``--json`` prints as one JSON object)."""
    kind = body["analysis"]
    w = body["window"]
    lines = [
        f"{body['name']}: {kind} from {w['since'] or 'the first commit'} "
        f"to {w['until'] or 'now'} (fingerprint {body['fingerprint'][:12]})",
        f"reproduce: {body['reproduce']}",
    ]
    if body.get("exclude"):
        lenses = body["provenance"]["lenses"]
        lines.append(
            f"leaving out: {', '.join(body['exclude'])} (rules {lenses['ruleset']}; "
            f"attributes: {lenses['attributes']})"
        )
    if kind == "authors":
        if "activity" in body:
            a = body["activity"]
            lines.append(
                f"{a['name']} <{a['author']}>: {a['commits']} commits, +{a['insertions']} "
                f"-{a['deletions']}, {a['first_commit_at'][:10]} to {a['last_commit_at'][:10]}"
            )
            lines.append("per week:")
            lines += _table(a["weekly"], ("week", "week of"), "weeks")
            lines.append("files:")
            lines += _table(a["files"], ("path", "file"), "files")
        else:
            lines += _table(body["authors"], ("author", "author"), "authors")
        return "\n".join(lines)
    if kind == "files":
        h = body["history"]
        lines.append(f"{h['path']}: {h['revs']} revisions, +{h['added']} -{h['deleted']}")
        lines.append("authors:")
        lines += _table(h["authors"], ("author", "author"), "files")
        lines.append("changes with it:")
        lines += _table(h["coupled"], ("coupled", "file"), "coupling")
        lines.append("commits:")
        lines += _table(h["commits"], ("sha", "commit"), "commits")
        return "\n".join(lines)
    pair = ("coupled", "coupled with") if kind == "coupling" else None
    if "coupled" in body:
        lines.append(f"files changing with {body['path']}:")
        lines += _table(body["coupled"], pair or ("path", "file"), kind)
        return "\n".join(lines)
    if kind == "coupling":
        for section, title in (("files", "files"), ("directories", "directories")):
            lines.append(f"{title}:")
            rows = [{**r, "pair": f"{r['entity']} ~ {r['coupled']}"} for r in body[section]]
            lines += _table(rows, ("pair", "pair"), kind)
        return "\n".join(lines)
    lines.append("files:")
    lines += _table(body["files"], ("path", "file"), kind)
    lines.append("directories:")
    lines += _table(body["directories"], ("directory", "directory"), kind)
    if kind == "ownership":
        risk = body["knowledge_at_risk"]
        lines.append(f"inactive for {risk['inactive_days']} days:")
        for a in risk["authors"]:
            shown = ", ".join(a["files"][:5]) + (", …" if len(a["files"]) > 5 else "")
            lines.append(
                f"  {a['name']} <{a['author']}> last commit {a['last_commit_at'][:10]}: "
                f"{len(a['files'])} files only inactive authors changed"
                + (f" ({shown})" if a["files"] else "")
            )
        if not risk["authors"]:
            lines.append("  (none)")
    return "\n".join(lines)


class Command(BaseCommand):
    help = (
        "Print one analysis of a repository (hotspots, coupling, ownership, age, authors, "
        "a file's history) in a window."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("analysis", choices=analytics.KINDS)
        parser.add_argument("repo", help="repository id or URL")
        parser.add_argument("--since", help="first day (YYYY-MM-DD, UTC)")
        parser.add_argument("--until", help="last day (YYYY-MM-DD, UTC)")
        parser.add_argument("--last", help="the last 30, 90 or 365 days (ending at --until)")
        parser.add_argument(
            "--path", help="coupling: the files that change with this one; files: its history"
        )
        parser.add_argument("--author", help="authors: one author's activity (canonical e-mail)")
        for name in analytics.INTEGERS:
            parser.add_argument(f"--{name.replace('_', '-')}", dest=name)
        parser.add_argument(
            "--exclude",
            action="append",
            metavar="LENS",
            help=f"leave out a lens (repeatable or comma-separated): {', '.join(analytics.LENSES)}",
        )
        parser.add_argument("--json", action="store_true", help="the report as one JSON object")
        parser.add_argument("--csv", metavar="TABLE", help="one table of the report as CSV")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            repo = resolve_repository(options["repo"])
        except Repository.DoesNotExist:
            raise CommandError(f"no repository {options['repo']!r}") from None
        try:
            params = analytics.parse_params(options)
            body = analytics.report(options["analysis"], repo, params)
        except (analytics.BadParameter, analytics.NotFound) as exc:
            raise CommandError(str(exc)) from None
        if options["csv"]:
            found = analytics.tables(body)
            if options["csv"] not in found:
                raise CommandError(f"--csv must be one of {', '.join(found)}")
            for line in analytics.csv_lines(found[options["csv"]]):
                self.stdout.write(line, ending="")
        elif options["json"]:
            self.stdout.write(json.dumps(body, ensure_ascii=False))
        else:
            self.stdout.write(render(body))
