"""End to end in a real headless Chromium (Debian's package, installed by `make test`)
against ONE `manage.py up` per module (started once: it is expensive), run as a user
starts it. Everything is watched live, without reloading: a lock appears with a token and
a falling TTL, a progress bar reaches 100%, a dead letter appears and is retried with its
button, another is discarded through the confirm dialog with a reason that the Audit page,
open in another tab, then shows. The tour visits every screen (overview, repositories, a
repository, a commit, a run, locks, workers, dead letters, rollouts, audit, runs, login) at 1280x800
and 390x844: no card overflows sideways (the Workers card was cut), nothing is wider than
the viewport, no console error (the favicon 404), no markup in the title, every button
reachable by keyboard, every table with headers, zero serious or critical axe-core
violations; the Runs screen, the Repositories list and the overview's Recent activity
update live, and a hidden tab's socket pauses and catches up when shown. A commit page
whose message, author and file names hold script payloads shows them as text (it had a
module and an `up` of its own; it shares this one, docs/testing.md#how-long-it-takes).
Screenshots of every screen are saved to artifacts/screenshots/ (the README's are copies
in docs/)."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.gitrepo import PAYLOADS, GitRepo, hostile_commits
from tests.support.processes import start_up, up_env
from tests.support.sysproc import CHROMIUM, CHROMIUM_ARGS
from workers.runtime.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "artifacts" / "screenshots"
ARGS = CHROMIUM_ARGS
pytestmark = pytest.mark.slow


def make_repo(root: Path, name: str, commits: int) -> GitRepo:
    repo = GitRepo.create(root / name)
    for i in range(commits):
        repo.commit(f"{name}: change {i}", {f"src/m{i % 4}.py": f"x = {i}\n" * (i % 7 + 1)},
                    author=(["Ada", "Grace", "Linus"][i % 3], f"{i % 3}@example.com"))  # fmt: skip
    return repo


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory):
    """ONE `manage.py up` for the whole module (starting one is expensive): every test
    here submits repositories of its own names into it."""
    assert Path(CHROMIUM).exists(), "chromium is installed by `make test` (make browser)"
    tmp_path = tmp_path_factory.mktemp("browser")
    once = tmp_path / "once"
    once.mkdir()
    port = free_port()
    env = up_env(
        tmp_path,
        GITWARD_FAILPOINTS=(
            "analyze.locked#slow=sleep:6,analyze.parsing#poison=raise*3,"
            "analyze.parsing#doomed=raise*3"
        ),
        GITWARD_FAILPOINTS_ONCE=str(once),
        GITWARD_RETRY_BACKOFF="0.2,0.2",
        GITWARD_RECONCILE_INTERVAL="1",
    )
    proc = start_up(env, port, workers=2)
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
    expect(dialog.locator("#confirm-percent")).to_be_hidden()  # only rollout ramps ask for it
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
        expect(ops.locator("#live-state")).to_have_text("live", timeout=30000)
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
        expect(ops.locator("#live-state")).to_have_text("live", timeout=30000)
        ops.evaluate("window.__notReloaded = true")
        user.goto(f"{base}/repos/")
        user.fill("input[name=url]", str(poison.path))
        user.click("form.submit button[type=submit]")
        group = ops.locator("details.group")
        expect(group).to_have_count(1, timeout=60000)
        expect(group.locator("summary")).to_contain_text("FailpointError")
        group.locator("summary").click()
        expect(group.locator(".run ol.attempts li")).to_have_count(3, timeout=10000)
        dead_run = group.locator(".run a[href^='/runs/']").first.get_attribute("href")
        assert re.fullmatch(r"/runs/\d+/", dead_run or ""), dead_run  # its run page
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
        # The Audit page, open in another tab, shows the discard's entry live.
        audit = ctx.new_page()
        audit.goto(f"{base}/audit/")
        expect(audit.locator("#live-state")).to_have_text("live", timeout=30000)
        audit.evaluate("window.__notReloaded = true")
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
        check_run_page(ops, base, "slow")
        # The Workers card fits its column at 1280 px ("Last heartbeat" was cut).
        ops.goto(f"{base}/")
        card = ops.locator("#workers-card")
        expect(card).to_contain_text("ago")
        assert card.evaluate("c => c.scrollWidth <= c.clientWidth"), "Workers card overflows"
        # The bulk discard's entry is written by a worker when it ends; the Audit page
        # opened before shows it without a reload.
        expect(
            audit.locator("#audit-table tr", has_text="dlq.discard").locator("td.reason")
        ).to_have_text("doomed on purpose <b>not bold</b>", timeout=30000)
        assert audit.evaluate("window.__notReloaded") is True
        ops.goto(f"{base}/audit/")
        expect(ops.locator("#audit-table")).to_contain_text("dlq.retry")
        retried = ops.locator("#audit-table tr", has_text="dlq.retry")
        expect(retried.locator(f"a.run-link[href='{dead_run}']")).to_have_count(1)
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


AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
#: axe-core's worst two impact levels: none may remain on any page.
BLOCKING = ("serious", "critical")
AXE_RUN = """async (blocking) => {
    const r = await axe.run(document, {resultTypes: ['violations']});
    return r.violations.filter((v) => blocking.includes(v.impact)).map((v) => v.id
        + ' (' + v.impact + '): ' + v.nodes.slice(0, 3).map((n) => n.target.join(' ')).join(', '));
}"""
#: Anything wider than the viewport (the page itself must never scroll sideways).
WIDER_THAN_VIEWPORT = """() => document.documentElement.scrollWidth <= innerWidth + 1 ? [] :
    [...document.querySelectorAll('body *')]
      .filter((e) => e.getBoundingClientRect().right > innerWidth + 1).slice(0, 5)
      .map((e) => e.tagName + '.' + e.className)"""
#: Keyboard and structure: every visible button and link is reachable by Tab, and every
#: data table has header cells.
KEYBOARD = """() => [
    ...[...document.querySelectorAll('button, a[href], summary, select, input:not([type=hidden])')]
      .filter((e) => e.offsetParent !== null && e.tabIndex < 0)
      .map((e) => 'unreachable ' + e.outerHTML.slice(0, 80)),
    ...[...document.querySelectorAll('table')].filter((t) => !t.querySelector('th'))
      .map((t) => 'no headers ' + (t.id || t.className)),
]"""
UNLABELLED = """() => [...document.querySelectorAll('table.grid:not(.timeline) tbody td')]
    .filter((td) => td.closest('table').querySelector('thead th'))  // a column table
    .filter((td) => td.colSpan === 1 && td.offsetParent !== null && !td.dataset.label)
    .slice(0, 5).map((td) => (td.closest('table').id || 'table') + ': ' + td.textContent)"""
HIDE = """(hidden) => {
    Object.defineProperty(document, 'hidden', {configurable: true, get: () => hidden});
    Object.defineProperty(document, 'visibilityState',
                          {configurable: true, get: () => hidden ? 'hidden' : 'visible'});
    document.dispatchEvent(new Event('visibilitychange'));
}"""


def login(page, base: str) -> None:
    page.goto(f"{base}/login/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", "admin-pass-123")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")


def check_screen(page, name: str, size: str) -> None:
    """One screen as it is now: no console error, a plain title, nothing wider than its
    card or the viewport, zero serious or critical accessibility violations (axe-core),
    and a screenshot."""
    assert "<" not in page.title() and ">" not in page.title(), (name, page.title())
    assert page.evaluate(OVERFLOWING) == [], (name, size, page.evaluate(OVERFLOWING))
    assert page.evaluate(WIDER_THAN_VIEWPORT) == [], (name, size)
    assert page.evaluate(KEYBOARD) == [], (name, size, page.evaluate(KEYBOARD))
    if size == "phone":  # rows stack as "header: value": every cell names its column
        unlabelled = page.evaluate(UNLABELLED)
        assert unlabelled == [], (name, unlabelled)
    page.evaluate(AXE.read_text())  # DevTools evaluation: not subject to the page's CSP
    violations = page.evaluate(AXE_RUN, list(BLOCKING))
    assert violations == [], (name, size, violations)
    page.screenshot(path=str(SHOTS / f"{name}-{size}.png"), full_page=True)


def test_every_screen_at_desktop_and_phone_size_is_accessible_and_live(system) -> None:
    """Every screen at 1280x800 and 390x844 (check_screen); Runs, Repositories and the
    overview's Recent activity update without a reload; a hidden tab's socket pauses
    (no events reach it) and the snapshot catches it up when it is shown again."""
    from playwright.sync_api import expect, sync_playwright

    assert AXE.exists(), "axe-core is installed by `make test` (make browser: npm ci)"
    base, tmp = system
    SHOTS.mkdir(parents=True, exist_ok=True)
    toured = make_repo(tmp, "toured", 12)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        ctx = browser.new_context(viewport={"width": 1280, "height": 800})
        errors: list[str] = []
        ctx.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        ctx.on("weberror", lambda e: errors.append(str(e.error)))
        ops = ctx.new_page()
        login(ops, base)
        # Live without reloading: the Runs screen and the overview's feed, open before
        # a repository is submitted, show its runs; the Repositories list its status.
        runs = ctx.new_page()
        runs.goto(f"{base}/runs/")
        expect(runs.locator("#live-state")).to_have_text("live", timeout=30000)
        runs.evaluate("window.__notReloaded = true")
        repos = ctx.new_page()
        repos.goto(f"{base}/repos/")
        expect(repos.locator("#live-state")).to_have_text("live", timeout=30000)
        repos.evaluate("window.__notReloaded = true")
        expect(ops.locator("#live-state")).to_have_text("live", timeout=30000)
        repos.fill("input[name=url]", str(toured.path))
        repos.click("form.submit button[type=submit]")
        repos.wait_for_url(re.compile(r".*/repos/\d+/$"))
        repo_id = re.search(r"/repos/(\d+)/", repos.url).group(1)
        expect(repos.locator("#repo-status")).to_have_text("ready", timeout=60000)
        repos.go_back()
        expect(runs.locator("#runs-table tr", has_text="toured").first).to_be_visible(timeout=30000)
        assert runs.evaluate("window.__notReloaded") is True
        feed = ops.locator("#activity-list li")
        expect(ops.locator("#activity-list")).to_contain_text("toured", timeout=30000)
        expect(ops.locator("#activity-list li[data-type='repo.changed']").first).to_contain_text(
            "ready"
        )
        # Runs and locks name the repository: a link with its name, never "repository #N".
        named = f"a[href='/repos/{repo_id}/']"
        for kind in ("job.succeeded", "lock.acquired", "lock.released"):
            line = ops.locator(f"#activity-list li[data-type='{kind}']", has=ops.locator(named))
            expect(line.first.locator(named)).to_have_text("toured")
        expect(ops.locator("#activity-list")).not_to_contain_text("repository #")
        ops.select_option("#activity-kind", "lock")
        kinds = set(
            ops.locator("#activity-list li").evaluate_all("ls => ls.map(l => l.dataset.type)")
        )
        assert kinds and all(k.startswith("lock.") for k in kinds), kinds
        ops.select_option("#activity-kind", "")

        # Hidden, the overview lets its socket go: nothing arrives; shown, it catches up.
        ops.evaluate(HIDE, True)
        expect(ops.locator("#live-state")).to_have_text("paused")
        shown = "ls => ls.map((l) => l.dataset.type + '@' + l.dataset.at)"
        before = feed.evaluate_all(shown)
        late = make_repo(tmp, "late", 3)
        repos.goto(f"{base}/repos/")
        repos.fill("input[name=url]", str(late.path))
        repos.click("form.submit button[type=submit]")
        expect(repos.locator("#repo-status")).to_have_text("ready", timeout=60000)
        assert feed.evaluate_all(shown) == before  # paused: no events came
        ops.evaluate(HIDE, False)
        expect(ops.locator("#live-state")).to_have_text("live", timeout=30000)
        expect(ops.locator("#activity-list")).to_contain_text("late", timeout=15000)

        run_href = runs.locator("#runs-table a[href^='/runs/']").first.get_attribute("href")
        # A commit page, from the repository page's commit table (``repos`` shows "late").
        commit_href = repos.locator("a[href*='/commits/']").first.get_attribute("href")
        screens = [("overview", "/"), ("repositories", "/repos/"),
                   ("repository", f"/repos/{repo_id}/"), ("commit", commit_href),
                   ("run", run_href), ("locks", "/locks/"),
                   ("workers", "/workers/"), ("dead-letters", "/dead-letters/"),
                   ("rollouts", "/rollouts/"), ("audit", "/audit/"),
                   ("runs", "/runs/")]  # fmt: skip
        for size, viewport in [("desktop", (1280, 800)), ("phone", (390, 844))]:
            page = ctx.new_page() if size == "desktop" else browser.new_context(
                viewport={"width": viewport[0], "height": viewport[1]},
                storage_state=ctx.storage_state()).new_page()  # fmt: skip
            page.set_viewport_size({"width": viewport[0], "height": viewport[1]})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            for name, path in screens:
                errors.clear()
                page.goto(f"{base}{path}")
                page.wait_for_load_state("networkidle")
                if page.locator("#live-state").count():  # the dot, live
                    expect(page.locator("#live-state")).to_have_text("live", timeout=30000)
                check_screen(page, name, size)
                assert not errors, (name, size, errors)  # no favicon 404, no script error
            # Logged out: the login screen.
            anon = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
            login_page = anon.new_page()
            login_page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            errors.clear()
            login_page.goto(f"{base}/login/")
            check_screen(login_page, "login", size)
            assert not errors, ("login", size, errors)
            anon.close()
        # Focus is visible: Tab lands on the first link, drawn with an outline.
        page = ctx.new_page()
        page.goto(f"{base}/")
        page.keyboard.press("Tab")
        ring = page.evaluate(
            "() => { const a = document.activeElement, s = getComputedStyle(a);"
            " return [a.tagName, s.outlineStyle, parseFloat(s.outlineWidth)]; }"
        )
        assert ring[0] == "A" and ring[1] != "none" and ring[2] >= 2, ring
        browser.close()


def test_a_reused_page_fetches_its_live_regions_afresh_once_its_socket_joined(system) -> None:
    """The server reuses whole pages for the snapshot TTL (dashboard/web/page_cache.py; 1 s
    under `up`). A reused page (body data-reused="1") may predate an event sent before
    its socket joined, so gitward.js fetches its live regions once more after the first
    snapshot, with the header that makes the server render afresh."""
    from playwright.sync_api import sync_playwright

    base, _tmp = system
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        login(page, base)
        fresh: list[str] = []
        page.on(
            "request",
            lambda r: fresh.append(r.url) if r.headers.get("x-gitward-fresh") == "1" else None,
        )
        reused = None
        for _ in range(20):  # bounded: the page must be asked for again within its TTL
            page.goto(f"{base}/repos/")
            reused = page.evaluate("document.body.dataset.reused")
            assert reused in ("0", "1")
            if reused == "1":
                break
        assert reused == "1", "no reused page in 20 reloads within the TTL"
        deadline = time.monotonic() + 10
        while not fresh and time.monotonic() < deadline:
            page.wait_for_timeout(100)
        assert fresh and fresh[0].endswith("/repos/")
        browser.close()


INJECTED = """() => ({
    imgs: document.querySelectorAll('main img').length,
    inlineScripts: [...document.scripts].filter((s) => !s.src).length,
    handlers: [...document.querySelectorAll('main *')].filter(
        (e) => [...e.attributes].some((a) => a.name.startsWith('on'))).length,
})"""


def test_a_hostile_commit_page_shows_its_payloads_as_text(system) -> None:
    """A repository whose commit message, author and file names hold script payloads is
    analysed, its commit is opened from the repository page's commit table, and every
    payload is text: no dialog fires, no element is injected, the title holds no markup.
    Screenshots: artifacts/screenshots/commit.png and commit-phone.png. Last in the module
    (its own repository in the module's one `up`): the tour above sees none of it."""
    from playwright.sync_api import expect, sync_playwright

    base, tmp = system
    shas = hostile_commits(tmp / "hostile")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        ctx = browser.new_context(viewport={"width": 1280, "height": 900})
        page = ctx.new_page()
        fired: list[str] = []
        errors: list[str] = []
        page.on("dialog", lambda d: fired.append(d.message) or d.dismiss())
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{base}/login/")
        page.fill("input[name=username]", "admin")
        page.fill("input[name=password]", "admin-pass-123")
        page.click("button[type=submit]")
        page.wait_for_url(f"{base}/")
        page.goto(f"{base}/repos/")
        page.fill("input[name=url]", str(tmp / "hostile"))
        page.click("form.submit button[type=submit]")
        page.wait_for_url(re.compile(r".*/repos/\d+/$"))
        repo_url = page.url
        expect(page.locator("#repo-progress")).to_have_attribute("value", "100", timeout=90000)
        page.reload()  # the commit table is server-rendered
        expect(page.locator("#repo-head a.id-link")).to_have_attribute(
            "href", re.compile(rf"/commits/{shas['bogus']}/$")
        )
        # From the commit table to the root commit's page.
        row = page.locator("#commit-table tr", has_text="root ")
        row.locator("a.id-link").click()
        page.wait_for_url(re.compile(rf".*/commits/{shas['root']}/$"))
        page.wait_for_load_state("networkidle")
        message = page.locator("#commit-message").inner_text()
        assert message.strip() == f"root {PAYLOADS[0]}\n\nbody {PAYLOADS[1]}"
        assert page.locator("#commit-subject").inner_text() == f"root {PAYLOADS[0]}"
        files = page.locator("#commit-files").inner_text()
        assert f"{PAYLOADS[0]}.txt" in files and f"{PAYLOADS[1]}.md" in files
        patch = page.locator("#commit-patch").inner_text()
        assert f"+{PAYLOADS[0]}" in patch and f"+{PAYLOADS[1]}" in patch
        assert page.evaluate(INJECTED) == {"imgs": 0, "inlineScripts": 0, "handlers": 0}
        assert "<" not in page.title() and ">" not in page.title(), page.title()
        assert page.evaluate(OVERFLOWING) == []
        page.screenshot(path=str(SHOTS / "commit.png"), full_page=True)
        # On a phone the page itself never scrolls sideways (a long patch line scrolls
        # inside its own box).
        phone = browser.new_context(
            viewport={"width": 390, "height": 844}, storage_state=ctx.storage_state()
        ).new_page()
        phone.goto(page.url)
        phone.wait_for_load_state("networkidle")
        assert phone.evaluate("document.documentElement.scrollWidth <= innerWidth + 1")
        phone.screenshot(path=str(SHOTS / "commit-phone.png"), full_page=True)
        # A merge: both parents linked; the first parent's page opens from it.
        page.goto(f"{repo_url}commits/{shas['merge']}/")
        links = page.locator("#commit-parents a.parent")
        expect(links).to_have_count(2)
        links.first.click()
        page.wait_for_url(re.compile(rf".*/commits/{shas['main2']}/$"))
        expect(page.locator("#commit-subject")).to_have_text("main change")
        assert fired == [], fired  # no alert() ran, anywhere
        assert errors == [], errors
        browser.close()
