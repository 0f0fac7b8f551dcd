"""JSON API (DESIGN §10): session or ``Authorization: Bearer <token>``.

Errors are JSON ``{"error": message}`` with a 4xx status; unexpected failures are
logged and answered with a generic JSON error, never a traceback.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.defaults import page_not_found

from dashboard import queues
from dashboard.audit import record_audit
from dashboard.checklists import describe_rollout
from dashboard.commits import BadCursor, commit_dict, commit_page
from dashboard.deadletters import act_now, group_runs, list_groups, run_dict, start_bulk
from dashboard.deploylock import abort_rollout, driver_alive, rollback_rollout
from dashboard.leases import force_release_lock
from dashboard.live import publish_event
from dashboard.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from dashboard.metrics import metrics_text
from dashboard.models import ApiToken, BulkAction, JobRun, Repository, Rollout
from dashboard.queues import RedisUnavailable
from dashboard.ratelimits import check
from dashboard.repositories import (
    InvalidRemote,
    current_fingerprint,
    repository_status,
    submit_repository,
)
from dashboard.rollouts import QUEUE as ROLLOUT_QUEUE
from dashboard.rollouts import (
    RolloutBusy,
    RolloutError,
    actor_name,
    enqueue_driver_job,
    request_action,
    start_rollout,
)
from dashboard.snapshots import ops_snapshot
from dashboard.summaries import repository_summary
from dashboard.traces import run_trace
from workers import lockkeys

log = logging.getLogger(__name__)


def error(message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def _bearer_user(request: HttpRequest) -> Any:
    header = request.headers.get("Authorization", "")
    if not header:
        return None
    scheme, _, raw = header.partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        return False
    token = (
        ApiToken.objects.select_related("user").filter(digest=ApiToken.hash(raw.strip())).first()
    )
    if token is None or not token.user.is_active:
        return False
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token.user


def api_view(
    methods: tuple[str, ...],
) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Authenticate (bearer token, else session + CSRF for unsafe methods), check the
    method, and turn every expected failure into a JSON 4xx."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @csrf_exempt
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in methods:
                response = error(f"method {request.method} not allowed", 405)
                response["Allow"] = ", ".join(methods)
                return response
            user = _bearer_user(request)
            if user is False:
                return error("invalid API token", 401)
            if user is None:
                if not request.user.is_authenticated:
                    return error("authentication required", 401)
                if request.method not in {"GET", "HEAD", "OPTIONS"}:
                    # Session-authenticated writes need the CSRF token like any form.
                    rejected = CsrfViewMiddleware(lambda r: HttpResponse()).process_view(
                        request, None, (), {}
                    )
                    if rejected is not None:
                        return error("CSRF verification failed", 403)
            else:
                request.user = user
            limited = _rate_limited(request, "api")
            if limited is not None:
                return limited
            try:
                return view(request, *args, **kwargs)
            except RedisUnavailable as exc:
                return error(str(exc), 503)
            except (redis.ConnectionError, redis.TimeoutError) as exc:  # a lock master
                log.warning("Redis unreachable on %s: %s", request.path, exc)
                return error(f"Redis unreachable: {type(exc).__name__}", 503)
            except Exception:
                log.exception("API error on %s", request.path)
                return error("internal error; the failure was logged", 500)

        return wrapper

    return decorate


def _rate_limited(request: HttpRequest, scope: str) -> JsonResponse | None:
    """A JSON 429 with Retry-After when the user is over the scope's limit."""

    verdict = check(scope, request.user)
    if verdict.allowed:
        return None
    what = "submissions" if scope == "submit" else "API requests"
    response = error(f"too many {what}: at most {verdict.limit} per minute", 429)
    response["Retry-After"] = str(verdict.retry_after)
    return response


def _json_body(request: HttpRequest) -> dict[str, Any]:
    if request.content_type == "application/json":
        try:
            data = json.loads(request.body or b"{}")
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError("request body is not valid JSON") from exc
        if not isinstance(data, dict):
            raise ValueError("request body must be a JSON object")
        return data
    return {k: v for k, v in request.POST.items()}


