"""The commit page in a real headless Chromium against `manage.py up`: a
fixture whose commit message, author and file names hold script payloads is analysed,
its commit is opened from the repository page's commit table, and every payload is
text: no dialog fires, no element is injected, the title holds no markup. Screenshots:
artifacts/screenshots/commit.png and commit-phone.png."""

from __future__ import annotations

import re

import pytest

from tests.support.gitrepo import PAYLOADS, hostile_commits
from tests.support.sysproc import CHROMIUM, CHROMIUM_ARGS
from tests.system.test_browser import OVERFLOWING, SHOTS, system  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

INJECTED = """() => ({
    imgs: document.querySelectorAll('main img').length,
    inlineScripts: [...document.scripts].filter((s) => !s.src).length,
    handlers: [...document.querySelectorAll('main *')].filter(
        (e) => [...e.attributes].some((a) => a.name.startsWith('on'))).length,
})"""


def test_a_hostile_commit_page_shows_its_payloads_as_text(system) -> None:  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    base, tmp = system
    shas = hostile_commits(tmp / "hostile")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
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
