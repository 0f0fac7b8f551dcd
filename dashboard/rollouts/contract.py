"""The result contract of a rollout (docs/rollouts.md#result-contract): what a change of
the analysis may do to the stored results, derived from the change itself, and the check
of every paired result (the same commit stored under both versions) against it.

* :func:`expected_effect` — pure: the old and new ``AnalyzerConfig`` and code versions
  give an :class:`Expectation`. ``detect_renames`` may change only commits in which git
  reports a rename; ``ignore_whitespace`` turned on may only lower insertions and
  deletions (and drop a text file whose only change was whitespace, as ``git log -w``
  does), turned off only raise them; ``exclude_paths`` may only drop the paths its new
  patterns match (or bring back those its old ones matched), the totals following; a
  new code version may change only the fields it declares
  (``workers.analysis.DECLARED_EFFECT``, empty by default). A combined change allows
  the union.
* :func:`unexplained` / :func:`check_pairs` — pure: the differences of one commit's two
  results that the expectation does not explain.
* :func:`check_rollout` — the driver's check of the commits the new version stored
  since its last check, paired by (repository, sha) with the previous version's rows;
  the commits that changed where renames may explain them are asked of git itself, on
  the mirror (``workers.analysis.renamed_commits``), and only those. Its state is
  ``Rollout.contract``; :func:`judge_warming` folds it into the warming verdict and
  :func:`broken` rolls a verified or ramping rollout back when it fails.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Max
from django.utils import timezone

from dashboard import versions
from dashboard.models import Commit, FileChange, Rollout
from dashboard.rollouts.steps import abort_in_place
from workers import analysis
from workers.analysis import AnalyzerConfig, path_excluded, renamed_commits
from workers.git import GitError, Runner, mirror_path

__all__ = [
    "CommitRows",
    "Expectation",
    "broken",
    "check_pairs",
    "check_rollout",
    "contract_lines",
    "expectation_for",
    "expected_effect",
    "judge_warming",
    "unexplained",
]

#: Commits of the new version checked per call at most (the rest on the next tick).
BATCH = 2000
#: Violations kept on the rollout (the count of offending commits is kept whole).
KEEP = 50


@dataclass(frozen=True)
class CommitRows:
    """One commit's stored result under one version: its totals and its file rows
    ``(path, added, deleted, binary)``."""

    files_changed: int
    insertions: int
    deletions: int
    files: tuple[tuple[str, int, int, bool], ...]

    @classmethod
    def of(cls, files: Iterable[tuple[str, int, int, bool]]) -> CommitRows:
        """Rows whose totals are their files' sums (as the analysis stores them)."""
        rows = tuple(sorted(files))
        return cls(len(rows), sum(f[1] for f in rows), sum(f[2] for f in rows), rows)


@dataclass(frozen=True)
class Expectation:
    """What a change may do to a commit's result (see the module docstring)."""

    #: Commits in which git reports a rename may change in any field.
    rename_commits: bool = False
    #: ``"lower"`` (ignore_whitespace turned on), ``"raise"`` (turned off) or ``""``.
    whitespace: str = ""
    #: exclude_paths changed: a path may vanish if ``new_excludes`` match it, appear if
    #: ``old_excludes`` do.
    excludes_changed: bool = False
    old_excludes: tuple[str, ...] = ()
    new_excludes: tuple[str, ...] = ()
    #: A new code version's declared fields (``analysis.EFFECT_FIELDS``).
    declared: frozenset[str] = field(default_factory=frozenset)
    #: The code version changed (with ``declared`` empty: no change expected from it).
    code_changed: bool = False

    def describe(self) -> list[str]:
        """What may change, in words (the page, the checklist, the API)."""
        out: list[str] = []
        if self.rename_commits:
            out.append("commits in which git reports a rename may change (detect_renames)")
        if self.whitespace == "lower":
            out.append(
                "insertions and deletions may only go down; a file whose only change was "
                "whitespace may vanish (ignore_whitespace on)"
            )
        if self.whitespace == "raise":
            out.append(
                "insertions and deletions may only go up; a file whose only change was "
                "whitespace may appear (ignore_whitespace off)"
            )
        if self.excludes_changed:
            if self.new_excludes:
                out.append(f"paths matching {', '.join(self.new_excludes)} may vanish")
            if self.old_excludes:
                out.append(f"paths matching {', '.join(self.old_excludes)} may appear")
        if self.code_changed:
            fields = ", ".join(sorted(self.declared))
            out.append(
                f"the new code version may change {fields} (declared)"
                if fields
                else "the new code version declares no change"
            )
        return out or ["no change: the same numbers"]


