"""End to end in a real headless Chromium (Debian's package, installed by `make test`)
against `manage.py up` running as a user starts it. Everything is watched live, without
reloading: a lock appears with a token and a falling TTL, a progress bar reaches 100%,
a dead letter appears and is retried with its button, another is discarded through the
confirm dialog with a reason that the audit log then shows. Every page is checked at
1280 px: no card overflows sideways (the Workers card was cut), no console error (the
favicon 404), no markup in the title. Screenshots of every page are saved to
artifacts/screenshots/ (the README's are copies in docs/)."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.gitrepo import GitRepo
from tests.sysproc import CHROMIUM, CHROMIUM_ARGS
from tests.test_up import _env, _start
from workers.redisnode import free_port

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "artifacts" / "screenshots"
ARGS = CHROMIUM_ARGS
pytestmark = pytest.mark.slow


def make_repo(root: Path, name: str, commits: int) -> GitRepo:
    repo = GitRepo.create(root / name)
    for i in range(commits):
        repo.commit(f"{name}: change {i}", {f"src/m{i % 4}.py": f"x = {i}\n" * (i % 7 + 1)},
                    author=(["Ada", "Grace", "Linus"][i % 3], f"{i % 3}@example.com"))  # fmt: skip
    return repo


@pytest.fixture
def system(tmp_path: Path):
    assert Path(CHROMIUM).exists(), "chromium is installed by `make test` (make browser)"
    once = tmp_path / "once"
    once.mkdir()
    port = free_port()
    env = _env(
        tmp_path,
        GITWARD_FAILPOINTS=(
            "analyze.locked#slow=sleep:6,analyze.parsing#poison=raise*3,"
            "analyze.parsing#doomed=raise*3"
        ),
        GITWARD_FAILPOINTS_ONCE=str(once),
        GITWARD_RETRY_BACKOFF="0.2,0.2",
        GITWARD_RECONCILE_INTERVAL="1",
    )
    proc = _start(env, port, workers=2)
    yield f"http://127.0.0.1:{port}", tmp_path
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


OVERFLOWING = """() => [...document.querySelectorAll('.card')]
    .filter((c) => c.offsetParent !== null && c.scrollWidth > c.clientWidth + 1)
    .map((c) => (c.id || c.querySelector('h2')?.textContent || c.className)
                 + ' ' + c.scrollWidth + '>' + c.clientWidth)"""


def confirm_in_dialog(page, reason: str = "") -> str:
    """Fill the confirm dialog's reason, press its confirm button; returns what the
    dialog said it would do."""
    from playwright.sync_api import expect

    dialog = page.locator("#confirm-dialog")
    expect(dialog).to_be_visible(timeout=5000)
    what = dialog.locator("#confirm-what").inner_text()
    if reason:
        dialog.locator("#confirm-reason").fill(reason)
    dialog.locator("#confirm-ok").click()
    expect(dialog).to_be_hidden(timeout=10000)
    return what


def test_operators_watch_everything_live_in_a_real_browser(system) -> None:
    from playwright.sync_api import expect, sync_playwright

    base, tmp = system
    slow = make_repo(tmp, "slow", 40)
    poison = make_repo(tmp, "poison", 5)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        ctx = browser.new_context(viewport={"width": 1280, "height": 900})
        ops = ctx.new_page()
        errors: list[str] = []
        ops.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        ops.on("pageerror", lambda exc: errors.append(str(exc)))
        ops.on("dialog", lambda d: errors.append(f"native dialog: {d.message}") or d.dismiss())
        ops.goto(f"{base}/login/")
        ops.fill("input[name=username]", "admin")
        ops.fill("input[name=password]", "admin-pass-123")
        ops.click("button[type=submit]")
        ops.wait_for_url(f"{base}/")
        ops.goto(f"{base}/locks/")
        expect(ops.locator("#live-state")).to_have_text("live")
        ops.evaluate("window.__notReloaded = true")

        # Submit through the form in a second tab; watch the lock on the Locks page.
        user = ctx.new_page()
        user.goto(f"{base}/repos/")
        user.fill("input[name=url]", str(slow.path))
        user.click("form.submit button[type=submit]")
        user.wait_for_url(re.compile(r".*/repos/\d+/$"))
        repo_id = re.search(r"/repos/(\d+)/", user.url).group(1)
        row = ops.locator("#locks-body tr[data-key*=':commit:']")
        expect(row).to_have_count(1, timeout=30000)
        token = row.locator("td.token").inner_text()
        assert token.isdigit() and int(token) >= 1
        first = float(row.locator("td.ttl").inner_text().rstrip("s"))
        deadline = time.monotonic() + 10
        while (second := float(row.locator("td.ttl").inner_text().rstrip("s"))) >= first and (
            time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert second < first  # counting down in the browser
        ops.screenshot(path=str(SHOTS / "locks.png"))
        # Force-release it from the page through the confirm dialog: the row goes, the
        # fencing token moves on, and the holder's attempt is aborted and retried.
        row.locator("button", has_text="force release").click()
        said = confirm_in_dialog(ops, "browser test: stuck holder")
        assert "fencing token" in said and token in said
        expect(
            ops.locator("#locks-body tr[data-key*=':commit:'] td.token", has_text=token)
        ).to_have_count(0, timeout=20000)

        # The repository page's progress bar reaches 100% and the results appear.
        expect(user.locator("#repo-progress")).to_have_attribute("value", "100", timeout=60000)
        expect(user.locator("#repo-status")).to_have_text("ready")
        expect(user.locator("#results")).to_contain_text("Ada", timeout=10000)
        user.evaluate("window.__userNotReloaded = true")
        user.screenshot(path=str(SHOTS / "repository.png"), full_page=True)

        # A poison repository: dead after 3 attempts, shown live on the DLQ page.
        ops.goto(f"{base}/dead-letters/")
        expect(ops.locator("#live-state")).to_have_text("live")
        ops.evaluate("window.__notReloaded = true")
        user.goto(f"{base}/repos/")
        user.fill("input[name=url]", str(poison.path))
        user.click("form.submit button[type=submit]")
        group = ops.locator("details.group")
        expect(group).to_have_count(1, timeout=60000)
        expect(group.locator("summary")).to_contain_text("FailpointError")
        group.locator("summary").click()
        expect(group.locator(".run ol.attempts li")).to_have_count(3, timeout=10000)
        ops.screenshot(path=str(SHOTS / "dead-letters.png"), full_page=True)
        group.locator(".run button", has_text="retry").click()
        assert "fresh budget" in confirm_in_dialog(ops)
        expect(ops.locator("#dlq-body .empty")).to_be_visible(timeout=60000)
        assert ops.evaluate("window.__notReloaded") is True

        # Another poison repository: its group is discarded through the dialog, which
        # says exactly what will happen, with a reason that lands in the audit log.
        doomed = make_repo(tmp, "doomed", 3)
        user.goto(f"{base}/repos/")
        user.fill("input[name=url]", str(doomed.path))
        user.click("form.submit button[type=submit]")
        group = ops.locator("details.group")
        expect(group).to_have_count(1, timeout=60000)
        group.locator("summary").click()
        discard = group.locator("button", has_text="discard group")
        retry = group.locator("button", has_text="retry group")
        assert "danger" in discard.get_attribute("class")
        assert "danger" not in retry.get_attribute("class")
        gap = ops.evaluate(
            """([a, b]) => a.getBoundingClientRect().left - b.getBoundingClientRect().right""",
            [discard.element_handle(), retry.element_handle()],
        )
        assert gap >= 24, f"discard sits {gap}px from retry"  # apart, not touching
        discard.click()
        expect(ops.locator("#confirm-dialog")).to_be_visible()
        ops.screenshot(path=str(SHOTS / "confirm.png"))
        said = confirm_in_dialog(ops, "doomed on purpose <b>not bold</b>")
        assert said.startswith("Discard 1 run in 1 repository"), said
        expect(ops.locator("#dlq-body .empty")).to_be_visible(timeout=60000)

        # The retried run succeeded: the repository is ready.
        user.goto(f"{base}/repos/")
        expect(user.locator("#repo-table tr", has_text="poison").locator(".status")).to_have_text(
            "ready", timeout=60000
        )
        assert not [e for e in errors if "native dialog" in e], errors
        for name, path in [("overview", "/"), ("workers", "/workers/"), ("audit", "/audit/"),
                           ("repositories", "/repos/"), ("runs", "/runs/"), ("locks", "/locks/"),
                           ("dead-letters", "/dead-letters/"),
                           ("repository", f"/repos/{repo_id}/")]:  # fmt: skip
            errors.clear()
            ops.goto(f"{base}{path}")
            ops.wait_for_load_state("networkidle")
            assert not errors, (path, errors)  # no favicon 404, no script error
            assert "<" not in ops.title() and ">" not in ops.title(), (path, ops.title())
            assert ops.evaluate(OVERFLOWING) == [], path
            if name in {"overview", "workers", "audit", "repositories", "runs"}:
                ops.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
        check_run_page(ops, base, "slow")
        # The Workers card fits its column at 1280 px ("Last heartbeat" was cut).
        ops.goto(f"{base}/")
        card = ops.locator("#workers-card")
        expect(card).to_contain_text("ago")
        assert card.evaluate("c => c.scrollWidth <= c.clientWidth"), "Workers card overflows"
        # The bulk discard's entry is written by a worker when it ends: reload until then.
        deadline = time.monotonic() + 30
        ops.goto(f"{base}/audit/?action=dlq.discard")
        while not ops.locator("#audit-table td.reason", has_text="doomed").count():
            assert time.monotonic() < deadline, "the discard never reached the audit log"
            ops.reload()
        ops.goto(f"{base}/audit/")
        expect(ops.locator("#audit-table")).to_contain_text("dlq.retry")
        expect(ops.locator("#audit-table")).to_contain_text("lock.force_release")
        expect(
            ops.locator("#audit-table tr", has_text="dlq.discard").locator("td.reason")
        ).to_have_text("doomed on purpose <b>not bold</b>", timeout=30000)
        expect(ops.locator("#audit-table tr", has_text="lock.force_release").first).to_contain_text(
            "browser test: stuck holder"
        )
        ops.screenshot(path=str(SHOTS / "audit.png"), full_page=True)
        # The phone layout: the page itself never scrolls sideways.
        phone = browser.new_context(
            viewport={"width": 390, "height": 844}, storage_state=ctx.storage_state()
        )
        small = phone.new_page()
        small.goto(f"{base}/")
        small.wait_for_load_state("networkidle")
        small.screenshot(path=str(SHOTS / "overview-phone.png"), full_page=True)
        wide = small.evaluate(
            """() => document.documentElement.scrollWidth <= innerWidth + 1 ? [] :
               [...document.querySelectorAll('body *')]
                 .filter((e) => e.getBoundingClientRect().right > innerWidth + 1)
                 .slice(0, 5).map((e) => e.tagName + '.' + e.className)"""
        )
        assert wide == [], wide
        browser.close()


def check_run_page(ops, base: str, repo_name: str) -> None:
    """From the repository's recent runs to an analyze run's page: its latest attempt's
    trace as a timeline, one bar per span, drawn to scale against the attempt."""
    from playwright.sync_api import expect

    # A run's page, reached from the repository's recent runs: its trace as a
    # timeline, one bar per span, drawn to scale against the attempt's duration.
    ops.goto(f"{base}/repos/")
    ops.locator("#repo-table tr", has_text=repo_name).locator("a").first.click()
    ops.locator("#recent-runs a.run-link", has_text="analyze").first.click()
    ops.wait_for_url(re.compile(r".*/runs/\d+/$"))
    latest = ops.locator("section.attempt").first  # newest attempt first
    expect(latest.locator("h2 .pill")).to_have_text("succeeded")
    names = latest.locator("tr.span td.span-name").all_inner_texts()
    assert names[:3] == ["queued", "dequeued", "lock wait"] and names[-1] == "finished"
    assert {"lock held", "git stream", "rows write"} <= set(names)
    track = latest.locator("svg.span-bar").first.bounding_box()
    bars = [r.bounding_box() for r in latest.locator("svg.span-bar rect").all()]
    assert track and len(bars) == len(names) and all(b and b["width"] > 0 for b in bars)
    assert abs(bars[0]["x"] - track["x"]) < 2  # queued starts the timeline
    end = bars[-1]["x"] + bars[-1]["width"]
    assert abs(end - (track["x"] + track["width"])) < 2  # finished ends it
    ops.screenshot(path=str(SHOTS / "run.png"), full_page=True)


def test_a_run_page_draws_its_trace_to_scale_in_a_real_browser(system) -> None:
    from playwright.sync_api import expect, sync_playwright

    base, tmp = system
    repo = make_repo(tmp, "traced", 6)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        ops = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        ops.goto(f"{base}/login/")
        ops.fill("input[name=username]", "admin")
        ops.fill("input[name=password]", "admin-pass-123")
        ops.click("button[type=submit]")
        ops.wait_for_url(f"{base}/")
        ops.goto(f"{base}/repos/")
        ops.fill("input[name=url]", str(repo.path))
        ops.click("form.submit button[type=submit]")
        ops.wait_for_url(re.compile(r".*/repos/\d+/$"))
        expect(ops.locator("#repo-progress")).to_have_attribute("value", "100", timeout=60000)
        check_run_page(ops, base, "traced")
        browser.close()
