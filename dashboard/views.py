"""Server-rendered pages; thin over the domain modules."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_http_methods

from dashboard.audit import audit_actions, audit_page, record_audit, run_links
from dashboard.charts import day_charts, history_bars, sparklines
from dashboard.checklists import rollout_checklist
from dashboard.commitdetails import repository_mirror
from dashboard.commits import BadCursor, commit_page
from dashboard.deadletters import group_page
from dashboard.forms import RolloutActionForm, StartRolloutForm, SubmitRepositoryForm
from dashboard.models import AnalyzerVersion, JobRun, Repository, Rollout
from dashboard.queues import RedisUnavailable
from dashboard.ratelimits import check
from dashboard.readiness import check_readiness
from dashboard.reanalysis import may_reanalyse
from dashboard.repositories import (
    InvalidRemote,
    current_fingerprint,
    repository_list,
    repository_rows,
    repository_with_status,
    submit_repository,
)
from dashboard.rolloutboard import (
    PERMISSION,
    VERBS,
    canary_offers,
    checklist_blocks,
    dead_letter_offers,
    label,
    perform,
    permitted,
    retire,
    rollout_view,
    rollouts_page,
)
from dashboard.rollouts import RolloutError, start_rollout
from dashboard.runs import search_runs
from dashboard.samples import day_series
from dashboard.snapshots import ops_snapshot, repository_live, shared_part
from dashboard.summaries import repository_summary
from dashboard.traces import run_trace
from dashboard.warming import record_view

log = logging.getLogger(__name__)


def _ops_page(request: HttpRequest, template: str, **extra: Any) -> HttpResponse:
    """An operations page: server-rendered from a snapshot, then kept live by the
    websocket. Needs ``dashboard.view_jobrun`` like the socket itself."""
    if not request.user.has_perm("dashboard.view_jobrun"):
        return render(request, "forbidden.html", status=403)
    socket = "/ws/ops/?dlq=groups" if template == "dead_letters.html" else "/ws/ops/"
    context: dict[str, Any] = {"live_socket": socket, **extra}
    if template == "dead_letters.html":
        text = request.GET.get("q", "").strip()[:200]
        context["dlq_filter"] = text
        page = _int(request.GET.get("page"), 1)
        if not text and page <= 5:  # the same for every operator: shared (see shared_part)
            context["dlq_page"] = shared_part(("dlq_page", page), lambda: group_page(page=page))
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
        day=shared_part("overview.day", lambda: day_charts(day_series())),
        rollback_offers=offers,
        can_rollback=permitted(request.user, "rollback"),
    )


@login_required
def locks(request: HttpRequest) -> HttpResponse:
    return _ops_page(request, "locks.html")


@login_required
def workers(request: HttpRequest) -> HttpResponse:
    return _ops_page(request, "workers.html")


@login_required
def dead_letters(request: HttpRequest) -> HttpResponse:
    return _ops_page(request, "dead_letters.html")


def _int(raw: str | None, default: int | None) -> Any:
    """A positive integer query parameter; ``default`` when absent or malformed (a
    hand-edited cursor shows the first page rather than an error page)."""
    if raw and raw.isdigit() and 0 < int(raw) < 2**62:
        return int(raw)
    return default


@login_required
def audit(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm("dashboard.view_jobrun"):
        return render(request, "forbidden.html", status=403)
    filters = {k: request.GET.get(k, "").strip()[:200] for k in ("action", "actor", "q")}
    entries, nxt = audit_page(
        action=filters["action"],
        actor=filters["actor"],
        text=filters["q"],
        before=_int(request.GET.get("before"), None),
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
            "query": _query(filters),
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


def _query(filters: dict[str, str]) -> str:
    """The filters as a query string prefix for pager links (``a=1&b=2&`` or ``""``)."""
    pairs = QueryDict(mutable=True)
    for k, v in filters.items():
        if v:
            pairs[k] = v
    return pairs.urlencode() + "&" if pairs else ""


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
    if not filters["repo"].isdigit():
        filters["repo"] = ""
    rows, nxt = search_runs(
        state=filters["state"],
        kind=filters["kind"],
        repo=int(filters["repo"]) if filters["repo"] else None,
        text=filters["q"],
        before=_int(request.GET.get("before"), None),
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
            "query": _query(filters),
        },
    )


def _repo_list_context(request: HttpRequest) -> dict[str, Any]:
    filters = {k: request.GET.get(k, "").strip()[:200] for k in ("q", "status")}
    if filters["status"] not in Repository.Status.values:
        filters["status"] = ""
    rows, nxt = repository_list(
        text=filters["q"], status=filters["status"], before=_int(request.GET.get("before"), None)
    )
    return {
        "repositories": rows,
        "filters": filters,
        "statuses": Repository.Status.values,
        "next_cursor": nxt,
        "first_page": not request.GET.get("before"),
        "query": _query(filters),
    }


@login_required
@require_http_methods(["GET", "POST"])
def repositories(request: HttpRequest) -> HttpResponse:
    form = SubmitRepositoryForm(request.POST or None)
    if request.method == "POST":
        verdict = check("submit", request.user)
        if not verdict.allowed:
            form.is_valid()
            form.add_error(
                None,
                f"Too many submissions: at most {verdict.limit} per minute. "
                f"Try again in {verdict.retry_after} s.",
            )
            response = render(
                request,
                "repositories.html",
                {"form": form, **_repo_list_context(request)},
                status=429,
            )
            response["Retry-After"] = str(verdict.retry_after)
            return response
    if request.method == "POST" and form.is_valid():
        try:
            repo, created = submit_repository(
                url=form.cleaned_data["url"], branch=form.cleaned_data["branch"], user=request.user
            )
        except InvalidRemote as exc:
            form.add_error("url", str(exc))
        except RedisUnavailable as exc:
            form.add_error(None, str(exc))
        else:
            if created:
                messages.success(request, f"Submitted {repo.name}; analysis queued.")
            else:
                messages.info(request, f"{repo.name} was already submitted.")
            return redirect("repository", repo_id=repo.pk)
    status_code = 400 if request.method == "POST" else 200
    return render(
        request,
        "repositories.html",
        {"form": form, **_repo_list_context(request)},
        status=status_code,
    )


@login_required
def repository(request: HttpRequest, repo_id: int) -> HttpResponse:
    fp = current_fingerprint()
    # The row, its stored-commit count and chunk counts in one query; the summary's
    # freshness check and the live panel reuse ``state`` (same fingerprint: one read).
    found = repository_with_status(repo_id, fingerprint=fp)
    if found is None:
        raise Http404("repository not found")
    repo, state = found
    record_view(repo.pk)  # the rollout warm set starts from the most-viewed repositories
    summary = repository_summary(repo, fp, stored=state["commits_analyzed"])
    try:
        commits, nxt = commit_page(repo, fingerprint=fp, limit=50, cursor=request.GET.get("cursor"))
    except BadCursor:
        commits, nxt = commit_page(repo, fingerprint=fp, limit=50)
    return render(
        request,
        "repository.html",
        {
            "live_socket": f"/ws/repos/{repo.pk}/",
            "live": repository_live(repo.pk, repo=repo, state=state),
            "repo": repo,
            "state": state,
            "summary": summary,
            "chart": history_bars(summary["weekly"]),
            "lines_chart": history_bars(
                [
                    {"week": w["week"], "lines": w.get("insertions", 0) + w.get("deletions", 0)}
                    for w in summary["weekly"]
                ],
                field="lines",
                unit="line",
            ),
            "commits": commits,
            "next_cursor": nxt,
            "first_page": not request.GET.get("cursor"),
            "recent_runs": _recent_runs(request, repo),
            "mirror": repository_mirror(repo),  # this host's mirror, read by GitPython
            "can_reanalyse": may_reanalyse(request.user),
        },
    )


FAVICON = Path(__file__).resolve().parent / "static" / "favicon.svg"


def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico`` for browsers that ask before reading the page's icon link."""
    response = HttpResponse(FAVICON.read_bytes(), content_type="image/svg+xml")
    response["Cache-Control"] = "public, max-age=86400"
    return response