@api_view(("POST",))
def repos(request: HttpRequest) -> HttpResponse:
    limited = _rate_limited(request, "submit")
    if limited is not None:
        return limited
    try:
        data = _json_body(request)
    except ValueError as exc:
        return error(str(exc), 400)
    url = data.get("url")
    branch = data.get("branch")
    if not isinstance(url, str) or not url.strip():
        return error("url is required", 400)
    if branch is not None and not isinstance(branch, str):
        return error("branch must be a string", 400)
    try:
        repo, created = submit_repository(url=url, branch=branch, user=request.user)
    except InvalidRemote as exc:
        return error(str(exc), 400)
    return JsonResponse(repository_status(repo), status=202 if created else 200)


def _repo_or_404(repo_id: int) -> Repository | None:
    return Repository.objects.filter(pk=repo_id).first()


@api_view(("GET",))
def repo_detail(request: HttpRequest, repo_id: int) -> HttpResponse:
    repo = _repo_or_404(repo_id)
    if repo is None:
        return error("repository not found", 404)
    body = repository_status(repo)
    if request.GET.get("summary") in {"1", "true"}:
        body["summary"] = repository_summary(repo, current_fingerprint())
    return JsonResponse(body)


@api_view(("GET",))
def repo_commits(request: HttpRequest, repo_id: int) -> HttpResponse:
    repo = _repo_or_404(repo_id)
    if repo is None:
        return error("repository not found", 404)
    raw_limit = request.GET.get("limit", "50")
    try:
        limit = int(raw_limit)
    except ValueError:
        return error("limit must be an integer", 400)
    if not 1 <= limit <= 1000:
        return error("limit must be between 1 and 1000", 400)
    try:
        rows, nxt = commit_page(
            repo,
            fingerprint=current_fingerprint(),
            limit=limit,
            cursor=request.GET.get("cursor") or None,
            with_files=request.GET.get("files") in {"1", "true"},
        )
    except BadCursor:
        return error("invalid cursor", 400)
    results = [commit_dict(c, getattr(c, "file_rows", None)) for c in rows]
    return JsonResponse({"results": results, "next": nxt})


@api_view(("GET",))
def status(request: HttpRequest) -> HttpResponse:

    if (refused := _operator(request)) is not None:
        return refused
    return JsonResponse(ops_snapshot(user=request.user))


@api_view(("POST",))
def lock_release(request: HttpRequest) -> HttpResponse:
    """Force-release a lock (staff with ``dashboard.force_release_lock``); the fencing
    token is bumped so the old holder's later writes are rejected. Audited."""

    if not _permitted(request, "dashboard.force_release_lock"):
        record_audit(
            user=request.user,
            action="lock.force_release",
            target=request.path,
            outcome="refused: permission denied",
        )
        return error("you do not have permission to force-release locks", 403)
    try:
        data = _json_body(request)
    except ValueError as exc:
        return error(str(exc), 400)
    key = data.get("key")
    if not isinstance(key, str) or not key.startswith(lockkeys.PREFIX) or len(key) > 255:
        return error(f'"key" must be a lock key ({lockkeys.PREFIX}…)', 400)
    return JsonResponse(force_release_lock(key=key, user=request.user))


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return error("not found", 404)

    return page_not_found(request, exception or Exception())


# ---------------------------------------------------------------------------- DLQ


def _operator(request: HttpRequest) -> JsonResponse | None:
    """Operations data (locks, workers, dead letters with tracebacks) is for operators:
    the same ``dashboard.view_jobrun`` the pages and the websocket require."""
    if request.user.has_perm("dashboard.view_jobrun"):
        return None
    return error("operations data needs the view_jobrun permission", 403)


def _permitted(request: HttpRequest, perm: str) -> bool:
    """Operator actions need staff status *and* the explicit permission."""
    user = request.user
    return bool(user.is_active and user.is_staff and user.has_perm(perm))


