"""The result contract (docs/rollouts.md#result-contract): the expectation derived from
a change, the check of constructed row pairs against it (unit tests and a Hypothesis
property: only allowed effects pass, any other perturbation fails), and the driver's
check over real analysed rows and real git (``check_rollout``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from dashboard.models import AnalyzerVersion, FileChange, Rollout, RolloutEvent
from dashboard.rollouts import contract, steps
from dashboard.rollouts.contract import CommitRows, Expectation, expected_effect, unexplained
from tests.support.rollouts import (
    _release_drivers,  # noqa: F401 (fixture)
    analyse_as,
    analysed,
    start,
    verify,
)
from workers.analysis import AnalyzerConfig, path_excluded

C = AnalyzerConfig


def effect(old: AnalyzerConfig, new: AnalyzerConfig, **kw: object) -> Expectation:
    return expected_effect(
        old,
        new,
        old_code=str(kw.get("old_code", "1")),
        new_code=str(kw.get("new_code", "1")),
        declared=kw.get("declared", ()),
    )


def rows(*files: tuple[str, int, int] | tuple[str, int, int, bool]) -> CommitRows:
    return CommitRows.of((f[0], f[1], f[2], bool(f[3]) if len(f) > 3 else False) for f in files)


# ---------------------------------------------------------------------------- the expectation


def test_the_same_version_expects_no_change() -> None:
    exp = effect(C(), C())
    assert exp == Expectation()
    assert exp.describe() == ["no change: the same numbers"]
    before = rows(("a.py", 3, 1))
    assert unexplained(exp, before, before) == []
    assert unexplained(exp, before, rows(("a.py", 4, 1))) == [("insertions", "a.py +3 → +4")]


def test_each_key_gives_its_own_effect() -> None:
    assert effect(C(), C(detect_renames=True)) == Expectation(rename_commits=True)
    assert effect(C(detect_renames=True), C()) == Expectation(rename_commits=True)
    assert effect(C(), C(ignore_whitespace=True)) == Expectation(whitespace="lower")
    assert effect(C(ignore_whitespace=True), C()) == Expectation(whitespace="raise")
    assert effect(C(), C(exclude_paths=("vendor/**",))) == Expectation(
        excludes_changed=True, new_excludes=("vendor/**",)
    )
    # Combined changes: the union of their effects.
    both = effect(C(), C(detect_renames=True, ignore_whitespace=True, exclude_paths=("x",)))
    assert both == Expectation(
        rename_commits=True, whitespace="lower", excludes_changed=True, new_excludes=("x",)
    )
    # With renames on, a new exclusion may turn a rename into an added file: git is asked.
    assert effect(C(detect_renames=True), C(detect_renames=True, exclude_paths=("x",))) == (
        Expectation(rename_commits=True, excludes_changed=True, new_excludes=("x",))
    )


def test_a_code_version_expects_no_change_unless_it_declares_one() -> None:
    exp = effect(C(), C(), old_code="1", new_code="2")
    assert exp == Expectation(code_changed=True)
    assert exp.describe() == ["the new code version declares no change"]
    before, after = rows(("a.py", 3, 1)), rows(("a.py", 4, 1))
    assert unexplained(exp, before, after) == [("insertions", "a.py +3 → +4")]
    declared = effect(C(), C(), old_code="1", new_code="2", declared={"insertions"})
    assert unexplained(declared, before, after) == []
    assert unexplained(declared, before, rows(("a.py", 3, 2))) == [("deletions", "a.py -1 → -2")]
    # A declaration without a code change declares nothing; a typo is refused.
    assert effect(C(), C(), declared={"insertions"}) == Expectation()
    with pytest.raises(ValueError, match="unknown result field"):
        effect(C(), C(), old_code="1", new_code="2", declared={"inserts"})


# ---------------------------------------------------------------------------- each change's effect


def test_ignore_whitespace_may_lower_counts_and_is_caught_raising_one() -> None:
    exp = effect(C(), C(ignore_whitespace=True))
    before = rows(("a.py", 5, 4), ("b.py", 2, 2), ("logo.png", 0, 0, True))
    # lower counts, and drop b.py whose only change was whitespace (git log -w drops it)
    assert unexplained(exp, before, rows(("a.py", 3, 4), ("logo.png", 0, 0, True))) == []
    assert unexplained(
        exp, before, rows(("a.py", 6, 4), ("b.py", 2, 2), ("logo.png", 0, 0, 1))
    ) == [("insertions", "a.py +5 → +6")]
    assert unexplained(
        exp, before, rows(("a.py", 5, 5), ("b.py", 2, 2), ("logo.png", 0, 0, 1))
    ) == [("deletions", "a.py -4 → -5")]
    # never a new file, never a binary file dropped
    assert ("files", "c.py appeared") in unexplained(
        exp, before, rows(("a.py", 5, 4), ("b.py", 2, 2), ("c.py", 0, 0), ("logo.png", 0, 0, 1))
    )
    assert unexplained(exp, before, rows(("a.py", 5, 4), ("b.py", 2, 2))) == [
        ("files", "logo.png vanished")
    ]
    # turned off: the other way round
    back = effect(C(ignore_whitespace=True), C())
    assert unexplained(back, rows(("a.py", 3, 4)), rows(("a.py", 5, 4), ("b.py", 2, 2))) == []
    assert unexplained(back, rows(("a.py", 3, 4)), rows(("a.py", 2, 4))) == [
        ("insertions", "a.py +3 → +2")
    ]


def test_exclude_paths_may_drop_only_matching_paths() -> None:
    exp = effect(C(), C(exclude_paths=("vendor/**", "**/*.min.js")))
    before = rows(("src/a.py", 5, 1), ("vendor/x/y.js", 7, 0), ("web/app.min.js", 9, 9))
    assert unexplained(exp, before, rows(("src/a.py", 5, 1))) == []
    # dropping a path no pattern matches is caught, and so is any count moving
    assert unexplained(exp, before, rows(("vendor/x/y.js", 7, 0))) == [
        ("files", "src/a.py vanished")
    ]
    assert unexplained(exp, before, rows(("src/a.py", 4, 1))) == [
        ("insertions", "src/a.py +5 → +4")
    ]
    # totals must follow the rows
    lying = CommitRows(1, 12, 1, (("src/a.py", 5, 1, False),))
    assert unexplained(exp, before, lying) == [
        ("insertions", "insertions 21 → 12, its rows sum to 5")
    ]
    # removing a pattern brings its paths back, and only those
    back = effect(C(exclude_paths=("vendor/**",)), C())
    assert (
        unexplained(back, rows(("src/a.py", 5, 1)), rows(("src/a.py", 5, 1), ("vendor/z", 1, 0)))
        == []
    )
    assert unexplained(
        back, rows(("src/a.py", 5, 1)), rows(("src/a.py", 5, 1), ("lib/z", 1, 0))
    ) == [("files", "lib/z appeared")]


def test_detect_renames_may_change_only_commits_git_reports_a_rename_in() -> None:
    exp = effect(C(), C(detect_renames=True))
    before = rows(("a.py", 0, 40), ("b.py", 40, 0))
    after = CommitRows.of([("b.py", 0, 0, False)])
    assert unexplained(exp, before, after, renamed=True) == []
    assert unexplained(exp, before, after, renamed=False) == [
        ("files", "a.py vanished"),
        ("insertions", "b.py +40 → +0"),
    ]


def test_check_pairs_names_the_offending_commits_and_fields() -> None:
    exp = effect(C(), C(exclude_paths=("vendor/**",)))
    pairs = {
        (1, "aaa"): (rows(("src/a.py", 1, 0), ("vendor/v", 1, 0)), rows(("src/a.py", 1, 0))),
        (1, "bbb"): (rows(("src/a.py", 1, 0)), rows(("src/a.py", 2, 0))),
        (2, "ccc"): (rows(("lib/l", 1, 0)), rows()),
    }
    assert contract.check_pairs(exp, pairs) == [
        {
            "repository": 1,
            "sha": "bbb",
            "fields": ["insertions"],
            "detail": ["src/a.py +1 → +2"],
        },
        {
            "repository": 2,
            "sha": "ccc",
            "fields": ["files"],
            "detail": ["lib/l vanished"],
        },
    ]


# ---------------------------------------------------------------------------- the property

PATHS = [
    f"{d}{n}"
    for d in ("", "src/", "vendor/", "vendor/a/", "docs/", "web/js/")
    for n in ("a.py", "b.js", "c.min.js", "README.md", "logo.png")
]
PATTERNS = ["vendor/**", "**/*.min.js", "docs", "*.md", "web/*/b.js", "src/?.py"]
FIELDS = ("files", "insertions", "deletions", "binary")


@st.composite
def change(draw: st.DrawFn) -> tuple[Expectation, AnalyzerConfig, AnalyzerConfig, CommitRows]:
    """A change (two configs, two code versions with a declaration) and one commit's
    result under the old version: only paths the old config does not exclude."""

    def config() -> AnalyzerConfig:
        return AnalyzerConfig(
            detect_renames=draw(st.booleans()),
            ignore_whitespace=draw(st.booleans()),
            exclude_paths=tuple(draw(st.lists(st.sampled_from(PATTERNS), max_size=2))),
        )

    old, new = config(), config()
    code_changed = draw(st.booleans())
    declared = draw(st.frozensets(st.sampled_from(FIELDS))) if code_changed else frozenset()
    exp = expected_effect(
        old, new, old_code="1", new_code="2" if code_changed else "1", declared=declared
    )
    paths = draw(st.lists(st.sampled_from(PATHS), unique=True, max_size=8))
    files = []
    for p in paths:
        if path_excluded(p, old.exclude_paths):
            continue
        binary = p.endswith(".png")
        n = (0, 0) if binary else (draw(st.integers(0, 50)), draw(st.integers(0, 50)))
        files.append((p, n[0], n[1], binary))
    return exp, old, new, CommitRows.of(files)


def allowed_result(draw: st.DrawFn, exp: Expectation, before: CommitRows) -> CommitRows:
    """``before`` changed by allowed effects only (chosen at random)."""
    out: dict[str, tuple[int, int, bool]] = {}
    for path, added, deleted, binary in before.files:
        if exp.excludes_changed and path_excluded(path, exp.new_excludes) and draw(st.booleans()):
            continue  # excluded now
        if exp.whitespace == "lower" and not binary:
            if draw(st.booleans()):
                continue  # only whitespace changed in it
            added, deleted = draw(st.integers(0, added)), draw(st.integers(0, deleted))
        if exp.whitespace == "raise" and not binary:
            added += draw(st.integers(0, 5))
            deleted += draw(st.integers(0, 5))
        if "insertions" in exp.declared:
            added = draw(st.integers(0, 60))
        if "deletions" in exp.declared:
            deleted = draw(st.integers(0, 60))
        if "binary" in exp.declared and draw(st.booleans()):
            binary = not binary
            added, deleted = (0, 0) if binary else (added, deleted)
        out[path] = (added, deleted, binary)
    for path in PATHS:
        if path in out or any(f[0] == path for f in before.files):
            continue
        back = exp.excludes_changed and path_excluded(path, exp.old_excludes)
        text = not path.endswith(".png")
        if (back or (exp.whitespace == "raise" and text) or "files" in exp.declared) and draw(
            st.booleans()
        ):
            out[path] = (draw(st.integers(0, 9)), draw(st.integers(0, 9)), not text)
    return CommitRows.of((p, a, d, b) for p, (a, d, b) in out.items())


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), case=change())
def test_any_result_made_of_allowed_effects_passes(
    data: st.DataObject, case: tuple[Expectation, AnalyzerConfig, AnalyzerConfig, CommitRows]
) -> None:
    exp, _, _, before = case
    after = allowed_result(data.draw, exp, before)
    assert unexplained(exp, before, after) == []
    # a commit git reports a rename in may change in any way under a rename change
    if exp.rename_commits:
        anything = CommitRows.of([("x/y.py", 1, 2, False)])
        assert unexplained(exp, before, anything, renamed=True) == []


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), case=change())
def test_any_other_perturbation_fails(
    data: st.DataObject, case: tuple[Expectation, AnalyzerConfig, AnalyzerConfig, CommitRows]
) -> None:
    exp, _, _, before = case
    after = allowed_result(data.draw, exp, before)
    rows_after = {f[0]: f for f in after.files}
    kept = [f for f in before.files if f[0] in rows_after and not f[3]]
    options: list[tuple[str, object]] = []
    if "insertions" not in exp.declared and exp.whitespace != "raise":
        options += [("raise_insertions", f) for f in kept]
    if "deletions" not in exp.declared and exp.whitespace != "lower":
        options += [("lower_deletions", f) for f in kept if f[2] > 0]
    if "files" not in exp.declared:
        options += [
            ("drop", f)
            for f in before.files
            if f[0] in rows_after
            and (exp.whitespace != "lower" or f[3])
            and not (exp.excludes_changed and path_excluded(f[0], exp.new_excludes))
        ]
        options += [
            ("add", p)
            for p in PATHS
            if p not in rows_after
            and not any(f[0] == p for f in before.files)
            and not (exp.excludes_changed and path_excluded(p, exp.old_excludes))
            and (exp.whitespace != "raise" or p.endswith(".png"))
        ]
        options.append(("total", None))
    if "binary" not in exp.declared:
        options += [("flip", f) for f in before.files if f[0] in rows_after]
    if not options:
        return  # everything this commit has may change: nothing to perturb
    kind, target = data.draw(st.sampled_from(options))
    files = dict(rows_after)
    if kind == "raise_insertions":
        f = target
        files[f[0]] = (f[0], f[1] + data.draw(st.integers(1, 5)), rows_after[f[0]][2], False)
    elif kind == "lower_deletions":
        f = target
        files[f[0]] = (f[0], rows_after[f[0]][1], f[2] - data.draw(st.integers(1, f[2])), False)
    elif kind == "drop":
        del files[target[0]]
    elif kind == "add":
        files[str(target)] = (str(target), 1, 0, str(target).endswith(".png"))
    elif kind == "flip":
        p, a, d, b = rows_after[target[0]]
        files[p] = (p, a, d, not b)
    perturbed = CommitRows.of(files.values())
    if kind == "total":
        perturbed = CommitRows(
            after.files_changed + 1, after.insertions, after.deletions, after.files
        )
    assert unexplained(exp, before, perturbed, renamed=False), (kind, target)


# ---------------------------------------------------------------------------- the driver's check


def renames_in(origin_path: Path) -> set[str]:
    """The commits in which ``git log -M`` reports a rename, asked of git directly."""
    import subprocess

    out = subprocess.run(
        ["git", "log", "-M", "--diff-filter=R", "--format=%H", "--no-merges"],
        cwd=origin_path, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return set(out.split())


@pytest.mark.django_db(transaction=True)
def test_a_rename_rollout_holds_its_contract_on_real_rows_and_real_git(tmp_path: Path) -> None:
    repo, origin = analysed(tmp_path, "r")
    ro, driver = start({"detect_renames": True})
    token = int(driver.token or 0)
    shas = origin.shas()
    analyse_as(ro.version, repo, shas)
    ro = Rollout.objects.select_related("version", "previous").get(pk=ro.pk)
    state = contract.check_rollout(ro, token=token, phase="warming")
    renamed = renames_in(origin.path)
    assert len(renamed) == 2  # the fixture's two renames
    keys = [(repo.pk, sha) for sha in shas]
    old, new = (
        contract._rows(ro.previous.fingerprint, keys),
        contract._rows(ro.version.fingerprint, keys),
    )
    assert {k[1] for k in keys if old[k][1] != new[k][1]} == renamed
    assert state["ok"] is True, state
    assert (state["checked"], state["changed"], state["violating"]) == (len(shas), 2, 0)
    # git was asked about the changed commits only, and named each one a rename
    assert (state["asked_git"], state["renames"]) == (2, 2)
    assert state["expected"] == [
        "commits in which git reports a rename may change (detect_renames)"
    ]
    assert Rollout.objects.get(pk=ro.pk).contract == state
    # nothing new stored: the next check looks at nothing again
    again = contract.check_rollout(ro, token=token, phase="warming")
    assert (again["checked"], again["changed"], again["asked_git"]) == (len(shas), 2, 2)


@pytest.mark.django_db(transaction=True)
def test_a_changed_row_the_change_does_not_explain_breaks_the_contract(tmp_path: Path) -> None:
    repo, origin = analysed(tmp_path, "r")
    ro, driver = start({"exclude_paths": ["nothing/**"]})
    token = int(driver.token or 0)
    shas = origin.shas()
    analyse_as(ro.version, repo, shas)
    # the new version's row of one commit gains a line no change explains
    victim = shas[2]
    row = FileChange.objects.filter(commit__sha=victim, fingerprint=ro.version.fingerprint).get()
    row.added += 1
    row.save(update_fields=["added"])
    row.commit.insertions += 1
    row.commit.save(update_fields=["insertions"])
    ro = Rollout.objects.select_related("version", "previous").get(pk=ro.pk)
    verdict = {"ok": True, "checks": {"errors": True}, "summary": "passed: all good"}
    judged = contract.judge_warming(ro, verdict, token=token)
    assert judged["ok"] is False and judged["checks"]["contract"] is False
    assert judged["summary"].startswith("failed: result contract broken: 1 commit(s) changed")
    assert victim[:12] in judged["summary"]
    state = Rollout.objects.get(pk=ro.pk).contract
    assert state["violations"] == [
        {
            "repository": repo.pk,
            "sha": victim,
            "fields": ["insertions"],
            "detail": [f"{row.path} +{row.added - 1} → +{row.added}"],
            "phase": "warming",
        }
    ]
    assert state["asked_git"] == 0  # no rename could explain it: git not asked
    event = RolloutEvent.objects.get(rollout=ro, action="contract.failed")
    assert event.detail["violations"] == state["violations"]


@pytest.mark.django_db(transaction=True)
def test_a_broken_contract_on_a_ramp_step_rolls_the_rollout_back(tmp_path: Path) -> None:
    repo, origin = analysed(tmp_path, "r")
    ro, driver = start({"ignore_whitespace": True}, steps=[10, 100])
    token = int(driver.token or 0)
    verify(ro, driver)
    ro = steps.set_ramp(rollout=ro, percent=10, token=token, actor="alice")
    ro = Rollout.objects.select_related("version", "previous").get(pk=ro.pk)
    assert contract.broken(ro, token=token, actor="alice") is False  # nothing stored yet
    shas = origin.shas()
    analyse_as(ro.version, repo, shas)
    FileChange.objects.filter(fingerprint=ro.version.fingerprint, commit__sha=shas[0]).update(
        deleted=99
    )
    ro = Rollout.objects.select_related("version", "previous").get(pk=ro.pk)
    assert contract.broken(ro, token=token, actor="alice") is True
    ro = Rollout.objects.select_related("version").get(pk=ro.pk)
    assert ro.state == Rollout.State.ROLLING_BACK
    assert ro.version.state == AnalyzerVersion.State.DRAINING
    back = RolloutEvent.objects.filter(rollout=ro, action="rollout", to_state="rolling_back").get()
    assert back.reason.startswith("result contract broken: 1 commit(s) changed unexplained: ")
    assert shas[0][:12] in back.reason and back.reason.endswith("(step 10%)")
    assert ro.contract["violations"][0]["phase"] == "step 10%"
    assert "deletions" in ro.contract["violations"][0]["fields"]


@pytest.mark.django_db(transaction=True)
def test_a_taken_over_driver_writes_no_contract(tmp_path: Path) -> None:
    repo, origin = analysed(tmp_path, "r")
    ro, driver = start({"detect_renames": True})
    analyse_as(ro.version, repo, origin.shas())
    ro = Rollout.objects.select_related("version", "previous").get(pk=ro.pk)
    stale = int(driver.token or 0) - 1
    contract.check_rollout(ro, token=stale, phase="warming")
    assert Rollout.objects.get(pk=ro.pk).contract == {}


@pytest.mark.django_db(transaction=True)
def test_the_driver_rolls_a_manual_ramp_step_back_by_itself(tmp_path: Path) -> None:
    """No operator acts: the driver's own tick checks the step and rolls it back."""
    repo, origin = analysed(tmp_path, "r")
    ro, driver = start({"detect_renames": True}, steps=[50, 100])  # manual steps
    token = int(driver.token or 0)
    verify(ro, driver)
    steps.set_ramp(rollout=ro, percent=50, token=token, actor="alice")
    shas = origin.shas()
    analyse_as(ro.version, repo, shas)
    renamed = renames_in(origin.path)
    plain = next(s for s in shas if s not in renamed)  # a commit with no rename
    FileChange.objects.filter(fingerprint=ro.version.fingerprint, commit__sha=plain).update(
        path="elsewhere.txt"
    )
    assert driver.tick() is True  # still active: rolling back, draining
    ro = Rollout.objects.select_related("version").get(pk=ro.pk)
    assert ro.state == Rollout.State.ROLLING_BACK
    assert [(v["sha"], v["fields"], v["phase"]) for v in ro.contract["violations"]] == [
        (plain, ["files"], "step 50%")
    ]
    # the rename commits changed too and git explained them; git was asked about the
    # changed commits only (the renames and the perturbed one, which it did not explain)
    assert ro.contract["changed"] == len(renamed) + 1
    assert ro.contract["asked_git"] == len(renamed) + 1
    assert ro.contract["renames"] == len(renamed)