def _recent_runs(request: HttpRequest, repo: Repository) -> list[JobRun]:
    """The repository's last runs, linked to their run pages (operators only)."""
    if not request.user.has_perm("dashboard.view_jobrun"):
        return []
    return search_runs(repo=repo.pk, limit=10)[0]


def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", content_type="text/plain")


def readyz(request: HttpRequest) -> HttpResponse:
    """Readiness (``dashboard.readiness``): 200 when the database is migrated and a
    majority of lock masters and the queue Redis answer, else 503; the JSON body names
    every check and what failed. Anonymous, like ``/healthz``: it reveals no more than
    which dependency is down (host:port, never a password)."""
    readiness = check_readiness(timeout=0.5)
    return JsonResponse(readiness.as_dict(), status=200 if readiness.ready else 503)


@login_required
def run(request: HttpRequest, run_id: int) -> HttpResponse:
    """One run: its attempts, each with its trace as a timeline (``dashboard.traces``).
    Operations data: needs ``dashboard.view_jobrun``."""
    if not request.user.has_perm("dashboard.view_jobrun"):
        return render(request, "forbidden.html", status=403)
    found = JobRun.objects.select_related("repository").filter(pk=run_id).first()
    if found is None:
        raise Http404("run not found")
    return render(request, "run.html", {"run": run_trace(found)})