@api_view(("GET",))
def dlq(request: HttpRequest) -> HttpResponse:

    if (refused := _operator(request)) is not None:
        return refused
    groups = list_groups()
    return JsonResponse({"groups": groups, "dead": sum(g["count"] for g in groups)})


@api_view(("GET",))
def dlq_group(request: HttpRequest, group: str) -> HttpResponse:

    if (refused := _operator(request)) is not None:
        return refused
    runs = group_runs(group, limit=_int_param(request, "limit", 50, 1, 500))
    if not runs:
        return error("no dead letters in that group", 404)
    return JsonResponse({"group": group, "runs": runs})


def _int_param(request: HttpRequest, name: str, default: int, lo: int, hi: int) -> int:
    try:
        value = int(request.GET.get(name, default))
    except ValueError:
        return default
    return max(lo, min(hi, value))


def _dlq_action(request: HttpRequest, kind: str) -> HttpResponse:

    if not _permitted(request, f"dashboard.{kind}_jobrun"):
        record_audit(
            user=request.user,
            action=f"dlq.{kind}",
            target=request.path,
            outcome="refused: permission denied",
        )
        return error(f"you do not have permission to {kind} dead letters", 403)
    try:
        data = _json_body(request)
    except ValueError as exc:
        return error(str(exc), 400)
    runs, group, every = data.get("runs"), data.get("group"), data.get("all") is True
    if sum([runs is not None, group is not None, every]) != 1:
        return error('give exactly one of "runs": [ids], "group": key, "all": true', 400)
    if runs is not None:
        if (
            not isinstance(runs, list)
            or not runs
            or not all(isinstance(r, int) and not isinstance(r, bool) for r in runs)
        ):
            return error('"runs" must be a non-empty list of run ids', 400)
        if len(runs) > 100:
            return error('more than 100 runs: use "group" or "all" (a tracked bulk action)', 400)
        return JsonResponse({"moved": act_now(kind=kind, run_ids=runs, user=request.user)})
    if group is not None and (not isinstance(group, str) or not group.isalnum()):
        return error('"group" must be a group key from GET /api/dlq', 400)
    selector = {"group": group} if group is not None else {"all": True}
    action = start_bulk(kind=kind, selector=selector, user=request.user)
    return JsonResponse(_action_dict(action), status=202)


@api_view(("POST",))
def dlq_retry(request: HttpRequest) -> HttpResponse:
    return _dlq_action(request, "retry")


@api_view(("POST",))
def dlq_discard(request: HttpRequest) -> HttpResponse:
    return _dlq_action(request, "discard")


def _action_dict(action: Any) -> dict[str, Any]:
    return {
        "id": action.pk,
        "kind": action.kind,
        "selector": action.selector,
        "state": action.state,
        "total": action.total,
        "done": action.done,
        "error": action.error or None,
    }


@api_view(("GET",))
def bulk_action(request: HttpRequest, action_id: int) -> HttpResponse:

    if (refused := _operator(request)) is not None:
        return refused
    action = BulkAction.objects.filter(pk=action_id).first()
    if action is None:
        return error("action not found", 404)
    return JsonResponse(_action_dict(action))


@api_view(("GET",))
def _metrics_for_operators(request: HttpRequest) -> HttpResponse:
    if (refused := _operator(request)) is not None:
        return refused
    return HttpResponse(metrics_text(), content_type=METRICS_CONTENT_TYPE)


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape endpoint: a client in ``GITWARD_METRICS_NETWORKS`` (by
    REMOTE_ADDR, so behind a proxy list the proxy only if it does not forward the public
    to /metrics), else an operator's session or bearer token (``view_jobrun``)."""
    if request.method == "GET" and _in_networks(request.META.get("REMOTE_ADDR", "")):
        try:
            return HttpResponse(metrics_text(), content_type=METRICS_CONTENT_TYPE)
        except RedisUnavailable as exc:
            return error(str(exc), 503)
    return _metrics_for_operators(request)


def _in_networks(addr: str) -> bool:
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(net) for net in settings.METRICS_NETWORKS)


