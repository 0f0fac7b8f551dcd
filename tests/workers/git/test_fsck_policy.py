"""The fsck policy table (workers/git/fsck_policy.py): it covers every message id the
installed git knows, at git's own default severities, docs/security.md shows exactly
that table, and git applies it to a real fetch."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.gitrepo import Forge
from workers.git import fsck_policy
from workers.git.fsck_policy import RULES, fetch_config, rule_for
from workers.git.runner import HARDENED_CONFIG, Runner

ROOT = Path(__file__).resolve().parents[3]
ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "HOME": "/nonexistent",
}


def camel(upper: str) -> str:
    """git's own spelling of an id (``fsck.c``: ``BAD_DATE`` → ``badDate``)."""
    head, *rest = upper.lower().split("_")
    return head + "".join(part.capitalize() for part in rest)


def git_binary_ids() -> list[str]:
    """The ``FOREACH_FSCK_MSG_ID`` names compiled into the installed git, in order."""
    found = subprocess.run(["git", "--exec-path"], capture_output=True, text=True, env=ENV)
    exe = Path(found.stdout.strip()) / "git"
    data = (exe if exe.exists() else Path(shutil.which("git") or "git")).read_bytes()
    start = data.index(b"\0NUL_IN_HEADER\0") + 1
    end = data.index(b"\0", data.index(b"EXTRA_HEADER_ENTRY", start))
    return [camel(name.decode()) for name in data[start:end].split(b"\0") if name]


def documented_rows() -> list[tuple[str, str, str, str]]:
    page = (ROOT / "docs" / "security.md").read_text()
    return re.findall(
        r"^\| `(\w+)` \| (fatal|error|warn|info|ignore) \| (accept|refuse) \| (.+) \|$",
        page,
        flags=re.M,
    )


def test_the_documented_table_is_the_code_table() -> None:
    rows = documented_rows()
    assert rows == [(r.msg_id, r.severity, r.decision, r.reason) for r in RULES]


def test_the_table_covers_every_msg_id_compiled_into_git(tmp_path: Path) -> None:
    compiled = git_binary_ids()
    assert len(compiled) > 40  # the scan itself works
    table = [r.msg_id for r in RULES]
    assert set(compiled) <= set(table), "git knows ids the table does not classify"
    # Every id of the table is one git accepts as a config key (an unknown one dies).
    args = [a for r in RULES for a in ("-c", f"fsck.{r.msg_id}=error")]
    probe = tmp_path / "probe.git"
    subprocess.run(["git", "init", "-q", "--bare", str(probe)], env=ENV, check=True)
    proc = subprocess.run(
        ["git", "--git-dir", str(probe), *args, "fsck"], capture_output=True, text=True, env=ENV
    )
    assert "Unhandled message id" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr


def test_the_default_severities_are_those_of_git_s_manual() -> None:
    found = subprocess.run(["git", "--man-path"], capture_output=True, text=True, env=ENV)
    man = Path(found.stdout.strip() or "/usr/share/man") / "man1" / "git-fsck.1.gz"
    if not man.exists():
        pytest.skip("git's manual is not installed")
    text = gzip.decompress(man.read_bytes()).decode("utf-8", "replace")
    documented = dict(
        re.findall(r"^\\fB(\w+)\\fR\n\.RS 4\n\((FATAL|ERROR|WARN|INFO|IGNORE)\)", text, re.M)
    )
    assert len(documented) > 40
    assert {r.msg_id: r.severity.upper() for r in RULES} == documented


def test_fetch_config_ignores_accepted_and_errors_refused_ids() -> None:
    config = dict(fetch_config())
    for rule in RULES:
        key = f"fetch.fsck.{rule.msg_id}"
        if rule.severity == "fatal":
            assert key not in config  # git dies if asked to demote a fatal id
        else:
            assert config[key] == ("ignore" if rule.decision == "accept" else "error")
    assert set(fetch_config()) <= set(HARDENED_CONFIG)
    assert rule_for("ZEROPADDEDFILEMODE") is rule_for("zeroPaddedFilemode")
    assert {"zeroPaddedFilemode", "badTimezone", "missingSpaceBeforeDate"} <= set(
        fsck_policy.accepted_ids()
    )
    refused = {r.msg_id for r in RULES if r.decision == "refuse"}
    assert {"hasDotgit", "hasDotdot", "gitmodulesName", "gitmodulesSymlink"} <= refused


def legacy_origin(tmp_path: Path) -> Forge:
    """Two warnings real histories carry (docs/analysis.md): a zero-padded tree mode and a
    bad time zone."""
    f = Forge.create(tmp_path / "legacy.git")
    blob = f.blob("x\n")
    sub = f.tree([("100644", "a.txt", blob)])
    tree = f.tree([("040000", "dir", sub)])
    f.commit(tree, author="Ada <ada@example.com> 1100000000 +51800")
    return f


def fetch(tmp_path: Path, origin: Path, *config: str) -> subprocess.CompletedProcess[str]:
    target = tmp_path / f"fetch-{len(list(tmp_path.iterdir()))}.git"
    subprocess.run(["git", "init", "-q", "--bare", str(target)], env=ENV, check=True)
    return subprocess.run(
        ["git", *config, "--git-dir", str(target), "fetch", "-q", "--no-tags", str(origin),
         "+refs/heads/main:refs/x"],
        capture_output=True,
        text=True,
        env=ENV,
    )  # fmt: skip


def test_plain_transfer_fsck_refuses_legacy_findings_and_the_policy_accepts_them(
    tmp_path: Path,
) -> None:
    origin = legacy_origin(tmp_path).path
    plain = fetch(tmp_path, origin, "-c", "transfer.fsckObjects=true")
    assert plain.returncode != 0
    assert re.search(r"(badTimezone|zeroPaddedFilemode):", plain.stderr)
    # receive.fsck.* and fsck.* do not apply to a fetch: git reads fetch.fsck.* only.
    others = [
        a
        for msg_id in ("badTimezone", "zeroPaddedFilemode")
        for a in ("-c", f"fsck.{msg_id}=ignore", "-c", f"receive.fsck.{msg_id}=ignore")
    ]
    assert fetch(tmp_path, origin, "-c", "transfer.fsckObjects=true", *others).returncode != 0
    # gitward's own runner (the hardened config with the policy) fetches it.
    target = tmp_path / "gitward.git"
    runner = Runner()
    runner.run(["init", "-q", "--bare", str(target)])
    runner.run(
        [
            "--git-dir",
            str(target),
            "fetch",
            "-q",
            "--no-tags",
            str(origin),
            "+refs/heads/main:refs/x",
        ]
    )
    assert runner.run(["--git-dir", str(target), "rev-parse", "refs/x"]).strip()
