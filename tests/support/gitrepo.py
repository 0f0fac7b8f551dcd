"""Real git repositories built in temporary folders, and what git itself reports."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class GitRepo:
    path: Path
    clock: int = 1_700_000_000
    tz: str = "+0000"
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, path: Path, *, branch: str = "main") -> GitRepo:
        path.mkdir(parents=True, exist_ok=True)
        repo = cls(path)
        repo.git("init", "--quiet", "-b", branch)
        return repo

    def git(self, *args: str, input: bytes | None = None, **env: str) -> str:
        full_env = {
            **os.environ,
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_AUTHOR_NAME": "Ada Lovelace",
            "GIT_AUTHOR_EMAIL": "ada@example.com",
            "GIT_COMMITTER_NAME": "Ada Lovelace",
            "GIT_COMMITTER_EMAIL": "ada@example.com",
            **self.env,
            **env,
        }
        out = subprocess.run(
            ["git", "-c", "core.quotepath=off", *args],
            cwd=self.path,
            env=full_env,
            input=input,
            capture_output=True,
            check=True,
        )
        return out.stdout.decode("utf-8", "replace")

    def write(self, name: str, content: str | bytes) -> None:
        target = self.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)

    def commit(
        self,
        message: str,
        files: dict[str, str | bytes | None] | None = None,
        *,
        author: tuple[str, str] | None = None,
        tz: str | None = None,
        allow_empty: bool = False,
    ) -> str:
        for name, content in (files or {}).items():
            if content is None:
                self.git("rm", "--quiet", "--", name)
            else:
                self.write(name, content)
                self.git("add", "--", name)
        self.clock += 3600
        date = f"{self.clock} {tz or self.tz}"
        env = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        if author:
            env.update(GIT_AUTHOR_NAME=author[0], GIT_AUTHOR_EMAIL=author[1])
        args = ["commit", "--quiet", "-m", message]
        if allow_empty:
            args.append("--allow-empty")
        self.git(*args, **env)
        return self.head()

    def head(self) -> str:
        return self.git("rev-parse", "HEAD").strip()

    def shas(self) -> list[str]:
        return self.git("rev-list", "HEAD").split()


def reference_commits(path: Path, ref: str = "HEAD") -> dict[str, dict[str, Any]]:
    """Every commit reachable from ``ref`` as git reports it, one git call per commit
    (deliberately unlike gitward's single streaming process)."""
    repo = GitRepo(path)
    out: dict[str, dict[str, Any]] = {}
    for sha in repo.git("rev-list", ref).split():
        meta = (
            repo.git(
                "show", "-s", "--format=%P%x00%an%x00%ae%x00%aI%x00%cn%x00%ce%x00%cI%x00%s", sha
            )
            .rstrip("\n")
            .split("\x00")
        )
        parents = meta[0].split()
        base = parents[0] if parents else "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
        raw = repo.git("diff-tree", "-r", "-z", "--numstat", "--no-renames", base, sha)
        files = []
        parts = raw.split("\x00")
        for entry in parts:
            if not entry:
                continue
            added, deleted, p = entry.split("\t", 2)
            binary = added == "-"
            files.append((p, 0 if binary else int(added), 0 if binary else int(deleted), binary))
        out[sha] = {
            "sha": sha,
            "parents": parents,
            "author_name": meta[1],
            "author_email": meta[2],
            "authored_at": meta[3],
            "committer_name": meta[4],
            "committer_email": meta[5],
            "committed_at": meta[6],
            "subject": meta[7],
            "is_merge": len(parents) > 1,
            "files": sorted(files),
            "files_changed": len(files),
            "insertions": sum(f[1] for f in files),
            "deletions": sum(f[2] for f in files),
        }
    return out


EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


@dataclass
class Forge:
    """A bare repository whose objects are written by hand (``hash-object --literally``,
    ``mktree``, ``fast-import``): histories git itself would not write."""

    path: Path

    @classmethod
    def create(cls, path: Path, *, head: str = "main") -> Forge:
        subprocess.run(
            ["git", "init", "--quiet", "--bare", str(path)],
            env=_plain_env(),
            check=True,
            capture_output=True,
        )
        forge = cls(path)
        forge.git("symbolic-ref", "HEAD", f"refs/heads/{head}")
        return forge

    def git(self, *args: str, input: bytes | None = None, **env: str) -> str:
        out = subprocess.run(
            ["git", "--git-dir", str(self.path), *args],
            env={**_plain_env(), **env},
            input=input,
            capture_output=True,
            check=True,
        )
        return out.stdout.decode("utf-8", "replace").strip()

    def blob(self, data: bytes | str) -> str:
        raw = data.encode() if isinstance(data, str) else data
        return self.git("hash-object", "-w", "--stdin", input=raw)

    def tree(self, entries: list[tuple[str, str, str]]) -> str:
        """A tree from ``(mode, name, sha)`` written byte for byte, in the given order
        (so zero-padded modes, unsorted or odd names survive)."""
        raw = b"".join(
            mode.encode() + b" " + name.encode() + b"\0" + bytes.fromhex(sha)
            for mode, name, sha in entries
        )
        return self.git("hash-object", "-t", "tree", "--literally", "-w", "--stdin", input=raw)

    def commit(
        self,
        tree: str,
        *,
        parents: tuple[str, ...] = (),
        author: str = "Ada Lovelace <ada@example.com> 1700000000 +0000",
        committer: str | None = None,
        message: bytes | str = "m\n",
        headers: tuple[str, ...] = (),
        ref: str | None = "refs/heads/main",
    ) -> str:
        """A commit object written verbatim (``author``/``committer`` lines as given)."""
        lines = [f"tree {tree}", *(f"parent {p}" for p in parents)]
        lines += [f"author {author}", f"committer {committer or author}", *headers]
        body = message.encode() if isinstance(message, str) else message
        raw = "\n".join(lines).encode() + b"\n\n" + body
        sha = self.git("hash-object", "-t", "commit", "--literally", "-w", "--stdin", input=raw)
        if ref:
            self.git("update-ref", ref, sha)
        return sha

    def fast_import(self, stream: bytes) -> None:
        self.git("fast-import", "--quiet", input=stream)


def _plain_env() -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "Ada Lovelace",
        "GIT_AUTHOR_EMAIL": "ada@example.com",
        "GIT_COMMITTER_NAME": "Ada Lovelace",
        "GIT_COMMITTER_EMAIL": "ada@example.com",
        "GIT_AUTHOR_DATE": "1700000000 +0000",
        "GIT_COMMITTER_DATE": "1700000000 +0000",
    }


