"""The run pages: the Runs screen (the search of ``GET /api/runs`` as a page), one run
with its attempts' traces, and a job id's way to its run. Operations data: the screen
and the run page need ``dashboard.view_jobrun``."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from dashboard.infra import QueueUnavailable
from dashboard.models import JobRun
from dashboard.observability import run_trace
from dashboard.runs import CANCEL_RUN_PERMISSION, CANCELLABLE, run_waiting, search_runs
from dashboard.web.list_params import positive_int, query_prefix


@login_required
def runs(request: HttpRequest) -> HttpResponse:
    """The Runs screen: the search of ``GET /api/runs`` as a page."""
    if not request.user.has_perm("dashboard.view_jobrun"):
        return render(request, "forbidden.html", status=403)
    filters = {k: request.GET.get(k, "").strip()[:200] for k in ("state", "kind", "repo", "q")}
    if filters["state"] not in JobRun.State.values:
        filters["state"] = ""
    if filters["kind"] not in JobRun.Kind.values:
        filters["kind"] = ""
    if positive_int(filters["repo"], None) is None:  # "²" and 30 digits too
        filters["repo"] = ""
    rows, nxt = search_runs(
        state=filters["state"],
        kind=filters["kind"],
        repo=int(filters["repo"]) if filters["repo"] else None,
        text=filters["q"],
        before=positive_int(request.GET.get("before"), None),
    )
    return render(
        request,
        "runs.html",
        {
            "runs": rows,
            "filters": filters,
            "states": JobRun.State.values,
            "kinds": JobRun.Kind.values,
            "next_cursor": nxt,
            "first_page": not request.GET.get("before"),
            "query": query_prefix(filters),
        },
    )


@login_required
def run(request: HttpRequest, run_id: int) -> HttpResponse:
    """One run: its attempts, each with its trace as a timeline
    (``dashboard.observability.traces``).
    Operations data: needs ``dashboard.view_jobrun``."""
    if not request.user.has_perm("dashboard.view_jobrun"):
        return render(request, "forbidden.html", status=403)
    found = JobRun.objects.select_related("repository", "chunk").filter(pk=run_id).first()
    if found is None:
        raise Http404("run not found")
    can_cancel = found.state in CANCELLABLE and request.user.has_perm(CANCEL_RUN_PERMISSION)
    try:
        waiting = run_waiting(found)
    except QueueUnavailable:  # the banner says the queue server is down
        waiting = None
    return render(
        request,
        "run.html",
        {"run": run_trace(found), "can_cancel": can_cancel, "waiting": waiting},
    )


@login_required
def run_by_job(request: HttpRequest, job_id: str) -> HttpResponse:
    """A job id (lock holders, workers' current jobs) → its run page."""
    found = JobRun.objects.filter(job_id=job_id).values_list("pk", flat=True).first()
    if found is None:
        raise Http404("run not found")
    return redirect("run", run_id=found)
