"""Real git repositories built in temporary folders, and what git itself reports."""

from __future__ import annotations

import os
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