def _pause(request: HttpRequest, paused: bool) -> HttpResponse:

    verb = "pause" if paused else "resume"
    if not _permitted(request, "dashboard.pause_queue"):
        record_audit(
            user=request.user,
            action=f"queue.{verb}",
            target=request.path,
            outcome="refused: permission denied",
        )
        return error(f"you do not have permission to {verb} queues", 403)
    try:
        name = _json_body(request).get("queue")
    except ValueError as exc:
        return error(str(exc), 400)
    if name not in queues.queue_names():
        return error(f'"queue" must be one of {", ".join(queues.queue_names())}', 400)
    changed = queues.set_paused(name, paused)
    record_audit(
        user=request.user,
        action=f"queue.{verb}",
        target=name,
        outcome="done" if changed else "no change",
    )

    publish_event("job.queued", {"queue": name, "paused": paused})
    return JsonResponse({"queue": name, "paused": paused, "changed": changed})


@api_view(("POST",))
def queue_pause(request: HttpRequest) -> HttpResponse:
    return _pause(request, True)


@api_view(("POST",))
def queue_resume(request: HttpRequest) -> HttpResponse:
    return _pause(request, False)


@api_view(("GET",))
def runs(request: HttpRequest) -> HttpResponse:
    """Search job runs: ``state``, ``kind``, ``repo`` (id), ``q`` (text in job id, cause,
    error, repository URL), newest first, keyset-paginated with ``before`` (a run id)."""

    if (refused := _operator(request)) is not None:
        return refused
    qs = JobRun.objects.select_related("repository")
    state, kind = request.GET.get("state"), request.GET.get("kind")
    if state:
        if state not in JobRun.State.values:
            return error(f"state must be one of {', '.join(JobRun.State.values)}", 400)
        qs = qs.filter(state=state)
    if kind:
        if kind not in JobRun.Kind.values:
            return error(f"kind must be one of {', '.join(JobRun.Kind.values)}", 400)
        qs = qs.filter(kind=kind)
    for name in ("repo", "before"):
        raw = request.GET.get(name)
        if raw and not raw.isdigit():
            return error(f"{name} must be an integer", 400)
    if request.GET.get("repo"):
        qs = qs.filter(repository_id=int(request.GET["repo"]))
    if request.GET.get("before"):
        qs = qs.filter(pk__lt=int(request.GET["before"]))
    text = request.GET.get("q", "").strip()[:200]
    if text:
        qs = qs.filter(
            Q(job_id__icontains=text)
            | Q(cause__icontains=text)
            | Q(error__icontains=text)
            | Q(repository__url__icontains=text)
        )
    limit = _int_param(request, "limit", 50, 1, 200)
    rows = list(qs.order_by("-pk")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return JsonResponse(
        {"results": [run_dict(r) for r in rows], "next": rows[-1].pk if more and rows else None}
    )


# ---------------------------------------------------------------------------- rollouts
# POST /api/rollouts starts one (CI after a merge), GET lists them; the actions go to
# the rollout's driver or, for a dead driver, take the deploy lock here
# (dashboard.deploylock). Every refusal is audited; accepted actions are audited by the
# rollout's own timeline (rollouts.record_event writes an AuditEntry per event).

ROLLOUT_ACTIONS = {
    "promote": "dashboard.start_rollout",
    "rollback": "dashboard.rollback_rollout",
    "abort": "dashboard.rollback_rollout",
    "takeover": "dashboard.rollback_rollout",
}
_ROLLOUT_VIEWERS = (
    "dashboard.view_jobrun",
    "dashboard.start_rollout",
    "dashboard.rollback_rollout",
)


def _refuse_rollout(
    request: HttpRequest, action: str, target: str, why: str, status: int
) -> JsonResponse:
    record_audit(
        user=request.user, action=f"rollout.{action}", target=target, outcome=f"refused: {why}"
    )
    return error(why, status)


def _rollout_reader(request: HttpRequest) -> JsonResponse | None:
    if any(request.user.has_perm(p) for p in _ROLLOUT_VIEWERS):
        return None
    return error("rollouts need the view_jobrun, start_rollout or rollback_rollout permission", 403)


@api_view(("GET", "POST"))
def rollouts_collection(request: HttpRequest) -> HttpResponse:
    """``GET`` → ``{"rollouts": [...]}`` (newest first, ``?queue=``, ``?limit=``);
    ``POST {queue?, config, steps?, auto?, warm_set?, options?}`` → 202 ``{id, state,
    rollout}``: the rollout is pending until its driver (the ``rollouts`` queue) takes
    the deploy lock; poll ``GET /api/rollouts/<id>``."""
    if request.method == "GET":
        if (refused := _rollout_reader(request)) is not None:
            return refused
        rows = Rollout.objects.select_related("version", "previous").order_by("-created_at", "-id")
        if request.GET.get("queue"):
            rows = rows.filter(queue=request.GET["queue"])
        limit = _int_param(request, "limit", 50, 1, 200)
        return JsonResponse({"rollouts": [describe_rollout(r) for r in rows[:limit]]})
    if not _permitted(request, "dashboard.start_rollout"):
        return _refuse_rollout(
            request, "start", request.path, "you do not have permission to start rollouts", 403
        )
    limited = _rate_limited(request, "submit")
    if limited is not None:
        return limited
    try:
        data = _json_body(request)
        spec = _rollout_spec(data)
    except ValueError as exc:
        return _refuse_rollout(request, "start", request.path, str(exc), 400)
    try:
        ro = start_rollout(actor=request.user, **spec)
    except RolloutBusy as exc:
        return _refuse_rollout(request, "start", spec["queue"], str(exc), 409)
    except RolloutError as exc:
        return _refuse_rollout(request, "start", spec["queue"], str(exc), 400)
    ro = Rollout.objects.select_related("version", "previous").get(pk=ro.pk)
    return JsonResponse(
        {"id": ro.pk, "state": ro.state, "rollout": describe_rollout(ro)}, status=202
    )


def _rollout_spec(data: dict[str, Any]) -> dict[str, Any]:
    """The body of ``POST /api/rollouts`` checked for shape (values are checked by
    ``start_rollout``): ValueError naming the field otherwise."""
    unknown = sorted(set(data) - {"queue", "config", "steps", "auto", "warm_set", "options"})
    if unknown:
        raise ValueError(f"unknown field(s): {', '.join(unknown)}")
    queue = data.get("queue", ROLLOUT_QUEUE)
    if queue != ROLLOUT_QUEUE:
        raise ValueError(f'"queue" must be {ROLLOUT_QUEUE!r} (the only logical queue)')
    config = data.get("config")
    if not isinstance(config, dict):
        raise ValueError('"config" must be a JSON object, e.g. {"detect_renames": true}')
    steps = data.get("steps")
    if steps is not None and not (
        isinstance(steps, list)
        and all(isinstance(s, int) and not isinstance(s, bool) for s in steps)
    ):
        raise ValueError('"steps" must be a list of percentages, e.g. [10, 50, 100]')
    auto = data.get("auto", False)
    if not isinstance(auto, bool):
        raise ValueError('"auto" must be true or false')
    for name in ("warm_set", "options"):
        if not isinstance(data.get(name, {}), dict):
            raise ValueError(f'"{name}" must be a JSON object')
    return {
        "queue": queue,
        "config": config,
        "steps": steps,
        "auto": auto,
        "warm_set": _warm_spec(data.get("warm_set") or {}),
        "options": data.get("options") or {},
    }


def _warm_spec(spec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("repositories", "commits_per_repository"):
        if key in spec:
            value = spec[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f'"warm_set.{key}" must be a positive integer')
            out[key] = value
    if "threshold" in spec:
        value = spec["threshold"]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            raise ValueError('"warm_set.threshold" must be a number in (0, 1]')
        out["threshold"] = float(value)
    unknown = sorted(set(spec) - {"repositories", "commits_per_repository", "threshold"})
    if unknown:
        raise ValueError(f"unknown warm_set field(s): {', '.join(unknown)}")
    return out


@api_view(("GET",))
def rollout_detail(request: HttpRequest, rollout_id: int) -> HttpResponse:
    """One rollout with its versions' states and its timeline."""
    if (refused := _rollout_reader(request)) is not None:
        return refused
    ro = Rollout.objects.select_related("version", "previous").filter(pk=rollout_id).first()
    if ro is None:
        return error(f"no rollout #{rollout_id}", 404)
    return JsonResponse(describe_rollout(ro, timeline=True))


@api_view(("POST",))
def rollout_action(request: HttpRequest, rollout_id: int, action: str) -> HttpResponse:
    """``POST /api/rollouts/<id>/promote|rollback|abort|takeover`` ``{reason?, force?}``.

    * promote — asks the driver for the next step (current after the last): 202;
    * rollback — the one button: a live driver is asked (202); a dead one's lock is
      taken here, routing goes back at once and the lock is released (200);
    * abort — for a dead driver (or ``force``): 200;
    * takeover — a dead driver's rollout gets a new driver job on the ``rollouts``
      queue (202); a live one is refused (409).
    """
    target = f"rollout #{rollout_id}"
    perm = ROLLOUT_ACTIONS.get(action)
    if perm is None:
        return error(f"unknown action {action!r}: one of {', '.join(ROLLOUT_ACTIONS)}", 404)
    if not _permitted(request, perm):
        return _refuse_rollout(
            request, action, target, f"you do not have permission to {action} rollouts", 403
        )
    try:
        data = _json_body(request)
    except ValueError as exc:
        return _refuse_rollout(request, action, target, str(exc), 400)
    reason, force = data.get("reason", ""), data.get("force", False)
    if not isinstance(reason, str) or len(reason) > 500:
        return _refuse_rollout(
            request, action, target, '"reason" must be a string (≤ 500 characters)', 400
        )
    if not isinstance(force, bool):
        return _refuse_rollout(request, action, target, '"force" must be true or false', 400)
    ro = Rollout.objects.select_related("version", "previous").filter(pk=rollout_id).first()
    if ro is None:
        return error(f"no rollout #{rollout_id}", 404)
    try:
        ro, status = _run_rollout_action(request, ro, action, reason, force)
    except RolloutBusy as exc:
        return _refuse_rollout(request, action, target, str(exc), 409)
    except RolloutError as exc:
        return _refuse_rollout(request, action, target, str(exc), 409)
    ro = Rollout.objects.select_related("version", "previous").get(pk=ro.pk)
    return JsonResponse(describe_rollout(ro, timeline=True), status=status)


def _run_rollout_action(
    request: HttpRequest, ro: Rollout, action: str, reason: str, force: bool
) -> tuple[Rollout, int]:
    actor = request.user
    if action == "promote":
        return request_action(rollout=ro, action="promote", actor=actor), 202
    if action == "rollback":
        delegated = driver_alive(ro) and not force
        done = rollback_rollout(
            rollout=ro.pk, actor=actor, reason=reason or "rollback", force=force
        )
        return done, 202 if delegated else 200
    if action == "abort":
        return abort_rollout(rollout=ro.pk, actor=actor, reason=reason or "abort", force=force), 200
    if not ro.is_active:
        raise RolloutError(f"rollout #{ro.pk} is {ro.state}: nothing to take over")
    if driver_alive(ro):
        raise RolloutBusy(
            f"rollout #{ro.pk} is still driven by {ro.lock_holder}: nothing to take over"
        )
    if not enqueue_driver_job(ro.pk, takeover=True, actor=actor_name(actor)):
        raise RolloutBusy(f"a takeover driver job of rollout #{ro.pk} exists already")
    record_audit(user=actor, action="rollout.takeover", target=f"rollout #{ro.pk}",
                 outcome="driver job enqueued", detail={"reason": reason})  # fmt: skip
    return ro, 202


@api_view(("GET",))
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    """One run with every attempt and its trace (the run page's data)."""

    if (refused := _operator(request)) is not None:
        return refused
    found = JobRun.objects.select_related("repository").filter(pk=run_id).first()
    if found is None:
        return error("run not found", 404)
    return JsonResponse(run_trace(found))
