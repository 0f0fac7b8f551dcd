"""The Rollouts page and its buttons (docs/rollouts.md): what it shows from a
real rollout (a real analysed repository, the warm set analysed under the new version
with the real analyzer path, a real deploy lock), the permission-checked, CSRF-protected,
audited buttons, field errors on bad input, the "roll back to V" offers beside the dead
letters and on the overview, and the rollouts socket."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Permission, User
from django.test import Client

from dashboard.infra import queues
from dashboard.infra.events import publish_event
from dashboard.models import (
    AnalyzerVersion,
    AuditEntry,
    JobRun,
    Repository,
    Rollout,
    RolloutEvent,
)
from dashboard.rollouts import drains, steps
from dashboard.rollouts import start as rollouts_start
from dashboard.rollouts.board import checklist_blocks
from dashboard.rollouts.checklist import rollout_checklist
from dashboard.rollouts.driver import RolloutDriver
from dashboard.rollouts.rollback_offers import NEWLY_CURRENT
from dashboard.runs.attempts import begin_attempt, ensure_run, fail_attempt
from dashboard.versions import state_machine
from dashboard.versions.state_machine import ensure_baseline
from tests.support.rollouts import (  # noqa: F401 (fixture)
    DRIVERS,
    _release_drivers,
    analyse_as,
    analysed,
    report_worker,
    start,
    wait_for,
)
from tests.support.sockets import connect, session_headers

pytestmark = pytest.mark.django_db(transaction=True)
S = AnalyzerVersion.State
OPS = ("view_jobrun",)
ADMIN = ("view_jobrun", "start_rollout", "rollback_rollout")


def make_user(name: str, *, staff: bool = True, perms: tuple[str, ...] = ()) -> User:
    user = User.objects.create_user(name, password=f"pw-{name}-123", is_staff=staff)
    if perms:
        user.user_permissions.add(*Permission.objects.filter(codename__in=perms))
    return user


def client_for(user: User, *, csrf: bool = False) -> Client:
    c = Client(enforce_csrf_checks=csrf)
    c.force_login(user)
    return c


def verified_rollout(tmp_path: Path, **kw: object):
    """A real rollout of detect_renames up to verified with its diff: the driver (this
    process) chose the warm set; the warm set was analysed with the new config."""
    repo, _origin = analysed(tmp_path, "r")
    ro, driver = start(warm_set={"repositories": 5, "commits_per_repository": 10,
                                 "threshold": 1.0}, **kw)  # fmt: skip
    driver.tick()  # → warming, warm set chosen
    ro.refresh_from_db()
    assert ro.version.state == S.WARMING
    new = AnalyzerVersion.objects.get(pk=ro.version_id)
    analyse_as(new, repo, list(reversed(ro.warm_set["items"][0][1])))
    report_worker(new)
    driver.tick()  # verdict → verified
    driver.tick()  # diff recorded
    ro = Rollout.objects.select_related("version", "previous").get(pk=ro.pk)
    assert ro.version.state == S.VERIFIED and ro.diff, ro.verdict
    return ro, driver, repo


def dead_run(repo: Repository, fingerprint: str, n: int, message: str = "boom") -> JobRun:
    """A run of ``fingerprint`` dead-lettered through the real attempt path."""
    run = ensure_run(kind=JobRun.Kind.ANALYZE, job_id=f"t-{fingerprint[:8]}-{n}",
                     queue=state_machine.physical_queue("analysis", fingerprint),
                     repository_id=repo.pk, fingerprint=fingerprint)  # fmt: skip
    attempt = begin_attempt(run_id=run.pk, number=1, worker="w-test")
    assert attempt is not None
    fail_attempt(attempt, RuntimeError(message), permanent=True)
    run.refresh_from_db()
    assert run.state == JobRun.State.DEAD
    return run


# ---------------------------------------------------------------------------- the page


def test_it_shows_versions_workers_progress_verdict_diff_and_timeline(tmp_path: Path) -> None:
    ro, _driver, _ = verified_rollout(tmp_path)
    op = client_for(make_user("op", perms=OPS))
    page = op.get("/rollouts/")
    assert page.status_code == 200
    html = page.content.decode()
    new, old = (
        state_machine.physical_queue("analysis", v.fingerprint) for v in (ro.version, ro.previous)
    )
    # Versions and states, workers per version (the new version's reported worker).
    assert re.search(rf"{new}</code></td><td><span class=\"pill vs-verified\">verified", html)
    assert re.search(rf"{old}</code></td><td><span class=\"pill vs-current\">current", html)
    assert f"w-{ro.version.fp12}" in html
    # Warming progress: every warm-set commit stored under the new fingerprint.
    n = len(ro.warm_set["items"][0][1])
    assert f'max="{n}" value="{n}"' in html and f"{n} / {n} commits (100%)" in html
    # The verdict, check by check.
    assert "✓ gate open" in html
    for check in ("coverage", "errors", "fingerprint", "workers"):
        assert re.search(rf'data-check="{check}">✓ {check}', html)
    # The diff: renames are one file now (2 of the 5 commits rename).
    assert ro.diff["commits_changed"] == 2
    assert "2 commits change: renames now one file" in html
    assert re.search(r"<td>file rows</td><td>\d+</td><td>\d+</td><td>-2</td>", html)
    # The timeline, newest first, and the buttons the op may not use are not drawn.
    assert "lock.taken" in html and "verified" in html and "data-rel" in html
    assert "data-confirm" not in html
    # The detail page and the Markdown download.
    detail = op.get(f"/rollouts/{ro.pk}/")
    assert detail.status_code == 200 and b"Release checklist" in detail.content
    assert b"\xe2\x98\x91 Warming verdict: passed" in detail.content  # ☑ rendered item
    md = op.get(f"/rollouts/{ro.pk}/checklist.md")
    assert md["Content-Type"].startswith("text/markdown")
    assert "attachment" in md["Content-Disposition"]
    assert md.content.decode() == rollout_checklist(ro)


def test_an_admin_sees_buttons_whose_confirm_names_what_will_happen(tmp_path: Path) -> None:
    ro, _driver, _ = verified_rollout(tmp_path)
    admin = client_for(make_user("admin", perms=ADMIN))
    html = admin.get("/rollouts/").content.decode()
    new, old = (
        state_machine.physical_queue("analysis", v.fingerprint) for v in (ro.version, ro.previous)
    )
    assert f'data-confirm="/rollouts/{ro.pk}/promote/"' in html
    assert "Promote to 10%" in html
    rollback = re.search(r'data-verb="rollback" data-title="([^"]+)" data-plan="([^"]+)"', html)
    assert rollback is not None
    assert rollback.group(1) == f"Roll back to {old}"
    plan = rollback.group(2)
    assert plan.startswith(f"roll back {new} to {old}: stop routing to {new}")
    assert "move 0 queued jobs back" in plan and "release the deploy lock" in plan
    # Destructive buttons are red and in their own group.
    destructive = html.split('<span class="destructive">', 1)[1].split("</span>", 1)[0]
    assert "Roll back to" in destructive and "Abort" in destructive
    assert 'class="small danger"' in destructive and "Promote" not in destructive


def test_pages_and_buttons_need_their_permissions(tmp_path: Path) -> None:
    ro, _driver, _ = verified_rollout(tmp_path)
    nobody = client_for(make_user("nobody", perms=()))
    assert nobody.get("/rollouts/").status_code == 403
    assert nobody.get(f"/rollouts/{ro.pk}/").status_code == 403
    assert nobody.get("/rollouts/offers/").status_code == 403
    assert Client().get("/rollouts/").status_code == 302  # to the login page
    op = client_for(make_user("op", perms=OPS))
    not_staff = client_for(make_user("clerk", staff=False, perms=ADMIN))
    for c, who in ((op, "op"), (not_staff, "clerk")):
        for verb in ("promote", "rollback", "abort", "takeover", "set_ramp"):
            res = c.post(f"/rollouts/{ro.pk}/{verb}/", {"reason": "x", "percent": "20"})
            assert res.status_code == 403, verb
            assert AuditEntry.objects.filter(
                actor=who, action=f"rollout.page.{verb}", outcome="refused: permission denied"
            ).exists()
        res = c.post(
            "/rollouts/start/", {"queue": "analysis", "steps": "10", "ignore_whitespace": "on"}
        )
        assert res.status_code == 403
    ro.refresh_from_db()
    assert ro.pending_action is None and Rollout.objects.count() == 1


def test_posts_without_the_csrf_token_are_refused(tmp_path: Path) -> None:
    ro, _driver, _ = verified_rollout(tmp_path)
    admin = client_for(make_user("admin", perms=ADMIN), csrf=True)
    before = AuditEntry.objects.count()
    assert admin.post(f"/rollouts/{ro.pk}/rollback/", {"reason": "x"}).status_code == 403
    assert admin.post("/rollouts/start/", {"queue": "analysis", "steps": "10"}).status_code == 403
    ro.refresh_from_db()
    assert ro.pending_action is None and ro.version.state == S.VERIFIED
    assert AuditEntry.objects.count() == before
    # With the token from the page's form the same POST goes through.
    page = admin.get(f"/rollouts/{ro.pk}/")
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page.content).group(1)
    res = admin.post(f"/rollouts/{ro.pk}/promote/",
                     {"reason": "ok", "csrfmiddlewaretoken": token.decode()})  # fmt: skip
    assert res.status_code == 302


def test_promote_and_set_ramp_reach_the_driver_and_are_audited(tmp_path: Path) -> None:
    ro, driver, _ = verified_rollout(tmp_path)
    admin = client_for(make_user("admin", perms=ADMIN))
    res = admin.post(f"/rollouts/{ro.pk}/promote/", {"reason": "diff looks right",
                                                     "next": f"/rollouts/{ro.pk}/"})  # fmt: skip
    assert res.status_code == 302 and res["Location"] == f"/rollouts/{ro.pk}/"
    ro.refresh_from_db()
    assert ro.pending_action["action"] == "promote"
    entry = AuditEntry.objects.get(action="rollout.page.promote")
    assert entry.actor == "admin" and entry.detail["reason"] == "diff looks right"
    assert entry.detail["plan"].startswith("promote ") and "to 10%" in entry.detail["plan"]
    driver.tick()
    assert AnalyzerVersion.objects.get(pk=ro.version_id).ramp_percent == 10
    # Bad percentages are field errors, and nothing is requested.
    for bad in ("", "0", "101", "ten"):
        res = admin.post(f"/rollouts/{ro.pk}/set_ramp/", {"percent": bad})
        assert res.status_code == 400, bad
        assert b'data-field="percent"' in res.content
    ro.refresh_from_db()
    assert ro.pending_action is None
    res = admin.post(f"/rollouts/{ro.pk}/set_ramp/", {"percent": "35", "reason": "halfway"})
    assert res.status_code == 302
    driver.tick()
    assert AnalyzerVersion.objects.get(pk=ro.version_id).ramp_percent == 35
    # A second request while one is pending is refused (shown, audited), never a 500.
    admin.post(f"/rollouts/{ro.pk}/promote/", {})
    res = admin.post(f"/rollouts/{ro.pk}/promote/", {}, follow=True)
    assert res.status_code == 200 and b"already has a pending request" in res.content
    assert AuditEntry.objects.filter(action="rollout.page.promote",
                                     outcome__startswith="refused:").exists()  # fmt: skip
    # Unknown actions and rollouts are 404, GET on an action is 405.
    assert admin.post(f"/rollouts/{ro.pk}/explode/").status_code == 404
    assert admin.post("/rollouts/99999/promote/").status_code == 404
    assert admin.get(f"/rollouts/{ro.pk}/promote/").status_code == 405


def test_rollback_after_promote_is_one_button(tmp_path: Path) -> None:
    ro, driver, _ = verified_rollout(tmp_path, steps=[100])
    token = int(driver.token or 0)
    steps.set_ramp(rollout=ro, percent=100, token=token, actor="alice")
    steps.promote(rollout=ro, token=token, actor="alice")
    driver.release()
    DRIVERS.remove(driver)
    ro.refresh_from_db()
    assert ro.state == Rollout.State.COMPLETED and ro.version.state == S.CURRENT
    admin = client_for(make_user("admin", perms=ADMIN))
    html = admin.get("/rollouts/").content.decode()
    old = state_machine.physical_queue("analysis", ro.previous.fingerprint)
    assert f"Roll back to {old}" in html
    assert "becomes current again and its stored results are served at once" in html
    res = admin.post(f"/rollouts/{ro.pk}/rollback/", {"reason": "numbers look wrong"}, follow=True)
    assert res.status_code == 200 and f"routed back to {old}".encode() in res.content
    ro.refresh_from_db()
    assert AnalyzerVersion.objects.get(pk=ro.previous_id).state == S.CURRENT
    assert AnalyzerVersion.objects.get(pk=ro.version_id).state in {S.DRAINING, S.DRAINED}
    assert ro.state in {Rollout.State.ROLLING_BACK, Rollout.State.ROLLED_BACK}
    entry = AuditEntry.objects.get(action="rollout.page.rollback")
    assert entry.detail["reason"] == "numbers look wrong" and entry.outcome.startswith(
        "routed back"
    )
    # The domain's own audit rows carry the operator as the actor.
    assert AuditEntry.objects.filter(action="rollout.takeover", actor="admin").exists()


def test_starting_from_the_form(tmp_path: Path) -> None:
    analysed(tmp_path, "r")
    admin = client_for(make_user("admin", perms=ADMIN))
    form = {"queue": "analysis", "detect_renames": "on", "exclude_paths": "vendor/**\n*.min.js",
            "steps": "10, 50,100", "reason": "ship renames"}  # fmt: skip
    res = admin.post("/rollouts/start/", form)
    ro = Rollout.objects.get()
    assert res.status_code == 302 and res["Location"] == f"/rollouts/{ro.pk}/"
    assert ro.state == Rollout.State.PENDING and ro.steps == [10, 50, 100] and not ro.auto
    assert ro.version.config == {"detect_renames": True, "ignore_whitespace": False,
                                 "exclude_paths": ["*.min.js", "vendor/**"]}  # fmt: skip
    assert ro.started_by == "admin"
    entry = AuditEntry.objects.get(action="rollout.page.start")
    assert entry.detail["reason"] == "ship renames" and entry.target.startswith(f"rollout #{ro.pk}")
    assert queues.queue(rollouts_start.DRIVER_QUEUE).job_ids == [f"rollout-{ro.pk}-start"]
    # A second start of the busy queue: a form error naming the holder, audited, 409.
    res = admin.post("/rollouts/start/", {"queue": "analysis", "ignore_whitespace": "on",
                                          "steps": "10"})  # fmt: skip
    assert res.status_code == 409
    assert b"already being rolled out" in res.content and b"started by admin" in res.content
    assert Rollout.objects.count() == 1


@pytest.mark.parametrize(
    ("data", "field", "text"),
    [
        ({"steps": "50,10"}, "steps", "steps must increase"),
        ({"steps": "ten"}, "steps", "whole percentages"),
        ({"steps": "0,200"}, "steps", "percentages 1..100"),
        ({"steps": ""}, "steps", "required"),
        ({"exclude_paths": "/etc/**"}, "exclude_paths", "relative to the repository root"),
        ({"exclude_paths": "src/../x"}, "exclude_paths", "segments"),
        ({"queue": "no such queue!"}, "queue", "invalid queue name"),
    ],
)
def test_bad_start_input_shows_field_errors(data: dict, field: str, text: str) -> None:
    admin = client_for(make_user("admin", perms=ADMIN))
    form = {"queue": "analysis", "steps": "10,50,100", "detect_renames": "on", **data}
    res = admin.post("/rollouts/start/", form)
    assert res.status_code == 400
    html = res.content.decode()
    errors = re.findall(rf'<p class="error field-error" data-field="{field}">([^<]+)</p>', html)
    assert errors and text in " ".join(errors).replace("&#x27;", "'"), html[-3000:]
    assert Rollout.objects.count() == 0 and AnalyzerVersion.objects.count() == 0


def test_the_current_config_is_refused_as_a_form_error(tmp_path: Path) -> None:
    admin = client_for(make_user("admin", perms=ADMIN))
    res = admin.post("/rollouts/start/", {"queue": "analysis", "steps": "10"})
    assert res.status_code == 409 and b"is already current: nothing to roll out" in res.content


# ---------------------------------------------------------------------------- retiring a version


def retire_url(version: AnalyzerVersion) -> str:
    return f"/rollouts/versions/{version.pk}/retire/"


def test_an_admin_retires_a_drained_version_from_the_versions_table(tmp_path: Path) -> None:
    ro, driver, _ = verified_rollout(tmp_path)
    token = int(driver.token or 0)
    steps.rollback(rollout=ro, token=token, actor="alice", reason="not today")
    drains.check_drain(rollout=ro.pk, token=token, actor="alice")
    assert drains.check_drain(rollout=ro.pk, token=token, actor="alice")  # two empty checks
    v, current = (AnalyzerVersion.objects.get(pk=pk) for pk in (ro.version_id, ro.previous_id))
    assert (v.state, current.state) == (S.DRAINED, S.CURRENT)
    name = state_machine.physical_queue("analysis", v.fingerprint)
    admin = client_for(make_user("admin", perms=ADMIN))
    html = admin.get("/rollouts/").content.decode()
    button = re.search(
        rf'data-confirm="{retire_url(v)}" data-verb="retire" data-title="Retire {name}" '
        r'data-plan="([^"]+)" data-danger="1">Retire…</button>',
        html,
    )
    assert button is not None, html
    assert button.group(1).startswith(f"retire {name} (drained) for good: it is never staffed")
    assert retire_url(current) not in html  # the current version offers no Retire
    # Without the permission: no button, and the POST is refused (audited).
    op = client_for(make_user("op", perms=OPS))
    assert 'data-verb="retire"' not in op.get("/rollouts/").content.decode()
    clerk = client_for(make_user("clerk", staff=False, perms=ADMIN))
    for c, who in ((op, "op"), (clerk, "clerk")):
        assert c.post(retire_url(v), {"reason": "x"}).status_code == 403
        assert AuditEntry.objects.filter(actor=who, action="rollout.page.retire",
                                         outcome="refused: permission denied").exists()  # fmt: skip
    # Without the CSRF token, as a GET, or for no such version: nothing happens.
    strict = client_for(User.objects.get(username="admin"), csrf=True)
    assert strict.post(retire_url(v), {"reason": "x"}).status_code == 403
    assert admin.get(retire_url(v)).status_code == 405
    assert admin.post("/rollouts/versions/99999/retire/", {}).status_code == 404
    assert AnalyzerVersion.objects.get(pk=v.pk).state == S.DRAINED
    # The press after the confirm step: retired, audited with the reason, gone from the table.
    res = admin.post(retire_url(v), {"reason": "superseded for good", "next": "/rollouts/"},
                     follow=True)  # fmt: skip
    assert res.status_code == 200
    html = res.content.decode()
    assert f"Version {name} retired (drained → retired)." in html
    assert f'data-fingerprint="{v.fingerprint}"' not in html
    assert AnalyzerVersion.objects.get(pk=v.pk).state == S.RETIRED
    entry = AuditEntry.objects.get(action="rollout.page.retire", actor="admin")
    assert entry.detail["reason"] == "superseded for good"
    assert entry.detail["plan"] == button.group(1)
    assert RolloutEvent.objects.get(version=v, to_state=S.RETIRED).reason == "superseded for good"
    # Pressed again from a stale page, or for the current version: a clear refusal.
    for version, state in ((v, "retired"), (current, "current")):
        res = admin.post(retire_url(version), {}, follow=True)
        label = state_machine.physical_queue("analysis", version.fingerprint)
        assert (f"Retire refused: {label} is {state}: only a drained or warm_failed version "
                "can be retired") in res.content.decode()  # fmt: skip
    assert AnalyzerVersion.objects.get(pk=current.pk).state == S.CURRENT
    refused = AuditEntry.objects.filter(action="rollout.page.retire", actor="admin",
                                        outcome__startswith="refused: ")  # fmt: skip
    assert refused.count() == 2


def test_a_version_whose_warming_failed_can_be_retired_too() -> None:
    ensure_baseline(actor="setup")
    ro = rollouts_start.start_rollout(
        config={"detect_renames": True}, actor="ci", enqueue_driver=False
    )
    driver = RolloutDriver(ro.pk, ttl=5.0, warm_timeout=0)
    driver.acquire(actor="ci")
    DRIVERS.append(driver)
    assert driver.tick()  # registered → warming
    assert not driver.tick()  # nothing warmed within the (zero) timeout: warm_failed
    v = AnalyzerVersion.objects.get(pk=ro.version_id)
    assert v.state == S.WARM_FAILED
    admin = client_for(make_user("admin", perms=ADMIN))
    assert f'data-confirm="{retire_url(v)}"' in admin.get("/rollouts/").content.decode()
    res = admin.post(retire_url(v), {"reason": "bad config"}, follow=True)
    assert "retired (warm_failed → retired)." in res.content.decode()
    assert AnalyzerVersion.objects.get(pk=v.pk).state == S.RETIRED


# ---------------------------------------------------------------------------- rollback offers


def test_dead_letters_of_a_ramping_version_offer_a_rollback_beside_them(tmp_path: Path) -> None:
    ro, driver, repo = verified_rollout(tmp_path)
    token = int(driver.token or 0)
    steps.set_ramp(rollout=ro, percent=10, token=token, actor="alice")
    bad = dead_run(repo, ro.version.fingerprint, 1, "KeyError: renamed path")
    dead_run(repo, ro.previous.fingerprint, 2, "OSError: disk full")  # the current's: no offer
    admin = client_for(make_user("admin", perms=ADMIN))
    data = admin.get("/rollouts/offers/").json()
    old = state_machine.physical_queue("analysis", ro.previous.fingerprint)
    assert list(data["groups"]) == [bad.cause_key]
    offer = data["groups"][bad.cause_key]
    assert offer["rollout"] == ro.pk and offer["to"] == old and "(ramping)" in offer["why"]
    assert offer["plan"].startswith("roll back ") and data["can_rollback"] is True
    # The page carries the offers endpoint and the confirm dialog for the button.
    page = admin.get("/dead-letters/").content.decode()
    assert (
        'data-offers="/rollouts/offers/"' in page
        and 'id="confirm-dialog"' in page
        and page.count("<dialog") == 1
    )
    # An operator without the permission sees the offer but gets no button.
    op = client_for(make_user("op", perms=OPS))
    assert op.get("/rollouts/offers/").json()["can_rollback"] is False
    # Once rolled back the version is no longer a suspect: no offer.
    steps.rollback(rollout=ro, token=token, actor="alice")
    assert admin.get("/rollouts/offers/").json()["groups"] == {}


def test_a_newly_current_version_still_offers_its_rollback(tmp_path: Path) -> None:
    ro, driver, repo = verified_rollout(tmp_path, steps=[100])
    token = int(driver.token or 0)
    steps.set_ramp(rollout=ro, percent=100, token=token, actor="alice")
    steps.promote(rollout=ro, token=token, actor="alice")
    bad = dead_run(repo, ro.version.fingerprint, 1)
    admin = client_for(make_user("admin", perms=ADMIN))
    assert admin.get("/rollouts/offers/").json()["groups"][bad.cause_key]["rollout"] == ro.pk
    # Current for longer than NEWLY_CURRENT: no longer offered.
    ro.refresh_from_db()
    assert ro.finished_at is not None
    Rollout.objects.filter(pk=ro.pk).update(finished_at=ro.finished_at - NEWLY_CURRENT * 2)
    assert admin.get("/rollouts/offers/").json()["groups"] == {}


def test_the_overview_offers_a_rollback_when_the_canary_fails(tmp_path: Path) -> None:
    ro, driver, repo = verified_rollout(tmp_path, options={"min_samples": 3})
    steps.set_ramp(rollout=ro, percent=10, token=int(driver.token or 0), actor="alice")
    admin = client_for(make_user("admin", perms=ADMIN))
    assert b"canary health check fails" not in admin.get("/").content
    for i in range(3):
        dead_run(repo, ro.version.fingerprint, i)
    html = admin.get("/").content.decode()
    old = state_machine.physical_queue("analysis", ro.previous.fingerprint)
    assert "canary health check fails: failure rate 100.0% vs 0.0%" in html
    assert f'data-confirm="/rollouts/{ro.pk}/rollback/"' in html and f"roll back to {old}" in html
    assert admin.get("/rollouts/offers/").json()["canary"][0]["rollout"] == ro.pk
    op = client_for(make_user("op", perms=OPS))
    page = op.get("/").content.decode()
    assert "canary health check fails" in page and "data-confirm=" not in page


# ---------------------------------------------------------------------------- live


def test_the_rollouts_socket_sends_rollout_events_only() -> None:
    op = make_user("op", perms=OPS)
    user = make_user("user", staff=False)

    async def scenario() -> None:
        comm, ok, _ = await connect("/ws/rollouts/", await sync_to_async(session_headers)(op))
        assert ok
        snap = await comm.receive_json_from(timeout=10)
        assert snap["type"] == "snapshot" and snap["data"] == {"rollouts": []}
        await sync_to_async(publish_event)("lock.extended", {"key": "locks:x", "ttl_ms": 1})
        await sync_to_async(publish_event)(
            "rollout.changed", {"event": "rollout.warming", "key": "analysis@abc", "rollout": 3}
        )
        msg = await comm.receive_json_from(timeout=10)
        assert [e["type"] for e in msg["events"]] == ["rollout.changed"]
        assert msg["events"][0]["event"] == "rollout.warming"
        await comm.disconnect()
        refused, ok, code = await connect(
            "/ws/rollouts/", await sync_to_async(session_headers)(user)
        )
        assert not ok and code == 4403
        await refused.disconnect()

    asyncio.run(scenario())


def test_checklist_blocks_render_the_markdown_subset() -> None:
    md = "# Rollout #1: a\n\n- **State**: active\n- [x] Lock taken\n- [ ] Promoted\n\n" \
         "| at | who |\n|---|---|\n| now | a \\| b |\n"  # fmt: skip
    blocks = checklist_blocks(md)
    assert blocks == [
        {"kind": "heading", "level": 2, "text": "Rollout #1: a"},
        {"kind": "item", "text": "State: active"},
        {"kind": "check", "done": True, "text": "Lock taken"},
        {"kind": "check", "done": False, "text": "Promoted"},
        {"kind": "table", "head": ["at", "who"], "rows": [["now", "a | b"]]},
    ]


def test_a_rollout_whose_driver_is_gone_is_taken_over_or_aborted(tmp_path: Path) -> None:
    ro, driver, _ = verified_rollout(tmp_path)
    admin = client_for(make_user("admin", perms=ADMIN))
    # A live driver: no takeover button; abort is a request to the driver.
    html = admin.get(f"/rollouts/{ro.pk}/").content.decode()
    assert 'data-verb="takeover"' not in html and "held by rollout-driver" in html
    driver.release()  # the driver stops without finishing: its lease is gone
    DRIVERS.remove(driver)
    html = admin.get(f"/rollouts/{ro.pk}/").content.decode()
    assert "no live holder" in html
    takeover = re.search(r'data-verb="takeover" data-title="Take over" data-plan="([^"]+)"', html)
    assert takeover is not None and "with a new fencing token" in takeover.group(1)
    res = admin.post(f"/rollouts/{ro.pk}/takeover/", {"reason": "driver died"}, follow=True)
    assert b"takeover driver queued" in res.content
    assert f"rollout-{ro.pk}-takeover" in queues.queue(rollouts_start.DRIVER_QUEUE).job_ids
    res = admin.post(f"/rollouts/{ro.pk}/takeover/", {}, follow=True)
    assert b"already queued" in res.content
    assert AuditEntry.objects.filter(action="rollout.page.takeover").count() == 2
    # Abort with no live driver: the lock is taken here and the version drains.
    res = admin.post(f"/rollouts/{ro.pk}/abort/", {"reason": "give up"}, follow=True)
    assert res.status_code == 200 and b"is rolling_back" in res.content
    assert AnalyzerVersion.objects.get(pk=ro.version_id).state in {S.DRAINING, S.DRAINED}
    assert AnalyzerVersion.objects.get(pk=ro.previous_id).state == S.CURRENT
    assert AuditEntry.objects.get(action="rollout.page.abort").detail["reason"] == "give up"


def test_stop_the_line_is_flipped_from_the_page_with_a_reason_and_audited() -> None:
    """The Freeze card (docs/rollouts.md#freeze-windows): an operator with the rollback
    permission stops the line with a reason; a viewer sees it and gets no switch; then
    a start from the page's form is refused naming it."""
    from dashboard.models import AuditEntry
    from dashboard.rollouts import freeze

    viewer = client_for(make_user("vic", perms=("view_jobrun",)))
    page = viewer.get("/rollouts/").content.decode()
    assert "Not frozen" in page and 'id="freeze-form"' not in page
    assert viewer.post("/rollouts/freeze/", {"on": "1", "reason": "x"}).status_code == 403
    op = client_for(make_user("olga", perms=("view_jobrun", "rollback_rollout", "start_rollout")))
    res = op.post("/rollouts/freeze/", {"on": "1", "reason": ""})
    assert res.status_code == 400
    assert "Say why the line is stopped" in res.content.decode()
    assert not freeze.stop_the_line()["on"]
    res = op.post("/rollouts/freeze/", {"on": "1", "reason": "incident 31"}, follow=True)
    page = res.content.decode()
    assert "Frozen: stop-the-line is on: incident 31" in page
    assert "Resume (switch stop-the-line off)" in page
    assert freeze.stop_the_line()["actor"] == "olga"
    ensure_baseline(actor="setup")
    res = op.post(
        "/rollouts/start/", {"queue": "analysis", "detect_renames": "on", "steps": "10,50,100"}
    )
    assert "stop-the-line is on: incident 31" in res.content.decode()
    assert not Rollout.objects.exists()
    op.post("/rollouts/freeze/", {"on": "0", "reason": ""})
    assert not freeze.stop_the_line()["on"]
    audit = AuditEntry.objects.filter(action="rollout.stop_the_line").order_by("id")
    assert [(a.actor, a.outcome) for a in audit] == [("olga", "off → on"), ("olga", "on → off")]
    refused = AuditEntry.objects.get(action="rollout.page.stop_the_line")
    assert (refused.actor, refused.outcome) == ("vic", "refused: permission denied")


def test_buttons_of_a_finished_rollout_are_refused_with_a_message_and_no_lease_broken() -> None:
    """Rollout A completed while rollout B runs (its driver holds the deploy lock):
    posting abort, take over, promote or roll back for A shows a message naming why —
    never a 500 — the refusal is audited, and B's lease is untouched."""
    from dashboard.locks import leases
    from tests.support.rollouts import completed_and_running
    from workers.locks import keys

    a, b, driver = completed_and_running()
    admin = client_for(make_user("admin", perms=ADMIN))
    before = leases.redlock().inspect(keys.deploy("analysis"))
    for verb in ("abort", "takeover", "promote", "rollback"):
        res = admin.post(f"/rollouts/{a.pk}/{verb}/", {"reason": "late"}, follow=True)
        assert res.status_code == 200, verb
        assert f"rollout #{a.pk} offers no".encode() in res.content, verb
    assert AuditEntry.objects.filter(action__startswith="rollout.page.",
                                     outcome__startswith="refused:").count() == 4  # fmt: skip
    after = leases.redlock().inspect(keys.deploy("analysis"))
    assert before is not None and after is not None and after["nonce"] == before["nonce"]
    assert driver.tick() and Rollout.objects.get(pk=b.pk).state == "active"
    assert Rollout.objects.get(pk=a.pk).state == "completed"
