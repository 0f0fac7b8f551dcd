"""The sections that were rendered per request only, watched live in a real headless
Chromium against ``manage.py up`` (docs/live-view.md): the Dead letters page's integrity
group shows a verifier's new mismatch, and the Workers page's Git hosts table a fetch
slot taken and let go, both written by another process and both without a reload; an
analysis page (hotspots) shows a push's new file once it is analysed, without a reload."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.gitrepo import GitRepo
from tests.support.processes import start_up, up_env
from tests.support.sysproc import CHROMIUM, CHROMIUM_ARGS
from workers.runtime.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory):
    """ONE ``manage.py up`` (one worker) for the module."""
    assert Path(CHROMIUM).exists(), "chromium is installed by `make test` (make browser)"
    tmp_path = tmp_path_factory.mktemp("live-sections")
    port = free_port()
    env = up_env(tmp_path, GITWARD_RECONCILE_INTERVAL="1")
    proc = start_up(env, port, workers=1)
    yield f"http://127.0.0.1:{port}", tmp_path, env
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def _logged_in(browser, base: str):
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{base}/login/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", "admin-pass-123")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")
    return page, errors


def _play(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.live_sections", *args],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_a_new_mismatch_and_a_host_limit_change_appear_without_reload(system) -> None:
    from playwright.sync_api import expect, sync_playwright

    base, tmp, env = system
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page, errors = _logged_in(browser, base)

        # Dead letters: no mismatch, then the verifier (another process) records one.
        page.goto(f"{base}/dead-letters/")
        expect(page.locator("#live-state")).to_have_text("live", timeout=30000)
        expect(page.locator("#integrity .empty")).to_be_visible()
        page.evaluate("window.__notReloaded = true")
        played = _play(env, "mismatch", "drifted")
        out, _ = played.communicate(timeout=120)
        assert played.returncode == 0, out
        verification = out.split()[-1]
        row = page.locator(f'#integrity details[data-verification="{verification}"]')
        expect(row).to_be_visible(timeout=30000)
        expect(row.locator("summary")).to_contain_text("drifted")
        expect(row.locator("summary")).to_contain_text("integrity mismatch")
        expect(page.locator("#integrity .empty")).to_have_count(0)
        assert page.evaluate("window.__notReloaded") is True

        # Workers: a fetch slot of a host taken by another process shows 1/4, let go 0/4.
        page.goto(f"{base}/workers/")
        expect(page.locator("#live-state")).to_have_text("live", timeout=30000)
        page.evaluate("window.__notReloaded = true")
        host = page.locator('#fetch-hosts-body tr[data-host="git.live.example"]')
        expect(host).to_have_count(0)
        go = tmp / "release-slot"
        holder = _play(env, "hold", "git.live.example", str(go))
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            expect(host.locator("td.fetch-slots")).to_have_text("1/4", timeout=30000)
            go.touch()
            expect(host.locator("td.fetch-slots")).to_have_text("0/4", timeout=30000)
        finally:
            go.touch()
            out, _ = holder.communicate(timeout=60)
        assert holder.returncode == 0, out
        assert page.evaluate("window.__notReloaded") is True
        assert errors == []
        browser.close()


def test_an_analysis_page_shows_a_pushed_file_once_it_is_analysed(system) -> None:
    from playwright.sync_api import expect, sync_playwright

    base, tmp, env = system
    origin = GitRepo.create(tmp / "pushed")
    origin.commit("first", {"src/first.py": "1\n"})
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page, errors = _logged_in(browser, base)
        page.goto(f"{base}/repos/")
        page.fill("input[name=url]", str(origin.path))
        page.click("form.submit button[type=submit]")
        page.wait_for_url(re.compile(r".*/repos/\d+/$"))
        expect(page.locator("#repo-status")).to_have_text("ready", timeout=90000)
        page.goto(page.url + "analytics/hotspots/")
        expect(page.locator("#live-state")).to_have_text("live", timeout=30000)
        files = page.locator("#hotspot-files")
        expect(files).to_contain_text("src/first.py")
        expect(files).not_to_contain_text("src/pushed.py")
        page.evaluate("window.__notReloaded = true")
        # A push: a new commit, then the repository submitted again (as a push webhook
        # does): fetched, analysed, and the page swaps its results in.
        origin.commit("pushed", {"src/pushed.py": "2\n2\n"})
        submitted = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "submit", str(origin.path)],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        expect(files).to_contain_text("src/pushed.py", timeout=90000)
        expect(page.locator("#analytics-provenance")).to_contain_text(
            origin.git("rev-parse", "HEAD").strip()[:10]
        )
        assert page.evaluate("window.__notReloaded") is True
        assert errors == []
        browser.close()
