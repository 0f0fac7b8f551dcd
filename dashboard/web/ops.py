"""The operations pages (overview, locks, workers, dead letters, audit log): thin over
the domain modules. Each is server-rendered from a snapshot (``dashboard.live.snapshots``),
then kept live by the ops websocket; each needs ``dashboard.view_jobrun``, like the
socket itself (the overview sends users without it to their repositories instead)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode

from dashboard import analytics
from dashboard.accounts import audit_actions, audit_page, run_links
from dashboard.infra import RedisUnavailable
from dashboard.live.snapshots import ops_snapshot, shared_part
from dashboard.models import Repository
from dashboard.operations import day_series
from dashboard.repositories import repository_rows
from dashboard.rollouts import canary_offers, permitted, transition_marks
from dashboard.runs import group_page
from dashboard.web.charts import day_charts, sparklines
from dashboard.web.list_params import positive_int, query_prefix
from dashboard.web.page_cache import FRESH_HEADER, reusable


def _ops_page(request: HttpRequest, template: str, **extra: Any) -> HttpResponse:
    """An operations page: server-rendered from a snapshot, then kept live by the
    websocket. Needs ``dashboard.view_jobrun`` like the socket itself."""
    if not request.user.has_perm("dashboard.view_jobrun"):
        return render(request, "forbidden.html", status=403)
    socket = "/ws/ops/?dlq=groups" if template == "dead_letters.html" else "/ws/ops/"
    context: dict[str, Any] = {"live_socket": socket, **extra}
    if template == "dead_letters.html":
        # the integrity group beside the dead letters (docs/analytics.md#verification)
        context["integrity"] = analytics.open_mismatches(limit=50)
        # compared with each snapshot's ``integrity_marks`` by gitward.js: a differing
        # one fetches the page again and swaps the group in (docs/live-view.md)
        context["integrity_marks"] = json.dumps(
            analytics.mismatch_marks_of(context["integrity"]), separators=(",", ":")
        )
        context["can_clear_integrity"] = request.user.is_staff and request.user.has_perm(
            "dashboard.change_repository"
        )
        text = request.GET.get("q", "").strip()[:200]
        context["dlq_filter"] = text
        page = positive_int(request.GET.get("page"), 1)
        if not text and page <= 5:  # the same for every operator: shared (see shared_part)
            # gitward.js refetches the groups for a snapshot newer than the page: built
            # anew then, as a shared copy may predate it (docs/live-view.md).
            fresh = request.headers.get(FRESH_HEADER) == "1"
            context["dlq_page"] = shared_part(
                ("dlq_page", page), lambda: group_page(page=page), fresh=fresh
            )
        else:
            context["dlq_page"] = group_page(text=text, page=page)
    try:
        context["snapshot"] = ops_snapshot(
            user=request.user, dlq_groups=template == "dead_letters.html"
        )
        context["sparks"] = sparklines(context["snapshot"]["series"])
    except RedisUnavailable as exc:
        context["redis_error"] = str(exc)
    return render(request, template, context)


@login_required
@reusable
def overview(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm("dashboard.view_jobrun"):
        return redirect("repositories")  # users without operations access see their work
    # The recent repositories, offers and day charts are the same for every operator:
    # shared for the snapshot's TTL (``snapshots.shared_part``).
    recent = shared_part(
        "overview.recent", lambda: repository_rows(Repository.objects.order_by("-id"), limit=10)
    )
    try:
        offers = shared_part("overview.offers", canary_offers)
    except RedisUnavailable:
        offers = []
    return _ops_page(
        request,
        "overview.html",
        repositories=recent,
        day=shared_part("overview.day", _day_charts),
        rollback_offers=offers,
        can_rollback=permitted(request.user, "rollback"),
    )


def _day_charts() -> dict[str, Any]:
    """The Overview's 24-hour charts, with a mark per rollout transition in their window
    (docs/rollouts.md#chart-marks)."""
    day = day_series()
    start = datetime.fromisoformat(day["hours"][0])
    marks = transition_marks(start, start + timedelta(hours=len(day["hours"])))
    return day_charts(day, marks)


@login_required
@reusable
def locks(request: HttpRequest) -> HttpResponse:
    return _ops_page(request, "locks.html")


@login_required
@reusable
def workers(request: HttpRequest) -> HttpResponse:
    # The Git hosts table comes from the snapshot (``snapshot.fetch_hosts``): the page's
    # socket redraws it from every later one (docs/live-view.md).
    return _ops_page(request, "workers.html")


@login_required
@reusable
def dead_letters(request: HttpRequest) -> HttpResponse:
    return _ops_page(request, "dead_letters.html")


@login_required
@reusable
def audit(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm("dashboard.view_jobrun"):
        return render(request, "forbidden.html", status=403)
    filters = {k: request.GET.get(k, "").strip()[:200] for k in ("action", "actor", "q")}
    entries, nxt = audit_page(
        action=filters["action"],
        actor=filters["actor"],
        text=filters["q"],
        before=positive_int(request.GET.get("before"), None),
    )
    _link_targets(entries)
    for e in entries:
        e.runs = run_links(e)  # the Target cell links them
    return render(
        request,
        "audit.html",
        {
            "entries": entries,
            "filters": filters,
            "actions": shared_part("audit.actions", audit_actions),
            "next_cursor": nxt,
            "first_page": not request.GET.get("before"),
            "query": query_prefix(filters),
        },
    )


def _link_targets(entries: list[Any]) -> None:
    """Each entry's ``target_link``: the page its target is on ("" for none). Worked out
    here once per page rather than by four template branches and a ``{% url %}`` per
    row (the audit page was the load test's costliest to render)."""
    pages = {
        "dlq.": reverse("dead-letters"),
        "lock.": reverse("locks"),
        "queue.": reverse("workers"),
    }
    repos = reverse("repositories")
    for e in entries:
        prefix = e.action.split(".", 1)[0] + "."
        if prefix == "repo.":
            e.target_link = f"{repos}?{urlencode({'q': e.target})}"
        else:
            e.target_link = pages.get(prefix, "")
