"""End to end in a real headless Chromium (Debian's package, installed by `make test`)
against `manage.py up` running as a user starts it. Everything is watched live, without
reloading: a lock appears with a token and a falling TTL, a progress bar reaches 100%,
a dead letter appears and is retried with its button. Screenshots of every page are
saved to artifacts/screenshots/."""

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
        GITWARD_FAILPOINTS="analyze.locked#slow=sleep:6,analyze.parsing#poison=raise*3",
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
        ops.on("dialog", lambda dialog: dialog.accept())
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
        # Force-release it from the page (confirm accepted): the row goes, the fencing
        # token moves on, and the holder's attempt is aborted and retried.
        row.locator("button", has_text="force release").click()
        expect(row.locator("button")).to_contain_text("released · token", timeout=10000)
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
        group.locator(".run button", has_text="retry").click()  # confirm dialog accepted
        expect(ops.locator("#dlq-body .empty")).to_be_visible(timeout=60000)
        assert ops.evaluate("window.__notReloaded") is True

        # The retried run succeeded: the repository is ready.
        user.goto(f"{base}/repos/")
        expect(user.locator("#repo-table tr", has_text="poison").locator(".status")).to_have_text(
            "ready", timeout=60000
        )
        for name, path in [("overview", "/"), ("workers", "/workers/"), ("audit", "/audit/"),
                           ("repositories", "/repos/")]:  # fmt: skip
            ops.goto(f"{base}{path}")
            ops.wait_for_load_state("networkidle")
            ops.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
        check_run_page(ops, base, "slow")
        ops.goto(f"{base}/audit/")
        expect(ops.locator("#audit-table")).to_contain_text("dlq.retry")
        expect(ops.locator("#audit-table")).to_contain_text("lock.force_release")
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