@login_required
def run_by_job(request: HttpRequest, job_id: str) -> HttpResponse:
    """A job id (lock holders, workers' current jobs) → its run page."""
    found = JobRun.objects.filter(job_id=job_id).values_list("pk", flat=True).first()
    if found is None:
        raise Http404("run not found")
    return redirect("run", run_id=found)


# ---------------------------------------------------------------------------- rollouts


def _can(user: Any) -> dict[str, bool]:
    return {verb: permitted(user, verb) for verb in PERMISSION}


def _rollouts_context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    context: dict[str, Any] = {"live_socket": "/ws/rollouts/", "can": _can(request.user), **extra}
    try:
        context.update(rollouts_page())
    except RedisUnavailable as exc:  # the deploy lock's holder cannot be read
        context["redis_error"] = str(exc)
    return context


@login_required
def rollouts_index(request: HttpRequest) -> HttpResponse:
    """Versions and states per queue, workers per version, each queue's latest rollout
    (warming progress, gate verdict, result diff, timeline, checklist, buttons)."""
    if not request.user.has_perm("dashboard.view_jobrun"):
        return render(request, "forbidden.html", status=403)
    form = StartRolloutForm()
    return render(request, "rollouts.html", _rollouts_context(request, form=form))


def _refuse(request: HttpRequest, verb: str, target: str) -> HttpResponse:
    record_audit(
        user=request.user,
        action=f"rollout.page.{verb}",
        target=target,
        outcome="refused: permission denied",
    )
    return render(request, "forbidden.html", status=403)


@login_required
@require_http_methods(["POST"])
def rollout_start(request: HttpRequest) -> HttpResponse:
    """Start a rollout from the page's form (``dashboard.start_rollout``); the driver is
    enqueued after commit. Bad input re-renders the form with field errors (400); a
    refusal (the queue is busy, the config is already current) is a form error (409)."""
    if not permitted(request.user, "start"):
        return _refuse(request, "start", "rollouts")
    form = StartRolloutForm(request.POST)
    status = 400
    if form.is_valid():
        data = form.cleaned_data
        reason = data.get("reason") or ""
        detail = {"config": data["config"], "steps": data["steps"], "auto": data["auto"],
                  "reason": reason}  # fmt: skip
        try:
            ro = start_rollout(
                queue=data["queue"],
                config=data["config"],
                steps=data["steps"],
                auto=data["auto"],
                actor=request.user,
            )
        except RolloutError as exc:
            form.add_error(None, str(exc))
            record_audit(user=request.user, action="rollout.page.start", target=data["queue"],
                         outcome=f"refused: {exc}", detail=detail)  # fmt: skip
            status = 409
        except RedisUnavailable as exc:
            form.add_error(None, str(exc))
            status = 503
        else:
            record_audit(
                user=request.user,
                action="rollout.page.start",
                target=f"rollout #{ro.pk} {ro.queue}@{ro.version.fp12}",
                outcome="started; its driver takes the deploy lock",
                detail=detail,
            )
            messages.success(request, f"Rollout #{ro.pk} of {label(ro.version)} started.")
            return redirect("rollout", rollout_id=ro.pk)
    return render(request, "rollouts.html", _rollouts_context(request, form=form), status=status)


def _rollout_or_404(rollout_id: int) -> Rollout:
    ro = Rollout.objects.select_related("version", "previous").filter(pk=rollout_id).first()
    if ro is None:
        raise Http404("rollout not found")
    return ro


@login_required
def rollout_detail(request: HttpRequest, rollout_id: int) -> HttpResponse:
    if not request.user.has_perm("dashboard.view_jobrun"):
        return render(request, "forbidden.html", status=403)
    ro = _rollout_or_404(rollout_id)
    context: dict[str, Any] = {"live_socket": "/ws/rollouts/", "can": _can(request.user)}
    try:
        context["r"] = rollout_view(ro)
        context["checklist_blocks"] = checklist_blocks(rollout_checklist(ro))
    except RedisUnavailable as exc:
        context["redis_error"] = str(exc)
    return render(request, "rollouts_detail.html", context)


