"""A code rollout driven from the Rollouts page in a real headless Chromium
(docs/rollouts.md#code-rollouts-bluegreen).

``manage.py up`` (one worker) is the blue fleet and the web process; beside it, a copy of
this source tree whose analysis counts every added line ten times runs its own
``manage.py worker --workers 2`` pool (green) against the same database and embedded
Redis nodes. The admin sees the learned version in the Versions table with its code and
its live workers, presses **Roll out**, watches it warm on green's workers and pass the
gate, promotes it step by step to current (the repository page then shows green's
numbers), and rolls it back with one button (blue's numbers at once)."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.installs import code_version_of, install, pool_of
from tests.support.processes import ended, start_up, up_env
from tests.support.rollouts import history_with_renames
from tests.support.sysproc import CHROMIUM, CHROMIUM_ARGS
from workers.runtime.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "artifacts" / "screenshots"
pytestmark = pytest.mark.slow


def stat_cards(page, url: str) -> list[str]:
    """The repository page's totals (commits, authors, merges, lines added, deleted)."""
    page.goto(url)
    return [t.replace(",", "") for t in page.locator("#results .cards .stat .n").all_inner_texts()]


def test_an_admin_rolls_new_code_out_and_back_from_the_rollouts_page(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    assert Path(CHROMIUM).exists(), "chromium is installed by `make test` (make browser)"
    green_copy = install(tmp_path / "green", patch=True)
    green_code = code_version_of(green_copy)
    port = free_port()
    env = up_env(tmp_path, GITWARD_RECONCILE_INTERVAL="1", GITWARD_WORKER_GRACE="5")
    base = f"http://127.0.0.1:{port}"
    up = start_up(env, port, workers=1)
    green: subprocess.Popen[bytes] | None = None
    origin = history_with_renames(tmp_path / "renames")
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            page.goto(f"{base}/login/")
            page.fill("input[name=username]", "admin")
            page.fill("input[name=password]", "admin-pass-123")
            page.click("button[type=submit]")
            page.wait_for_url(f"{base}/")

            # Blue analyses a repository under the baseline.
            page.goto(f"{base}/repos/")
            page.fill("input[name=url]", str(origin.path))
            page.click("form.submit button[type=submit]")
            page.wait_for_url(re.compile(r".*/repos/\d+/$"))
            expect(page.locator("#repo-status")).to_have_text("ready", timeout=90000)
            repo_url = page.url
            before = stat_cards(page, repo_url)
            assert before[0] == "5" and before[3] == "+125", before

            # Green starts beside it: its code is learned and shows with its workers.
            green = pool_of(green_copy, env, log=tmp_path / "green.log")
            page.goto(f"{base}/rollouts/")
            row = page.locator("#versions-table tbody tr").filter(has_text=green_code)
            deadline = time.monotonic() + 90
            while not (row.count() and row.locator("[data-code-workers]").get_attribute(
                    "data-code-workers") not in (None, "0")):  # fmt: skip
                assert time.monotonic() < deadline, (
                    "green's version never showed its workers: "
                    + page.locator("#versions-table").inner_text()
                    + (tmp_path / "green.log").read_text()[-3000:]
                )
                time.sleep(1)
                page.reload()
            expect(row).to_have_attribute("data-state", "registered")
            expect(row.locator("[data-field=workers]")).to_contain_text("live of its code")
            page.screenshot(path=str(SHOTS / "rollouts-code-learned.png"), full_page=True)

            # Roll it out from its row.
            row.locator("form.start-version button[type=submit]").click()
            page.wait_for_url(re.compile(r".*/rollouts/\d+/$"))
            rollout_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
            section = page.locator(f"#rollout-{rollout_id}")
            state = section.locator('[data-field="version-state"]')
            expect(state).to_have_text("verified", timeout=120000)  # warmed on green
            expect(section.locator("[data-field=verdict]")).to_have_text("✓ gate open")
            for step in ("Promote to 10%", "Promote to 50%", "Promote to 100%",
                         "Promote to current"):  # fmt: skip
                button = page.locator(f"#rollout-{rollout_id} button[data-verb=promote]")
                expect(button).to_have_text(step, timeout=90000)
                button.click()
                page.click("#confirm-ok")
                expect(page.locator(".flash.success")).to_contain_text("promote requested")
            section = page.locator(f"#rollout-{rollout_id}")
            expect(section.locator('[data-field="version-state"]')).to_have_text(
                "current", timeout=60000
            )
            promoted = stat_cards(page, repo_url)
            assert promoted[0] == "5" and promoted[3] == "+1250", promoted  # green's ×10

            # One button back: blue's numbers at once. The driver may still hold the
            # deploy lock for its last step a moment after "current" shows; the page
            # then refuses and says until when (seen on a slow CI machine): a user
            # clicks again once it is free, and so does the test (bounded).
            deadline = time.monotonic() + 90
            while True:
                page.goto(f"{base}/rollouts/")
                section = page.locator(f"#rollout-{rollout_id}")
                section.locator("button[data-verb=rollback]").click()
                page.fill("#confirm-reason", "new code counts wrong")
                page.click("#confirm-ok")
                flash = page.locator("p.flash").first
                expect(flash).to_be_visible()
                if "still held by" not in (flash.text_content() or ""):
                    break
                assert time.monotonic() < deadline, flash.text_content()
                page.wait_for_timeout(2000)
            expect(page.locator(".flash.success")).to_contain_text("routed back to")
            assert stat_cards(page, repo_url) == before
            browser.close()
    finally:
        if green is not None:
            with ended(green):
                green.send_signal(signal.SIGTERM)
                green.wait(timeout=60)
        up.send_signal(signal.SIGTERM)
        try:
            up.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.communicate()
