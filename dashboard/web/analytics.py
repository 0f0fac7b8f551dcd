"""A repository's analyses as pages (docs/analytics.md#api-cli-and-pages):
``/repos/<id>/analytics/<analysis>/`` for hotspots, coupling, ownership, age, authors (one
author with ``?author=``) and a file's history (``?path=``), the window and parameters as a
GET form; thin over ``dashboard.analytics``."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from dashboard import analytics
from dashboard.live.snapshots import results_marks
from dashboard.repositories import repository_with_status
from dashboard.web.charts import history_bars

#: The form's fields per analysis, beside the window (since, until, last): (name, label).
FIELDS: dict[str, list[tuple[str, str]]] = {
    "hotspots": [("depth", "directory depth"), ("limit", "rows")],
    "coupling": [
        ("path", "changes with file"),
        ("min_revs", "min revisions"),
        ("min_shared_revs", "min shared"),
        ("min_coupling", "min degree %"),
        ("max_changeset_size", "max change set"),
        ("depth", "directory depth"),
        ("limit", "rows"),
    ],
    "ownership": [
        ("inactive_days", "inactive after days"),
        ("depth", "directory depth"),
        ("limit", "rows"),
    ],
    "age": [("depth", "directory depth"), ("limit", "rows")],
    "authors": [("author", "author e-mail"), ("limit", "rows")],
    "files": [("path", "file"), ("limit", "rows")],
}
TITLES = {"hotspots": "Hotspots", "coupling": "Change coupling", "ownership": "Ownership",
          "age": "Code age", "authors": "Authors", "files": "File history"}  # fmt: skip


def lens_toggles(query: Any, excluded: set[str]) -> list[dict[str, Any]]:
    """One link per lens that turns it on or off and keeps every other query parameter
    (docs/analytics.md#lenses); ``query`` is the request's ``QueryDict``."""
    toggles = []
    for name in analytics.LENSES:
        after = excluded ^ {name}
        items = [(k, v) for k in query for v in query.getlist(k) if k != "exclude"]
        if after:
            items.append(("exclude", ",".join(n for n in analytics.LENSES if n in after)))
        toggles.append({"name": name, "on": name in excluded, "href": "?" + urlencode(items)})
    return toggles


@login_required
def repository_analytics(request: HttpRequest, repo_id: int, analysis: str) -> HttpResponse:
    if analysis not in analytics.KINDS:
        raise Http404("no such analysis")
    found = repository_with_status(repo_id)
    if found is None:
        raise Http404("repository not found")
    repo, state = found
    values = {k: request.GET.get(k, "").strip()[:4097] for k in request.GET}
    if "exclude" in request.GET:  # ?exclude=a,b or ?exclude=a&exclude=b
        values["exclude"] = ",".join(request.GET.getlist("exclude"))[:200]
    try:
        excluded = set(analytics.parse_exclude(values.get("exclude")))
    except analytics.UnknownLens:
        excluded = set()
    context: dict[str, Any] = {
        "repo": repo,
        "analysis": analysis,
        "title": TITLES[analysis],
        "kinds": [(k, TITLES[k]) for k in analytics.KINDS],
        "presets": analytics.PRESETS,
        "values": values,
        "fields": [
            {
                "name": n,
                "label": label,
                "value": values.get(n, ""),
                "default": analytics.INTEGERS[n][0] if n in analytics.INTEGERS else "",
            }
            for n, label in FIELDS[analysis]
        ],
        "lenses": lens_toggles(request.GET, excluded),
        "exclude": ",".join(n for n in analytics.LENSES if n in excluded),
        "body": None,
        "error": None,
        "error_field": None,
    }
    context["verification"] = analytics.verification_status(repo)
    # Live: the page's socket (/ws/repos/N/) sends these marks in every snapshot; other
    # ones (new results landed) swap the results in without a reload (docs/live-view.md).
    context["live_socket"] = f"/ws/repos/{repo.pk}/?results=1"
    context["results_marks"] = results_marks(state, context["verification"])
    if context["verification"] and context["verification"]["withheld"]:
        context["withheld"] = context["verification"]["reason"]  # docs/analytics.md#verification
        return render(request, "analytics.html", context, status=409)
    if analysis == "files" and not values.get("path"):
        return render(request, "analytics.html", context)  # the form asks for a path
    try:
        context["body"] = analytics.report(analysis, repo, analytics.parse_params(values))
        context["csv_tables"] = list(analytics.tables(context["body"]))
        if context["body"].get("activity"):  # one author: their commits over the window
            context["chart"] = history_bars(context["body"]["activity"]["weekly"])
    except analytics.NotFound as exc:
        context["error"] = str(exc)
        return render(request, "analytics.html", context, status=404)
    except analytics.BadParameter as exc:
        context["error"] = str(exc)
        first = str(exc).split(" ", 1)[0].rstrip(":")
        context["error_field"] = (
            first
            if first in {*analytics.INTEGERS, "since", "until", "last", "path", "exclude"}
            else None
        )
        return render(request, "analytics.html", context, status=400)
    return render(request, "analytics.html", context)