def fsck_findings(path: Path, *, strict: bool = False) -> set[tuple[str, str]]:
    """``(level, msg_id)`` of everything ``git fsck`` reports for a repository, where
    level is ``"error"`` or ``"warning"``.  ``strict`` is what a fetch with
    ``transfer.fsckObjects`` checks (``--strict``: warnings become errors, and some
    findings, such as a ``100664`` mode, are only looked for then)."""
    mode = ["--strict"] if strict else []
    proc = subprocess.run(
        ["git", "-C", str(path), "fsck", *mode, "--no-dangling", "--no-progress"],
        env=_plain_env(),
        capture_output=True,
    )
    text = proc.stderr.decode("utf-8", "replace") + proc.stdout.decode("utf-8", "replace")
    return set(re.findall(r"^(error|warning) in \w+ [0-9a-f]+: (\w+):", text, flags=re.M))


def git_log_reference(
    path: Path, ref: str = "HEAD", env: dict[str, str] | None = None
) -> dict[str, dict[str, Any]]:
    """Every commit reachable from ``ref`` as ``git log --numstat --no-renames
    --diff-merges=first-parent`` reports it, one ``git log -1`` per commit.  Dates stay
    raw: ``*_ts`` and ``*_tz`` are the two halves of ``--date=raw`` (None when git prints
    no date; ``%at`` would echo an overflowing date that git itself shows as 0)."""
    run_env = {**_plain_env(), **(env or {})}

    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", "-C", str(path), "-c", "core.quotepath=off", *args],
            env=run_env,
            capture_output=True,
            check=True,
        )
        return out.stdout.decode("utf-8", "replace")

    out: dict[str, dict[str, Any]] = {}
    fields = "%P%x00%an%x00%ae%x00%ad%x00%cn%x00%ce%x00%cd%x00%s"
    for sha in git("rev-list", ref, "--").split():
        meta = git("log", "-1", "--date=raw", f"--format={fields}", sha).rstrip("\n").split("\0")
        raw = git(
            "log", "-1", "--format=", "-z", "--numstat", "--no-renames",
            "--diff-merges=first-parent", sha,
        )  # fmt: skip
        files = []
        for entry in raw.split("\0"):
            entry = entry.lstrip("\n")
            if not entry:
                continue
            added, deleted, p = entry.split("\t", 2)
            binary = added == "-"
            files.append((p, 0 if binary else int(added), 0 if binary else int(deleted), binary))
        parents = meta[0].split()
        out[sha] = {
            "sha": sha,
            "parents": parents,
            "author_name": meta[1],
            "author_email": meta[2],
            "authored_ts": int(meta[3].split()[0]) if meta[3] else None,
            "author_tz": meta[3].split()[1] if meta[3] else None,
            "committer_name": meta[4],
            "committer_email": meta[5],
            "committed_ts": int(meta[6].split()[0]) if meta[6] else None,
            "committer_tz": meta[6].split()[1] if meta[6] else None,
            "subject": meta[7],
            "is_merge": len(parents) > 1,
            "files": sorted(files),
            "files_changed": len(files),
            "insertions": sum(f[1] for f in files),
            "deletions": sum(f[2] for f in files),
        }
    return out