def expected_effect(
    old: AnalyzerConfig,
    new: AnalyzerConfig,
    *,
    old_code: str,
    new_code: str,
    declared: Iterable[str] = (),
) -> Expectation:
    """The expectation of the change from (``old``, ``old_code``) to (``new``,
    ``new_code``). Pure. ``declared`` (the new code version's ``DECLARED_EFFECT``)
    counts only when the code version changed; unknown field names are refused
    (``ValueError``), so a typo cannot widen the contract silently."""
    fields = frozenset(declared)
    unknown = fields - set(analysis.EFFECT_FIELDS)
    if unknown:
        raise ValueError(
            f"unknown result field(s) {sorted(unknown)} "
            f"(known: {', '.join(analysis.EFFECT_FIELDS)})"
        )
    code_changed = old_code != new_code
    excludes_changed = old.exclude_paths != new.exclude_paths
    renames_on = old.detect_renames or new.detect_renames
    whitespace = ""
    if new.ignore_whitespace and not old.ignore_whitespace:
        whitespace = "lower"
    elif old.ignore_whitespace and not new.ignore_whitespace:
        whitespace = "raise"
    return Expectation(
        # Git applies the pathspec before rename detection (docs/analysis.md): with renames
        # on, a new exclusion turns a rename out of an excluded directory into an added
        # file. Such commits are rename commits too, so git is asked about them as well.
        rename_commits=old.detect_renames != new.detect_renames
        or (excludes_changed and renames_on),
        whitespace=whitespace,
        excludes_changed=excludes_changed,
        old_excludes=old.exclude_paths if excludes_changed else (),
        new_excludes=new.exclude_paths if excludes_changed else (),
        declared=fields if code_changed else frozenset(),
        code_changed=code_changed,
    )


def _may_move(exp: Expectation, field_name: str, before: int, after: int) -> bool:
    if before == after or field_name in exp.declared:
        return True
    return (exp.whitespace == "lower" and after < before) or (
        exp.whitespace == "raise" and after > before
    )


def unexplained(
    exp: Expectation, before: CommitRows, after: CommitRows, *, renamed: bool = False
) -> list[tuple[str, str]]:
    """The differences between one commit's two results that ``exp`` does not explain:
    ``[(field, what), …]``, empty when every difference is allowed. ``renamed``: git
    reports a rename in this commit. Pure."""
    if before == after or (renamed and exp.rename_commits):
        return []
    out: list[tuple[str, str]] = []
    old = {f[0]: f[1:] for f in before.files}
    new = {f[0]: f[1:] for f in after.files}
    for path in sorted(old.keys() - new.keys()):
        binary = old[path][2]
        if not (
            "files" in exp.declared
            or (exp.excludes_changed and path_excluded(path, exp.new_excludes))
            or (exp.whitespace == "lower" and not binary)
        ):
            out.append(("files", f"{path} vanished"))
    for path in sorted(new.keys() - old.keys()):
        binary = new[path][2]
        if not (
            "files" in exp.declared
            or (exp.excludes_changed and path_excluded(path, exp.old_excludes))
            or (exp.whitespace == "raise" and not binary)
        ):
            out.append(("files", f"{path} appeared"))
    for path in sorted(old.keys() & new.keys()):
        (a_add, a_del, a_bin), (b_add, b_del, b_bin) = old[path], new[path]
        if a_bin != b_bin:
            if "binary" not in exp.declared:
                out.append(("binary", f"{path} binary {a_bin} → {b_bin}"))
            continue  # a binary row's counts are 0/0: they follow the flag
        if not _may_move(exp, "insertions", a_add, b_add):
            out.append(("insertions", f"{path} +{a_add} → +{b_add}"))
        if not _may_move(exp, "deletions", a_del, b_del):
            out.append(("deletions", f"{path} -{a_del} → -{b_del}"))
    # The totals of a changed result must be its rows' sums: a total that moved without
    # its rows (or stayed while they moved) is a change no row explains.
    sums = (len(after.files), sum(f[1] for f in after.files), sum(f[2] for f in after.files))
    for name, label, a_total, b_total, total in (
        ("files", "files_changed", before.files_changed, after.files_changed, sums[0]),
        ("insertions", "insertions", before.insertions, after.insertions, sums[1]),
        ("deletions", "deletions", before.deletions, after.deletions, sums[2]),
    ):
        if b_total != total and name not in exp.declared:
            out.append((name, f"{label} {a_total} → {b_total}, its rows sum to {total}"))
    return out