@login_required
def rollout_checklist_md(request: HttpRequest, rollout_id: int) -> HttpResponse:
    """The release checklist as a Markdown download (``manage.py rollout checklist``)."""
    if not request.user.has_perm("dashboard.view_jobrun"):
        return render(request, "forbidden.html", status=403)
    ro = _rollout_or_404(rollout_id)
    response = HttpResponse(rollout_checklist(ro), content_type="text/markdown; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="rollout-{ro.pk}-checklist.md"'
    return response


def _back(request: HttpRequest, default: str) -> str:
    target = str(request.POST.get("next") or "")
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return default


@login_required
@require_http_methods(["POST"])
def rollout_action(request: HttpRequest, rollout_id: int, verb: str) -> HttpResponse:
    """One button (promote, set_ramp, rollback, abort, takeover) after its confirm step;
    permission-checked, audited with the operator's reason, then back to the page."""
    if verb not in VERBS:
        raise Http404("no such rollout action")
    if not permitted(request.user, verb):
        return _refuse(request, verb, f"rollout #{rollout_id}")
    ro = _rollout_or_404(rollout_id)
    back = _back(request, reverse("rollout", args=[ro.pk]))
    form = RolloutActionForm(request.POST)
    if form.is_valid() and verb == "set_ramp" and not form.cleaned_data.get("percent"):
        form.add_error("percent", "Give the ramp percentage (1..100).")
    if not form.is_valid():
        context: dict[str, Any] = {"live_socket": "/ws/rollouts/", "can": _can(request.user),
                                   "action_form": form, "failed_verb": verb}  # fmt: skip
        try:
            context["r"] = rollout_view(ro)
            context["checklist_blocks"] = checklist_blocks(rollout_checklist(ro))
        except RedisUnavailable as exc:
            context["redis_error"] = str(exc)
        return render(request, "rollouts_detail.html", context, status=400)
    try:
        outcome = perform(
            rollout=ro,
            verb=verb,
            user=request.user,
            reason=form.cleaned_data.get("reason") or "",
            percent=form.cleaned_data.get("percent"),
        )
    except (RolloutError, RedisUnavailable) as exc:
        messages.error(request, f"{verb.replace('_', ' ').capitalize()} refused: {exc}")
    except Exception:  # e.g. Redis masters unreachable mid-way: said, logged, never a 500
        log.exception("rollout #%s: %s failed", ro.pk, verb)
        messages.error(
            request, f"{verb.replace('_', ' ').capitalize()} failed; the error was logged."
        )
    else:
        messages.success(request, f"Rollout #{ro.pk}: {outcome}.")
    return redirect(back)


@login_required
@require_http_methods(["POST"])
def version_retire(request: HttpRequest, version_id: int) -> HttpResponse:
    """The Versions table's Retire button after its confirm step (drained | warm_failed
    → retired): permission-checked, audited with the reason, then back to the page; a
    state that allows no retirement is said in the page's error message."""
    if not permitted(request.user, "retire"):
        return _refuse(request, "retire", f"version #{version_id}")
    version = AnalyzerVersion.objects.filter(pk=version_id).first()
    if version is None:
        raise Http404("version not found")
    back = _back(request, reverse("rollouts"))
    form = RolloutActionForm(request.POST)
    if not form.is_valid():  # only the reason can be wrong: too long
        messages.error(request, "Retire refused: the reason is at most 500 characters.")
        return redirect(back)
    try:
        outcome = retire(version=version, user=request.user, reason=form.cleaned_data["reason"])
    except RolloutError as exc:
        messages.error(request, f"Retire refused: {exc}")
    else:
        messages.success(request, f"Version {outcome}.")
    return redirect(back)


@login_required
def rollout_offers(request: HttpRequest) -> HttpResponse:
    """JSON for the live pages: dead-letter group → its "roll back to V" offer, and the
    overview's canary offers; ``can_rollback`` says whether to draw the buttons."""
    if not request.user.has_perm("dashboard.view_jobrun"):
        return JsonResponse({"error": "operations data needs the view_jobrun permission"},
                            status=403)  # fmt: skip
    try:
        groups, canary = dead_letter_offers(), canary_offers()
    except RedisUnavailable as exc:
        return JsonResponse({"error": str(exc)}, status=503)
    return JsonResponse(
        {"groups": groups, "canary": canary, "can_rollback": permitted(request.user, "rollback")}
    )