#: Script payloads the commit page must show as text.
PAYLOADS = ("<script>alert(1)</script>", '"><img src=x onerror=alert(1)>')
#: An author name with what git keeps of markup (it drops ``<`` and ``>`` from names).
AUTHOR = "Eve ' onmouseover='alert(1)' \" &amp; x"


def hostile_commits(path: Path) -> dict[str, str]:
    """A repository for the commit page: payloads in messages, author and file names, a
    binary file, a file larger than a page's patch bound, a merge, a message encoded as
    ISO-8859-1 and one declaring an encoding nobody knows. Returns name → sha."""
    repo = GitRepo.create(path)
    script, img = PAYLOADS
    shas = {
        "root": repo.commit(
            f"root {script}\n\nbody {img}\n",
            {"README.md": "hello\n", f"{script}.txt": f"{img}\n", f"{img}.md": f"{script}\n"},
            author=(AUTHOR, "x@example.com"),
        )
    }
    shas["binary"] = repo.commit("add a binary", {"logo.bin": bytes(range(256)) * 8})
    shas["big"] = repo.commit(
        "a big file", {"big.txt": "".join(f"line {i} {'x' * 60}\n" for i in range(4000))}
    )
    repo.git("checkout", "--quiet", "-b", "side")
    shas["side"] = repo.commit("side change", {"side.txt": "from the side\n"})
    repo.git("checkout", "--quiet", "main")
    shas["main2"] = repo.commit("main change", {"README.md": "hello\nmain\n"})
    repo.clock += 3600
    date = f"{repo.clock} +0000"
    repo.git("merge", "--quiet", "--no-ff", "-m", "merge side", "side",
             GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)  # fmt: skip
    shas["merge"] = repo.head()
    for name, encoding, raw in (
        ("latin1", "ISO-8859-1", "café crème: naïve\n\nrésumé\n".encode("latin-1")),
        ("bogus", "x-no-such-encoding", b"unknown \xff\xfe encoding\n"),
    ):
        (path / ".msg").write_bytes(raw)
        repo.write(f"{name}.txt", f"{name}\n")
        repo.git("add", "--", f"{name}.txt")
        repo.clock += 3600
        date = f"{repo.clock} +0000"
        repo.git("-c", f"i18n.commitEncoding={encoding}", "commit", "--quiet", "-F", ".msg",
                 GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)  # fmt: skip
        shas[name] = repo.head()
    (path / ".msg").unlink()
    return shas