Key = tuple[int, str]


def check_pairs(
    exp: Expectation,
    pairs: Mapping[Key, tuple[CommitRows, CommitRows]],
    renamed: Iterable[Key] = (),
) -> list[dict[str, Any]]:
    """The offending commits among ``pairs`` (``{(repository, sha): (before, after)}``):
    ``[{"repository", "sha", "fields", "detail"}, …]`` in key order; ``renamed`` are the
    keys git reports a rename in. Pure."""
    renames = set(renamed)
    out: list[dict[str, Any]] = []
    for key in sorted(pairs):
        before, after = pairs[key]
        found = unexplained(exp, before, after, renamed=key in renames)
        if found:
            out.append(
                {
                    "repository": key[0],
                    "sha": key[1],
                    "fields": sorted({f for f, _ in found}),
                    "detail": [what for _, what in found][:10],
                }
            )
    return out


# ---------------------------------------------------------------------------- the driver's check


def expectation_for(ro: Rollout) -> Expectation:
    """The expectation of ``ro``'s change (previous version → its version). The new code
    version's declaration is the one its workers reported when gitward learned the code
    (``AnalyzerVersion.declared_effect``), so a driver running the old code knows it; a
    version of the code this process runs also has the analysis package's own."""
    prev, new = ro.previous, ro.version
    assert prev is not None
    declared = set(new.declared_effect or ())
    if new.code_version == analysis.CODE_VERSION:
        declared |= set(analysis.DECLARED_EFFECT)
    return expected_effect(
        AnalyzerConfig.from_mapping(prev.config),
        AnalyzerConfig.from_mapping(new.config),
        old_code=prev.code_version,
        new_code=new.code_version,
        declared=declared,
    )


@dataclass
class _Progress:
    """What this process checked of one rollout's new version (its commit ids)."""

    seen: set[int] = field(default_factory=set)
    #: Stored under the new version, not yet under the previous one: looked at again.
    unpaired: set[int] = field(default_factory=set)
    #: The newest commit id looked at.
    top: int = 0
    changed: int = 0
    asked_git: int = 0
    renames: int = 0


# One driver checks a rollout, from its own thread: a dict entry is only touched by the
# thread that drives that rollout, and the lock guards the dict itself. A takeover
# starts with nothing seen and checks every stored commit again (bounded by BATCH per
# call), so a lost entry only costs time; the violations found stay on the row.
_PROGRESS: dict[tuple[int, str, str], _Progress] = {}
_PROGRESS_LOCK = threading.Lock()


def _progress(ro: Rollout) -> _Progress:
    key = (ro.pk, ro.version.fingerprint, ro.created_at.isoformat())
    with _PROGRESS_LOCK:
        return _PROGRESS.setdefault(key, _Progress())


def _rows(fingerprint: str, keys: Sequence[Key]) -> dict[Key, tuple[int, CommitRows]]:
    by_repo: dict[int, list[str]] = {}
    for repo, sha in keys:
        by_repo.setdefault(repo, []).append(sha)
    commits: dict[int, tuple[Key, tuple[int, int, int]]] = {}
    for repo, shas in by_repo.items():
        for pk, sha, n, ins, dels in Commit.objects.filter(
            repository_id=repo, fingerprint=fingerprint, sha__in=shas
        ).values_list("id", "sha", "files_changed", "insertions", "deletions"):
            commits[pk] = ((repo, sha), (n, ins, dels))
    files: dict[int, list[tuple[str, int, int, bool]]] = {pk: [] for pk in commits}
    for cid, path, added, deleted, binary in FileChange.objects.filter(
        commit_id__in=list(commits)
    ).values_list("commit_id", "path", "added", "deleted", "binary"):
        files[cid].append((path, added, deleted, binary))
    return {
        key: (pk, CommitRows(n, ins, dels, tuple(sorted(files[pk]))))
        for pk, (key, (n, ins, dels)) in commits.items()
    }


