"""Rollouts over the API (docs/rollouts.md, docs/api.md).

``POST /api/rollouts`` starts one (CI after a merge), ``GET`` lists them; the actions
go to the rollout's driver or, for a dead driver, take the deploy lock here
(dashboard.rollouts.deploy_lock). ``GET /api/versions`` lists every analyzer version with
its live workers; ``POST /api/versions/<fingerprint>/retire`` ends a registered, drained or
warm-failed version for good. Every refusal is audited; accepted actions are audited by the
rollout's own timeline (rollouts.record_event writes an AuditEntry per event).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from dashboard.accounts import reason_problem, record_audit
from dashboard.api.endpoint import api_view, error, int_param, json_body, permitted, rate_limited
from dashboard.models import Rollout
from dashboard.rollouts import (
    abort_rollout,
    check_applies,
    describe_rollout,
    driver_alive,
    enqueue_driver_job,
    freeze_status,
    notification_status,
    pin_repositories,
    pinned,
    request_action,
    rollback_rollout,
    rollout_freeze,
    set_stop_the_line,
    start_rollout,
    unpin_repositories,
)
from dashboard.versions import QUEUE as ROLLOUT_QUEUE
from dashboard.versions import (
    InvalidTransition,
    RolloutBusy,
    RolloutError,
    VersionNotFound,
    actor_name,
    retire_version,
    version_rows,
)

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
    ``POST {queue?, config | version, steps?, auto?, warm_set?, options?}`` → 202 ``{id,
    state, rollout}`` (``version``: the fingerprint of a known version, a code rollout,
    docs/rollouts.md#code-rollouts-bluegreen; unknown → 404): the rollout is pending
    until its driver (the ``rollouts`` queue) takes the deploy lock; poll ``GET
    /api/rollouts/<id>``."""
    if request.method == "GET":
        if (refused := _rollout_reader(request)) is not None:
            return refused
        rows = Rollout.objects.select_related("version", "previous").order_by("-created_at", "-id")
        if request.GET.get("queue"):
            rows = rows.filter(queue=request.GET["queue"])
        limit = int_param(request, "limit", 50, 1, 200)
        return JsonResponse({"rollouts": [describe_rollout(r) for r in rows[:limit]]})
    if not permitted(request, "dashboard.start_rollout"):
        return _refuse_rollout(
            request, "start", request.path, "you do not have permission to start rollouts", 403
        )
    limited = rate_limited(request, "submit")
    if limited is not None:
        return limited
    try:
        data = json_body(request)
        spec = _rollout_spec(data)
    except ValueError as exc:
        return _refuse_rollout(request, "start", request.path, str(exc), 400)
    try:
        ro = start_rollout(actor=request.user, **spec)
    except VersionNotFound as exc:
        return _refuse_rollout(request, "start", spec["queue"], str(exc), 404)
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
    known = {"queue", "config", "version", "steps", "auto", "warm_set", "options"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown field(s): {', '.join(unknown)}")
    queue = data.get("queue", ROLLOUT_QUEUE)
    if queue != ROLLOUT_QUEUE:
        raise ValueError(f'"queue" must be {ROLLOUT_QUEUE!r} (the only logical queue)')
    config, version = data.get("config"), data.get("version")
    if version is not None:
        if config is not None:
            raise ValueError('give "config" or "version", not both')
        if not isinstance(version, str):
            raise ValueError('"version" must be a fingerprint (a string of hex digits)')
    elif not isinstance(config, dict):
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
        "version": version,
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
    """One rollout with its versions' states and its timeline, the freeze that holds it
    back (``frozen``, or null) and its webhook deliveries per endpoint (``notifications``)."""
    if (refused := _rollout_reader(request)) is not None:
        return refused
    ro = Rollout.objects.select_related("version", "previous").filter(pk=rollout_id).first()
    if ro is None:
        return error(f"no rollout #{rollout_id}", 404)
    # The freeze holding it back and its webhook deliveries (docs/rollouts.md#freeze-windows,
    # docs/rollouts.md#notifications).
    gates = {"frozen": rollout_freeze(ro), "notifications": notification_status(ro.pk)}
    return JsonResponse({**describe_rollout(ro, timeline=True), **gates})


@api_view(("POST",))
def rollout_action(request: HttpRequest, rollout_id: int, action: str) -> HttpResponse:
    """``POST /api/rollouts/<id>/promote|rollback|abort|takeover`` ``{reason?, force?}``.

    * promote — asks the driver for the next step (current after the last): 202;
    * rollback — the one button: a live driver is asked (202; it supersedes a pending
      promote); a dead one's lock is taken here, routing goes back at once and the lock
      is released (200);
    * abort — ends a rollout from any state it has not ended in: a live driver is
      asked (202), else the lock is taken here (200);
    * takeover — a dead driver's rollout gets a new driver job on the ``rollouts``
      queue (202); a live one is refused (409).

    An action that does not apply to the rollout's state (abort of a finished
    rollout, promote before the gate passed, rollback of a superseded one, …) is a 409
    ``{"error"}`` naming the state, refused before the deploy lock is touched; a lease
    that is not a live driver's is broken only with ``"force": true`` (audited as
    ``rollout.lock.break``). docs/rollouts.md#operator-actions.
    """
    target = f"rollout #{rollout_id}"
    perm = ROLLOUT_ACTIONS.get(action)
    if perm is None:
        return error(f"unknown action {action!r}: one of {', '.join(ROLLOUT_ACTIONS)}", 404)
    if not permitted(request, perm):
        return _refuse_rollout(
            request, action, target, f"you do not have permission to {action} rollouts", 403
        )
    try:
        data = json_body(request)
    except ValueError as exc:
        return _refuse_rollout(request, action, target, str(exc), 400)
    reason, force = data.get("reason", ""), data.get("force", False)
    if (problem := reason_problem(reason)) is not None:  # before acting: docs/api.md#limits
        return _refuse_rollout(request, action, target, problem, 400)
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
        delegated = driver_alive(ro) and not force
        done = abort_rollout(rollout=ro.pk, actor=actor, reason=reason or "abort", force=force)
        return done, 202 if delegated else 200
    ro = check_applies(ro, "takeover")
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
def versions_collection(request: HttpRequest) -> HttpResponse:
    """``GET /api/versions`` → ``{"versions": [...]}``: every analyzer version, oldest
    first, with its fingerprint, code version, configuration, state and live workers
    (``workers: {count, hosts, serving}``: the live workers of its code, and how many of
    them have it loaded). docs/rollouts.md#code-rollouts-bluegreen."""
    if (refused := _rollout_reader(request)) is not None:
        return refused
    return JsonResponse({"versions": version_rows()})


@api_view(("POST",))
def version_retire(request: HttpRequest, fingerprint: str) -> HttpResponse:
    """``POST /api/versions/<fingerprint>/retire`` ``{reason?}`` (a prefix of 4+ hex
    digits naming one version of the ``analysis`` queue): registered | drained |
    warm_failed → retired, ``200 {queue, fingerprint, state}``; ``404`` no such version, ``409`` its
    state allows no retirement (named), ``400`` a bad fingerprint or reason. Staff +
    ``dashboard.rollback_rollout``; refusals are audited (``rollout.retire``), the
    transition audits itself (``rollout.transition``)."""
    target = f"version {fingerprint[:64]}"
    if not permitted(request, "dashboard.rollback_rollout"):
        return _refuse_rollout(
            request, "retire", target, "you do not have permission to retire versions", 403
        )
    try:
        data = json_body(request)
    except ValueError as exc:
        return _refuse_rollout(request, "retire", target, str(exc), 400)
    reason = data.get("reason", "")
    if (problem := reason_problem(reason)) is not None:
        return _refuse_rollout(request, "retire", target, problem, 400)
    try:
        version = retire_version(
            fingerprint=fingerprint, actor=request.user, reason=reason or "retired over the API"
        )
    except VersionNotFound as exc:
        return _refuse_rollout(request, "retire", target, str(exc), 404)
    except InvalidTransition as exc:
        return _refuse_rollout(request, "retire", target, str(exc), 409)
    except RolloutError as exc:
        return _refuse_rollout(request, "retire", target, str(exc), 400)
    return JsonResponse(
        {"queue": version.queue, "fingerprint": version.fingerprint, "state": version.state}
    )


@api_view(("GET", "POST"))
def rollouts_freeze(request: HttpRequest) -> HttpResponse:
    """``GET /api/rollouts/freeze`` → ``{frozen, active, stop_the_line, windows}``;
    ``POST {"on": true|false, "reason": "..."}`` flips stop-the-line (audited; needs
    ``rollback_rollout``; a reason is required to switch it on) and answers the same
    shape. docs/rollouts.md#freeze-windows."""
    if request.method == "GET":
        if (refused := _rollout_reader(request)) is not None:
            return refused
        return JsonResponse(freeze_status())
    target = "stop-the-line"
    if not permitted(request, "dashboard.rollback_rollout"):
        return _refuse_rollout(
            request, "stop_the_line", target, "you do not have permission to stop the line", 403
        )
    try:
        data = json_body(request)
    except ValueError as exc:
        return _refuse_rollout(request, "stop_the_line", target, str(exc), 400)
    unknown = sorted(set(data) - {"on", "reason"})
    on, reason = data.get("on"), data.get("reason", "")
    problem = (
        f"unknown field(s): {', '.join(unknown)}"
        if unknown
        else '"on" must be true or false'
        if not isinstance(on, bool)
        else reason_problem(reason)
    )
    if problem is None and on and not reason.strip():
        problem = '"reason" is required to stop the line (it is shown with every refusal)'
    if problem is not None or not isinstance(on, bool):
        return _refuse_rollout(request, "stop_the_line", target, str(problem), 400)
    set_stop_the_line(on=on, actor=request.user, reason=reason)
    return JsonResponse(freeze_status())


@api_view(("POST",))
def rollout_pin(request: HttpRequest, rollout_id: int) -> HttpResponse:
    """``POST /api/rollouts/<id>/pin`` (:func:`_pins`)."""
    return _pins(request, rollout_id, "pin")


@api_view(("POST",))
def rollout_unpin(request: HttpRequest, rollout_id: int) -> HttpResponse:
    """``POST /api/rollouts/<id>/unpin`` (:func:`_pins`)."""
    return _pins(request, rollout_id, "unpin")


def _pins(request: HttpRequest, rollout_id: int, verb: str) -> HttpResponse:
    """``POST /api/rollouts/<id>/pin`` / ``…/unpin`` ``{"repositories": [ids]}`` → 200
    ``{"rollout", "pinned": [ids], "pins": [...]}``: pinned repositories always route to
    the rollout's ramping version (docs/rollouts.md#pinning). Staff +
    ``dashboard.start_rollout``; 409 when the rollout is not ramping, 400 for unknown
    repositories or a bad body; refusals audited, changes on the timeline (audited)."""
    target = f"rollout #{rollout_id}"
    if not permitted(request, "dashboard.start_rollout"):
        return _refuse_rollout(
            request, verb, target, f"you do not have permission to {verb} repositories", 403
        )
    try:
        data = json_body(request)
    except ValueError as exc:
        return _refuse_rollout(request, verb, target, str(exc), 400)
    unknown = sorted(set(data) - {"repositories"})
    repos = data.get("repositories")
    if (
        unknown
        or not isinstance(repos, list)
        or not all(isinstance(r, int) and not isinstance(r, bool) for r in repos)
    ):
        why = (
            f"unknown field(s): {', '.join(unknown)}"
            if unknown
            else '"repositories" must be a list of repository ids'
        )
        return _refuse_rollout(request, verb, target, why, 400)
    ro = Rollout.objects.select_related("version", "previous").filter(pk=rollout_id).first()
    if ro is None:
        return error(f"no rollout #{rollout_id}", 404)
    change = pin_repositories if verb == "pin" else unpin_repositories
    try:
        ids = change(rollout=ro.pk, repositories=repos, actor=request.user)
    except InvalidTransition as exc:
        return _refuse_rollout(request, verb, target, str(exc), 409)
    except RolloutError as exc:
        return _refuse_rollout(request, verb, target, str(exc), 400)
    return JsonResponse({"rollout": ro.pk, "pinned": ids, "pins": pinned(ro)})
