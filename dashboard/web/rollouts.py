"""The rollout pages: the index (versions, queues, latest rollouts, the start form), one
rollout with its checklist, and the buttons' POSTs (start, promote, set ramp, rollback,
abort, takeover, retire a version); thin over ``dashboard.rollouts.board``. Every button
is permission-checked and audited, a refusal included."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods

from dashboard.accounts import record_audit
from dashboard.infra import RedisUnavailable
from dashboard.models import AnalyzerVersion, Rollout
from dashboard.rollouts import (
    PERMISSION,
    VERBS,
    canary_offers,
    checklist_blocks,
    dead_letter_offers,
    freeze_status,
    label,
    perform,
    permitted,
    pin_repositories,
    retire,
    rollout_checklist,
    rollout_view,
    rollouts_page,
    set_stop_the_line,
    start_rollout,
    unpin_repositories,
)
from dashboard.versions import InvalidTransition, RolloutError
from dashboard.web.forms import PinForm, RolloutActionForm, StartRolloutForm, StopTheLineForm

log = logging.getLogger(__name__)


def _can(user: Any) -> dict[str, bool]:
    return {verb: permitted(user, verb) for verb in PERMISSION}


def _rollouts_context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    context: dict[str, Any] = {"live_socket": "/ws/rollouts/", "can": _can(request.user), **extra}
    context["freeze"] = freeze_status()
    context.setdefault("freeze_form", StopTheLineForm())
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
        detail = {"config": data["config"], "version": data["version"], "steps": data["steps"],
                  "auto": data["auto"], "reason": reason}  # fmt: skip
        try:
            ro = start_rollout(
                queue=data["queue"],
                config=data["config"],
                version=data["version"],
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
    """The form's ``next`` if it is a path of this site, else ``default``. A path only
    (``redirect`` takes any other word for a URL name: NoReverseMatch, a 500) and
    printable (a newline in a Location header raises BadHeaderError: a 500 too)."""
    target = str(request.POST.get("next") or "")
    if (
        target.startswith("/")
        and target.isprintable()
        and url_has_allowed_host_and_scheme(
            target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        )
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
    """The Versions table's Retire button after its confirm step (registered | drained | warm_failed
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
@require_http_methods(["POST"])
def rollouts_freeze(request: HttpRequest) -> HttpResponse:
    """The stop-the-line switch (docs/rollouts.md#freeze-windows): staff with
    ``dashboard.rollback_rollout``; audited (``rollout.stop_the_line``). A missing reason
    re-renders the page with the field error (400)."""
    if not permitted(request.user, "rollback"):
        return _refuse(request, "stop_the_line", "stop-the-line")
    form = StopTheLineForm(request.POST)
    if not form.is_valid():
        context = _rollouts_context(request, form=StartRolloutForm(), freeze_form=form)
        return render(request, "rollouts.html", context, status=400)
    on = bool(form.cleaned_data["on"])
    set_stop_the_line(on=on, actor=request.user, reason=form.cleaned_data["reason"])
    messages.success(
        request,
        "Stop-the-line is on: starting, ramping and promoting are refused."
        if on
        else "Stop-the-line is off.",
    )
    return redirect(reverse("rollouts"))


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


@login_required
@require_http_methods(["POST"])
def rollout_pins(request: HttpRequest, rollout_id: int) -> HttpResponse:
    """The pin form (docs/rollouts.md#pinning): staff with ``dashboard.start_rollout``, like
    promote; audited as ``rollout.page.pin`` / ``rollout.page.unpin`` (refusals too). A bad
    list re-renders the rollout's page with the field error (400)."""
    if not permitted(request.user, "promote"):
        return _refuse(request, "pin", f"rollout #{rollout_id}")
    ro = _rollout_or_404(rollout_id)
    form = PinForm(request.POST)
    if not form.is_valid():
        context: dict[str, Any] = {"live_socket": "/ws/rollouts/", "can": _can(request.user),
                                   "pin_form": form}  # fmt: skip
        try:
            context["r"] = rollout_view(ro)
            context["checklist_blocks"] = checklist_blocks(rollout_checklist(ro))
        except RedisUnavailable as exc:
            context["redis_error"] = str(exc)
        return render(request, "rollouts_detail.html", context, status=400)
    verb, ids = form.cleaned_data["action"], form.cleaned_data["repositories"]
    change = pin_repositories if verb == "pin" else unpin_repositories
    target = f"rollout #{ro.pk} {ro.queue}@{ro.version.fp12}"
    try:
        pinned_now = change(rollout=ro.pk, repositories=ids, actor=request.user)
    except (InvalidTransition, RolloutError) as exc:
        record_audit(user=request.user, action=f"rollout.page.{verb}", target=target,
                     outcome=f"refused: {exc}", detail={"repositories": ids})  # fmt: skip
        messages.error(request, f"{verb.capitalize()} refused: {exc}")
    else:
        outcome = "pinned: " + (", ".join(f"#{i}" for i in pinned_now) or "none")
        record_audit(user=request.user, action=f"rollout.page.{verb}", target=target,
                     outcome=outcome, detail={"repositories": ids})  # fmt: skip
        messages.success(request, f"Rollout #{ro.pk}: {outcome}.")
    return redirect(_back(request, reverse("rollout", args=[ro.pk])))