def _ask_git(keys: Iterable[Key]) -> tuple[set[Key], dict[Key, str]]:
    """Which of ``keys`` git reports a rename in, asked of each repository's mirror on
    this host; the keys git could not be asked about, with the reason (unexplained)."""
    by_repo: dict[int, list[str]] = {}
    for repo, sha in keys:
        by_repo.setdefault(repo, []).append(sha)
    renamed: set[Key] = set()
    failed: dict[Key, str] = {}
    for repo, shas in sorted(by_repo.items()):
        path = mirror_path(Path(settings.WORKSPACE), repo)
        try:
            found = renamed_commits(path, shas, git=Runner(git_dir=path))
        except (analysis.HistoryError, GitError, OSError) as exc:
            failed.update({(repo, s): f"git could not be asked: {exc}"[:200] for s in shas})
            continue
        renamed.update((repo, s) for s in shas if s in found)
    return renamed, failed


def check_rollout(ro: Rollout, *, token: int, phase: str) -> dict[str, Any]:
    """Check the commits ``ro``'s version stored since this process last looked (at most
    :data:`BATCH`), paired with the previous version's rows of the same repository and
    sha; store and return the contract's state (``Rollout.contract``):
    ``{"ok", "expected", "checked", "changed", "asked_git", "renames", "unpaired",
    "violating", "violations": [{"repository", "sha", "fields", "detail", "phase"}],
    "summary", "checked_at"}``. Violations accumulate; the state is written only while
    ``token`` is still the rollout's (a conditional update), so a taken-over driver
    writes nothing."""
    if ro.previous is None:
        return dict(ro.contract or {})
    exp = expectation_for(ro)
    progress = _progress(ro)
    new_fp, old_fp = ro.version.fingerprint, ro.previous.fingerprint
    # One aggregate first: nothing stored since the last look (same count, same newest
    # id) means nothing to check. A row written late with a lower id (its transaction
    # committed after a newer one) raises the count; a re-analysed commit gets a new,
    # higher id: either way the scan below runs.
    seen_now = Commit.objects.filter(fingerprint=new_fp).aggregate(n=Count("id"), top=Max("id"))
    if (
        ro.contract
        and not progress.unpaired
        and seen_now["n"] == len(progress.seen)
        and (seen_now["top"] or 0) == progress.top
    ):
        return dict(ro.contract)
    stored = list(
        Commit.objects.filter(fingerprint=new_fp)
        .order_by("id")
        .values_list("id", "repository_id", "sha")
    )
    progress.seen &= {pk for pk, _, _ in stored}  # rows deleted meanwhile (re-analysed)
    fresh = [row for row in stored if row[0] not in progress.seen][:BATCH]
    after = _rows(new_fp, [(repo, sha) for _, repo, sha in fresh])
    before = _rows(old_fp, list(after))
    pairs = {k: (before[k][1], after[k][1]) for k in after if k in before}
    changed = [k for k, (a, b) in pairs.items() if a != b]
    # Only the changed commits a rename could explain are asked of git: the cost is
    # bounded by what changed, not by what was stored.
    ask = [k for k in changed if exp.rename_commits and unexplained(exp, *pairs[k])]
    renamed, failed = _ask_git(ask) if ask else (set(), {})
    found = check_pairs(exp, pairs, renamed)
    for v in found:
        v["phase"] = phase
        why = failed.get((v["repository"], v["sha"]))
        if why:
            v["detail"].append(why)
    # An unpaired commit (the previous version has not stored it yet) is looked at again
    # on the next call: only paired ones count as seen.
    progress.seen.update(after[k][0] for k in pairs)
    progress.unpaired = {after[k][0] for k in after if k not in pairs}
    progress.top = max([progress.top, *(pk for pk, _, _ in fresh)])
    progress.changed += len(changed)
    progress.asked_git += len(ask)
    progress.renames += len(renamed)
    old_state = dict(ro.contract or {})
    known = {(v["repository"], v["sha"]) for v in old_state.get("violations") or []}
    violations = list(old_state.get("violations") or [])
    new_ones = [v for v in found if (v["repository"], v["sha"]) not in known]
    violations += new_ones
    violating = int(old_state.get("violating", 0)) + len(new_ones)
    ok = violating == 0
    state = {
        "ok": ok,
        "expected": exp.describe(),
        "checked": len(progress.seen),
        "changed": progress.changed,
        "asked_git": progress.asked_git,
        "renames": progress.renames,
        "unpaired": len(progress.unpaired),
        "violating": violating,
        "violations": violations[:KEEP],
        "summary": _summary(ok, len(progress.seen), progress.changed, violations, violating),
        "checked_at": timezone.now().isoformat(),
    }
    with transaction.atomic():
        written = Rollout.objects.filter(pk=ro.pk, lock_token=token).update(contract=state)
        if written and new_ones:
            versions.record_event(
                ro, ro.version, "contract.failed", "", "", "result-contract",
                f"{phase}: {state['summary']}", token,
                {"phase": phase, "violations": new_ones[:KEEP], "violating": violating},
            )  # fmt: skip
    if written:
        ro.contract = state
    return state


