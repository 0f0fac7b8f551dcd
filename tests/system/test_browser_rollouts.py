"""The Rollouts page end to end in a real headless Chromium against `manage.py up`: an
admin starts a rollout of a new configuration (detect_renames) from the page's form and
its confirm dialog, watches it warm, pass the gate and show its result diff live (no
reload), promotes it step by step to current, sees the "roll back to V" button beside the
dead letters of the ramping version, and rolls it back with one button via the modal;
the repository page shows the new numbers once it is current and the previous ones the
moment the rollback commits. A second run rolls a ramping version back from the dead
letters' "roll back to V" button itself, waits for the version to drain and retires it
with the Versions table's Retire button.

``up`` serves the ``rollouts`` driver queue and warms with the real warmer;
``tests/support/rollout_browser.py`` adds what a test needs on top (a driver only if no worker
serves
``rollouts``, a reported worker of the new fingerprint, and a run of the ramping version
dead-lettered through the real attempt path). Screenshots go to artifacts/screenshots/
and docs/screenshot-rollouts.png."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import start_up, up_env
from tests.support.rollouts import history_with_renames
from tests.support.sysproc import CHROMIUM, CHROMIUM_ARGS
from workers.runtime.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "artifacts" / "screenshots"
pytestmark = pytest.mark.slow


@pytest.fixture
def system(tmp_path: Path, request: pytest.FixtureRequest):
    """``manage.py up`` with one worker; a test may add environment variables with
    ``@pytest.mark.parametrize("system", [{...}], indirect=True)``."""
    assert Path(CHROMIUM).exists(), "chromium is installed by `make test` (make browser)"
    port = free_port()
    env = up_env(tmp_path, GITWARD_RECONCILE_INTERVAL="1", **getattr(request, "param", {}))
    proc = start_up(env, port, workers=1)
    players: list[subprocess.Popen[str]] = []
    yield f"http://127.0.0.1:{port}", tmp_path, env, players
    for p in players:
        if p.poll() is None:
            p.kill()
        out, _ = p.communicate()
        # Shown with a failed test's report (what the player waited for, or raised).
        print(f"--- tests.support.rollout_browser (exit {p.returncode}):\n{out}")
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def stat_cards(page, url: str) -> list[str]:
    """The repository page's totals (commits, authors, merges, lines added, deleted),
    loaded afresh."""
    page.goto(url)
    return page.locator("#results .cards .stat .n").all_inner_texts()


def test_an_admin_rolls_out_and_rolls_back_from_the_rollouts_page(system) -> None:
    from playwright.sync_api import expect, sync_playwright

    base, tmp, env, players = system
    origin = history_with_renames(tmp / "renames")
    go = tmp / "go-warm-the-rest"
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = _logged_in(browser, base, viewport={"width": 1280, "height": 900})

        # A repository analysed under the current (default) version: the warm set.
        page.goto(f"{base}/repos/")
        page.fill("input[name=url]", str(origin.path))
        page.click("form.submit button[type=submit]")
        page.wait_for_url(re.compile(r".*/repos/\d+/$"))
        expect(page.locator("#repo-status")).to_have_text("ready", timeout=90000)
        repo_url = page.url
        before = stat_cards(page, repo_url)
        assert before[0] == "5" and before[3] == "+125", before  # git log --numstat, no -M

        # Start from the Rollouts page (nav between Dead letters and Audit).
        page.goto(f"{base}/")
        nav = page.locator("header nav a").all_inner_texts()
        assert nav.index("Rollouts") == nav.index("Dead letters") + 1
        assert nav.index("Audit") == nav.index("Rollouts") + 1
        page.click("header nav a:text('Rollouts')")
        page.wait_for_url(f"{base}/rollouts/")
        # Bad input first: a field error, nothing started.
        page.fill("#id_steps", "50,10")
        page.check("#id_detect_renames")
        page.click("#start-button")
        expect(page.locator("#confirm-dialog")).to_be_visible()
        page.click("#confirm-ok")
        expect(page.locator('.field-error[data-field="steps"]')).to_contain_text(
            "steps must increase"
        )
        page.fill("#id_steps", "10,100")
        page.check("#id_detect_renames")
        page.click("#start-button")
        dialog = page.locator("#confirm-dialog")
        expect(dialog).to_be_visible()
        assert page.locator("dialog:modal").count() == 1  # a real modal, not confirm()
        expect(page.locator("#confirm-what")).to_contain_text("detect_renames=true")
        expect(page.locator("#confirm-what")).to_contain_text("10% → 100%")
        page.fill("#confirm-reason", "renames as one file")
        page.click("#confirm-ok")
        page.wait_for_url(re.compile(r".*/rollouts/\d+/$"))
        rollout_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
        section = page.locator(f"#rollout-{rollout_id}")
        # pending until a driver takes the deploy lock (at once if `up` serves `rollouts`)
        expect(section.locator('[data-field="rollout-state"]')).to_have_text(
            re.compile("pending|active")
        )
        page.evaluate("window.__notReloaded = true")

        players.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.support.rollout_browser", str(rollout_id), str(go)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
        # Live: the driver takes the lock, warming starts and its progress shows. The
        # real warmer (the `rollouts` worker of `up`) may warm the whole 5-commit set
        # and pass the gate before the page is looked at, so "warming" is only seen as
        # a transition in the live timeline (registered → warming), not as a state that
        # must still hold; any stored count of the 5 is progress.
        state = section.locator('[data-field="version-state"]')
        expect(state).to_have_text(re.compile("warming|verified"), timeout=60000)
        expect(section.locator(".timeline")).to_contain_text("registered → warming")
        expect(section.locator("[data-field=warm-text]")).to_contain_text(
            re.compile(r"[1-5] / 5 commits"), timeout=30000
        )
        page.screenshot(path=str(SHOTS / "rollout-warming.png"), full_page=True)
        go.touch()
        # The gate opens: every check ✓; the diff says what changes.
        expect(state).to_have_text("verified", timeout=60000)
        expect(section.locator("[data-field=verdict]")).to_have_text("✓ gate open")
        expect(section.locator("ul.checks li.good")).to_have_count(5)
        expect(section.locator("ul.checks li.good", has_text="result contract")).to_have_count(1)
        expect(section.locator("[data-field=diff-headline]")).to_have_text(
            "2 commits change: renames now one file", timeout=30000
        )
        expect(section.locator(".timeline")).to_contain_text("lock.taken")
        assert page.evaluate("window.__notReloaded") is True

        # Promote to the first step through the modal.
        section.locator("button[data-verb=promote]").click()
        expect(page.locator("#confirm-what")).to_contain_text("from 0% to 10%")
        page.fill("#confirm-reason", "diff reviewed")
        page.click("#confirm-ok")
        expect(page.locator(".flash.success")).to_contain_text("promote requested")
        section = page.locator(f"#rollout-{rollout_id}")
        page.evaluate("window.__notReloaded = true")
        expect(section.locator('[data-field="version-state"]')).to_have_text(
            "ramping 10%", timeout=90000
        )
        assert page.evaluate("window.__notReloaded") is True

        # The ramping version's dead letter offers the rollback right there.
        dlq = page.context.new_page()
        dlq.goto(f"{base}/dead-letters/")
        old = page.locator(f"#rollout-{rollout_id} h2 .muted").inner_text().removeprefix("from ")
        offer = dlq.locator("#dlq-body details.group .offer button")
        expect(offer).to_have_text(f"roll back to {old}", timeout=60000)
        expect(dlq.locator("#dlq-body details.group .offer")).to_contain_text("(ramping)")
        dlq.screenshot(path=str(SHOTS / "rollout-dead-letters.png"), full_page=True)
        offer.click()
        expect(dlq.locator("#confirm-what")).to_contain_text(f"to {old}: stop routing")
        dlq.click("#confirm-cancel")  # cancelled: nothing happens
        expect(dlq.locator("#confirm-dialog")).to_be_hidden()
        dlq.close()

        page.goto(f"{base}/rollouts/")
        page.screenshot(path=str(SHOTS / "rollouts.png"), full_page=True)
        shutil.copy(SHOTS / "rollouts.png", ROOT / "docs" / "screenshot-rollouts.png")
        # 10% → 100% → current, each through its confirm step.
        for step in ("Promote to 100%", "Promote to current"):
            button = page.locator(f"#rollout-{rollout_id} button[data-verb=promote]")
            # The driver applies a requested promote within a second when idle; two whole
            # suites at once on 2 cores made it take over 30 s (seen twice): a bound, not a pace.
            expect(button).to_have_text(step, timeout=90000)
            button.click()
            page.click("#confirm-ok")
            expect(page.locator(".flash.success")).to_contain_text("promote requested")
        section = page.locator(f"#rollout-{rollout_id}")
        # The same driver step as each promote above: the same bound.
        expect(section.locator('[data-field="version-state"]')).to_have_text(
            "current", timeout=90000
        )
        expect(section.locator('[data-field="rollout-state"]')).to_have_text("completed")
        # Current: the repository page serves the new version's numbers (the warm set was
        # the whole history): the renames are one file each, no lines added or deleted.
        promoted = stat_cards(page, repo_url)
        assert promoted[0] == "5" and promoted[3] == "+44", promoted  # git log -M
        page.goto(f"{base}/rollouts/")
        section = page.locator(f"#rollout-{rollout_id}")

        # One button: roll back, via the modal naming exactly what happens.
        section.locator("button[data-verb=rollback]").click()
        assert page.locator("dialog:modal").count() == 1
        plan = page.locator("#confirm-what")
        expect(plan).to_contain_text(f"to {old}: stop routing to")
        expect(plan).to_contain_text("becomes current again")
        expect(plan).to_contain_text("release the deploy lock")
        page.fill("#confirm-reason", "numbers look wrong")
        page.click("#confirm-ok")
        expect(page.locator(".flash.success")).to_contain_text(f"routed back to {old}")
        section = page.locator(f"#rollout-{rollout_id}")
        expect(section.locator('[data-field="rollout-state"]')).to_have_text(
            re.compile("rolling_back|rolled_back")
        )
        # The repository page shows the previous results at once: one load, no waiting
        # (they were never deleted; nothing is recomputed).
        assert stat_cards(page, repo_url) == before
        row = page.locator(f"#versions-table tr:has(code:text-is('{old}'))")
        page.goto(f"{base}/rollouts/")
        expect(row.locator(".pill")).to_have_text("current")
        page.screenshot(path=str(SHOTS / "rollouts-rolled-back.png"), full_page=True)
        page.goto(f"{base}/audit/?action=rollout.page.rollback")
        expect(page.locator("#audit-table")).to_contain_text("routed back")
        browser.close()
    out = players[0].communicate(timeout=60)[0]
    assert players[0].returncode == 0, out


def test_an_admin_rolls_a_ramping_version_back_from_its_dead_letters(system) -> None:
    """The "roll back to V" button beside a dead-letter group of the ramping version,
    clicked and confirmed: routing goes back, the version drains, the repository page
    keeps the previous version's numbers."""
    from playwright.sync_api import expect, sync_playwright

    base, tmp, env, players = system
    origin = history_with_renames(tmp / "renames")
    go = tmp / "go-warm-the-rest"
    go.touch()  # no pause mid-warming in this run
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = _logged_in(browser, base, viewport={"width": 1280, "height": 900})
        page.goto(f"{base}/repos/")
        page.fill("input[name=url]", str(origin.path))
        page.click("form.submit button[type=submit]")
        page.wait_for_url(re.compile(r".*/repos/\d+/$"))
        expect(page.locator("#repo-status")).to_have_text("ready", timeout=90000)
        repo_url = page.url
        before = stat_cards(page, repo_url)
        assert before[3] == "+125", before

        page.goto(f"{base}/rollouts/")
        page.fill("#id_steps", "50,100")
        page.check("#id_detect_renames")
        page.click("#start-button")
        expect(page.locator("#confirm-what")).to_contain_text("detect_renames=true")
        page.click("#confirm-ok")
        page.wait_for_url(re.compile(r".*/rollouts/\d+/$"))
        rollout_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
        players.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.support.rollout_browser", str(rollout_id), str(go)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
        section = page.locator(f"#rollout-{rollout_id}")
        state = section.locator('[data-field="version-state"]')
        expect(state).to_have_text("verified", timeout=90000)
        button = section.locator("button[data-verb=promote]")
        expect(button).to_have_text("Promote to 50%", timeout=30000)
        button.click()
        page.click("#confirm-ok")
        expect(page.locator(".flash.success")).to_contain_text("promote requested")
        section = page.locator(f"#rollout-{rollout_id}")
        expect(section.locator('[data-field="version-state"]')).to_have_text(
            "ramping 50%", timeout=90000
        )
        old = page.locator(f"#rollout-{rollout_id} h2 .muted").inner_text().removeprefix("from ")

        # The dead letters of the ramping version: the button right there, confirmed.
        page.goto(f"{base}/dead-letters/")
        offer = page.locator("#dlq-body details.group .offer button")
        expect(offer).to_have_text(f"roll back to {old}", timeout=60000)
        offer.click()
        assert page.locator("dialog:modal").count() == 1
        expect(page.locator("#confirm-what")).to_contain_text(f"to {old}: stop routing")
        page.fill("#confirm-reason", "dead letters of the canary")
        page.click("#confirm-ok")
        page.wait_for_url(f"{base}/dead-letters/")  # back where the button was
        # The rollout's driver is alive mid-ramp: the button asks it (it holds the lock).
        expect(page.locator(".flash.success")).to_contain_text("rollback requested")
        page.screenshot(path=str(SHOTS / "rollout-dlq-rolled-back.png"), full_page=True)

        page.goto(f"{base}/rollouts/{rollout_id}/")
        section = page.locator(f"#rollout-{rollout_id}")
        expect(section.locator('[data-field="rollout-state"]')).to_have_text(
            re.compile("rolling_back|rolled_back"), timeout=60000
        )
        expect(section.locator('[data-field="version-state"]')).to_have_text(
            re.compile("draining|drained")
        )
        expect(section.locator(".timeline")).to_contain_text("dead letters of the canary")
        assert stat_cards(page, repo_url) == before
        page.goto(f"{base}/rollouts/")
        row = page.locator(f"#versions-table tr:has(code:text-is('{old}'))")
        expect(row.locator(".pill")).to_have_text("current")
        page.goto(f"{base}/audit/?action=rollout.page.rollback")
        expect(page.locator("#audit-table")).to_contain_text("dead letters of the canary")

        # Once drained it can be retired for good from the Versions table, via the modal.
        page.goto(f"{base}/rollouts/")
        drained = page.locator("#versions-table tr[data-state='drained']")
        expect(drained).to_have_count(1, timeout=60000)  # live: no reload needed
        fingerprint = drained.get_attribute("data-fingerprint")
        drained.locator("button[data-verb=retire]").click()
        assert page.locator("dialog:modal").count() == 1
        expect(page.locator("#confirm-what")).to_contain_text("(drained) for good")
        page.fill("#confirm-reason", "the canary was bad")
        page.click("#confirm-ok")
        expect(page.locator(".flash.success")).to_contain_text("retired (drained → retired)")
        gone = page.locator(f"#versions-table tr[data-fingerprint='{fingerprint}']")
        expect(gone).to_have_count(0)
        page.goto(f"{base}/audit/?action=rollout.page.retire")
        expect(page.locator("#audit-table")).to_contain_text("the canary was bad")
        browser.close()
    out = players[0].communicate(timeout=60)[0]
    assert players[0].returncode == 0, out