@pytest.mark.django_db(transaction=True)
def test_a_new_code_version_is_held_to_what_its_code_declares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The declaration is read from the analysis package this process runs, only when it
    is the new version's code; another code version declares nothing."""
    import workers.analysis

    ro, _driver = start({"ignore_whitespace": True})
    AnalyzerVersion.objects.filter(pk=ro.version_id).update(code_version="2")
    ro = Rollout.objects.select_related("version", "previous").get(pk=ro.pk)
    assert ro.previous is not None and ro.previous.code_version == workers.analysis.CODE_VERSION
    # this process runs the previous version's code: version 2's declaration is unknown here
    assert contract.expectation_for(ro) == Expectation(whitespace="lower", code_changed=True)
    # ... unless its workers reported it when gitward learned the code (stored on the row)
    AnalyzerVersion.objects.filter(pk=ro.version_id).update(declared_effect=["deletions"])
    ro = Rollout.objects.select_related("version", "previous").get(pk=ro.pk)
    assert contract.expectation_for(ro) == Expectation(
        whitespace="lower", code_changed=True, declared=frozenset({"deletions"})
    )
    AnalyzerVersion.objects.filter(pk=ro.version_id).update(declared_effect=[])
    ro = Rollout.objects.select_related("version", "previous").get(pk=ro.pk)
    monkeypatch.setattr(workers.analysis, "CODE_VERSION", "2")
    monkeypatch.setattr(workers.analysis, "DECLARED_EFFECT", frozenset({"binary"}))
    assert contract.expectation_for(ro) == Expectation(
        whitespace="lower", code_changed=True, declared=frozenset({"binary"})
    )
    assert contract.expectation_for(ro).describe()[-1] == (
        "the new code version may change binary (declared)"
    )