def _summary(
    ok: bool, checked: int, changed: int, violations: Sequence[Mapping[str, Any]], total: int
) -> str:
    if ok:
        return f"held: {checked} commits checked, {changed} changed, every change explained"
    named = ", ".join(f"{v['sha'][:12]} ({', '.join(v['fields'])})" for v in list(violations)[:5])
    more = f" and {total - 5} more" if total > 5 else ""
    return f"broken: {total} commit(s) changed unexplained: {named}{more}"


def judge_warming(ro: Rollout, verdict: dict[str, Any], *, token: int) -> dict[str, Any]:
    """The warming verdict with the result contract as one more check (``contract``):
    the warm commits stored so far, checked; a broken contract fails the verdict (and is
    definitive: the driver records it at once, the version goes to warm_failed)."""
    if ro.previous is None:
        return verdict
    state = check_rollout(ro, token=token, phase="warming")
    ok = bool(state.get("ok", True))
    verdict["checks"]["contract"] = ok
    verdict["contract"] = {k: state.get(k) for k in ("summary", "violating", "violations")}
    if not ok:
        verdict["ok"] = False
        summary = str(verdict.get("summary", ""))
        rest = summary.split(": ", 1)[1] if summary.startswith(("passed: ", "failed: ")) else ""
        verdict["summary"] = f"failed: result contract {state['summary']}; {rest}".rstrip("; ")
    return verdict


def broken(ro: Rollout, *, token: int, actor: Any) -> bool:
    """Check a verified or ramping rollout (each driver tick; one aggregate query when
    nothing new was stored); a broken contract rolls it back at once through
    ``abort_in_place`` — the path a failing canary takes — with the reason naming the
    offending commits. True if it was rolled back."""
    if ro.previous is None:
        return False
    percent = ro.steps[ro.step_index] if ro.version.state == "ramping" and ro.steps else None
    phase = f"step {percent}%" if percent is not None else "verified"
    state = check_rollout(ro, token=token, phase=phase)
    if state.get("ok", True):
        return False
    abort_in_place(
        ro, token=token, actor=actor, reason=f"result contract {state['summary']} ({phase})"
    )
    return True


def contract_lines(contract: Mapping[str, Any]) -> list[str]:
    """The contract's state as lines of text (the checklist and the page): its summary,
    then each offending commit with its fields and what changed."""
    if not contract:
        return []
    lines = [str(contract.get("summary", ""))]
    for v in contract.get("violations") or []:
        lines.append(
            f"{v.get('phase', '')}: repository {v['repository']} commit {v['sha']}: "
            f"{', '.join(v['fields'])} — {'; '.join(v['detail'])}"
        )
    return lines