def test_a_change_between_render_and_socket_is_shown_by_the_first_snapshot(system) -> None:
    """The page is rendered, then its socket connects: a rollout started in between
    sends its ``rollout.*`` event to nobody. The first snapshot is newer than the page,
    so the page swaps its live region in for it (it once took that snapshot for the
    state it was rendered in, and showed nothing until the next event)."""
    from playwright.sync_api import expect, sync_playwright

    base, _tmp, env, _players = system
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page, held = _first_socket_held(browser, base, "/rollouts/", r"/ws/rollouts/")
        started = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "rollout", "start", "--set",
             "detect_renames=true", "--driver", "none", "--actor", "carol"],
            env=env, capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        pk = int(started.stdout.split()[1])
        assert page.locator(f"#rollout-{pk}").count() == 0  # rendered before the start
        held[0].close()  # the page reconnects, now to the server: its first snapshot
        expect(page.locator(f"#rollout-{pk}")).to_be_visible(timeout=30000)
        browser.close()


# One web process keeping its copies for a minute: the page's dead-letter list (a shared
# part, which an event published by another process does not drop) is then surely the
# copy its refetch finds, as it may be within the TTL (1 s by default) on a loaded machine.
@pytest.mark.parametrize(
    "system", [{"GITWARD_SNAPSHOT_TTL": "60", "GITWARD_WEB_WORKERS": "1"}], indirect=True
)
def test_a_dead_letter_between_render_and_socket_is_shown_by_the_first_snapshot(system) -> None:
    """The Dead letters page is rendered, then its socket connects: a dead letter
    written in between (by a worker, another process) sends its event to nobody. The
    first snapshot is newer than the page, so the page fetches its groups afresh for it
    (it once took that snapshot for the state it was rendered in, and a refetch could
    get the list the page was rendered from: the "roll back to V" offer never came)."""
    from playwright.sync_api import expect, sync_playwright

    base, _tmp, env, _players = system
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page, held = _first_socket_held(browser, base, "/dead-letters/", r"/ws/ops/")
        expect(page.locator("#dlq-summary")).to_contain_text("0 dead runs")
        written = subprocess.run(
            [sys.executable, "-m", "tests.support.dead_letter", "poison"],
            env=env, capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert written.returncode == 0, written.stderr
        assert page.locator("#dlq-body details.group").count() == 0  # rendered before it
        held[0].close()  # the page reconnects, now to the server: its first snapshot
        expect(page.locator("#live-state")).to_have_text("live", timeout=30000)
        expect(page.locator("#dlq-summary")).to_contain_text("1 dead run", timeout=30000)
        expect(page.locator("#dlq-body details.group")).to_have_count(1)
        browser.close()


def _first_socket_held(browser, base: str, path: str, socket: str) -> tuple:
    """Log in and open ``path`` with its first websocket (matching ``socket``) held: open
    to the page, nothing from the server, until the test closes it (``held[0].close()``);
    the page's reconnection then reaches the server."""
    page = _logged_in(browser, base)
    held: list = []

    def hold_the_first(ws) -> None:
        if held:
            ws.connect_to_server()
        else:
            held.append(ws)

    page.route_web_socket(re.compile(socket), hold_the_first)
    page.goto(f"{base}{path}")
    for _ in range(200):  # bounded: the page opens its socket at load
        if held:
            break
        page.wait_for_timeout(50)
    assert held, "the page opened no socket"
    return page, held


def _logged_in(browser, base: str, **context):  # -> a playwright Page
    """A new page of a new browser context (``context``: its options), logged in as admin."""
    page = browser.new_context(**context).new_page()
    page.goto(f"{base}/login/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", "admin-pass-123")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")
    return page
