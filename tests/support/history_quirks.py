"""A catalog of real-world history quirks, each built as a real git repository.

Each builder writes, in a temporary folder, a repository carrying one family of quirks
found in decades-old public histories (objects forged with ``hash-object --literally``,
``mktree`` or ``fast-import`` where git would not write them today) and returns a
:class:`Quirk`: where it is, what to submit, and which findings ``git fsck`` must report
for it (so a builder that stopped producing its quirk fails its test).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.gitrepo import EMPTY_TREE, Forge, GitRepo

ADA = "Ada Lovelace <ada@example.com>"


@dataclass(frozen=True)
class Quirk:
    path: Path  # the repository to submit
    findings: frozenset[str] = frozenset()  # msg-ids `git fsck` reports for it
    strict_only: frozenset[str] = frozenset()  # msg-ids only `git fsck --strict` reports
    branch: str | None = None  # the submitted branch (None: the remote's HEAD)
    ref: str = "HEAD"  # what git's reference log is computed from, in `reference`
    reference: Path | None = None  # repository the reference is read from (default: path)
    reference_env: dict[str, str] = field(default_factory=dict)


def _files(forge: Forge, names: dict[str, str]) -> str:
    return forge.tree([("100644", n, forge.blob(c)) for n, c in sorted(names.items())])


def zero_padded_modes(tmp: Path) -> Quirk:
    """Trees written by git before 2005-era fixes: ``040000`` for a directory
    (zeroPaddedFilemode) and group-writable ``100664`` files (badFilemode, info)."""
    f = Forge.create(tmp / "zero-padded.git")
    sub = _files(f, {"inner.py": "x = 1\n"})
    readme, notes = f.blob("hello\n"), f.blob("group writable\n")
    padded = f.tree([("100644", "README", readme), ("040000", "lib", sub)])
    first = f.commit(padded, message="zero-padded tree\n")
    odd = f.tree([("100644", "README", readme), ("40000", "lib", sub), ("100664", "notes", notes)])
    second = f.commit(odd, parents=(first,), message="a 100664 file\n")
    normal = f.tree(
        [
            ("100644", "README", f.blob("hello\nagain\n")),
            ("40000", "lib", sub),
            ("100644", "notes", notes),
        ]
    )
    f.commit(normal, parents=(second,), message="back to plain modes\n")
    return Quirk(f.path, frozenset({"zeroPaddedFilemode"}), strict_only=frozenset({"badFilemode"}))


def odd_time_zones(tmp: Path) -> Quirk:
    """The extremes git accepts (+1400, -1200, minutes of 60) and offsets it does not
    (badTimezone): six digits (+51800), three digits (+000)."""
    f = Forge.create(tmp / "time-zones.git")
    parent: tuple[str, ...] = ()
    for i, tz in enumerate(["+1400", "-1200", "-1260", "+51800", "+000", "-0000"]):
        tree = _files(f, {"clock.txt": f"tick {i}\n"})
        when = 1_100_000_000 + i * 86_400
        sha = f.commit(
            tree,
            parents=parent,
            author=f"{ADA} {when} {tz}",
            committer=f"{ADA} {when + 60} {tz}",
            message=f"offset {tz}\n",
        )
        parent = (sha,)
    return Quirk(f.path, frozenset({"badTimezone"}))


def odd_dates(tmp: Path) -> Quirk:
    """Epoch 0, the year 5138, a date past year 9999, an integer overflow
    (badDateOverflow), a zero-padded date, no space before the date, no offset
    (badDate)."""
    f = Forge.create(tmp / "dates.git")
    authors = [
        f"{ADA} 0 +0000",
        f"{ADA} 99999999999 +0000",
        f"{ADA} 999999999999 -0700",
        f"{ADA} 99999999999999999999 +0000",
        f"{ADA} 01700000000 +0100",
        f"{ADA}1700000000 +0000",
        f"{ADA} 1700000000",
    ]
    parent: tuple[str, ...] = ()
    for i, author in enumerate(authors):
        tree = _files(f, {"when.txt": f"{i}\n"})
        sha = f.commit(
            tree,
            parents=parent,
            author=author,
            committer=f"{ADA} {1_600_000_000 + i} +0000",
            message=f"date {i}\n",
        )
        parent = (sha,)
    return Quirk(
        f.path,
        frozenset({"badDateOverflow", "zeroPaddedDate", "missingSpaceBeforeDate", "badDate"}),
    )


def odd_emails(tmp: Path) -> Quirk:
    """Empty ``<>``, no ``<>`` at all (missingEmail), spaces inside, no name
    (missingNameBeforeEmail), no space before ``<`` (missingSpaceBeforeEmail), a second
    ``<`` (badEmail), and a committer with ``<>``."""
    f = Forge.create(tmp / "emails.git")
    authors = [
        "Ada <> 1700000000 +0000",
        "Ada 1700000000 +0000",
        "Ada Lovelace <ada at example dot com> 1700000000 +0000",
        "<ada@example.com> 1700000000 +0000",
        "Ada<ada@example.com> 1700000000 +0000",
        "Ada <ada<@example.com> 1700000000 +0000",
    ]
    parent: tuple[str, ...] = ()
    for i, author in enumerate(authors):
        tree = _files(f, {"who.txt": f"{i}\n"})
        committer = "Root <> 1600000000 +0000" if i == 0 else f"{ADA} 1600000000 +0000"
        sha = f.commit(
            tree, parents=parent, author=author, committer=committer, message=f"ident {i}\n"
        )
        parent = (sha,)
    return Quirk(
        f.path,
        frozenset(
            {"missingEmail", "missingNameBeforeEmail", "missingSpaceBeforeEmail", "badEmail"}
        ),
    )


def legacy_encodings(tmp: Path) -> Quirk:
    """Messages and names in ISO-8859-1 declared by an ``encoding`` header (git
    re-encodes them to UTF-8), a bogus encoding name (git cannot convert: the raw bytes
    come out), and undeclared Latin-1 bytes (pre-2007 histories)."""
    f = Forge.create(tmp / "encodings.git")
    latin = "Zoë Brontë <zoe@example.com> 1700000000 +0100"  # written as Latin-1 bytes
    cases = [
        (("encoding ISO-8859-1",), "Café crème: déjà vu\n\nçà et là\n"),
        (("encoding x-no-such-charset",), "naïve façade\n"),
        ((), "ungeschützt Grüße\n"),
    ]
    parent: tuple[str, ...] = ()
    for i, (headers, text) in enumerate(cases):
        tree = _files(f, {"text.txt": f"{i}\n"})
        lines = [f"tree {tree}", *(f"parent {p}" for p in parent)]
        lines += [f"author {latin}", f"committer {latin}", *headers]
        raw = "\n".join(lines).encode("latin-1") + b"\n\n" + text.encode("latin-1")
        sha = f.git("hash-object", "-t", "commit", "--literally", "-w", "--stdin", input=raw)
        f.git("update-ref", "refs/heads/main", sha)
        parent = (sha,)
    return Quirk(f.path)


def gitlinks(tmp: Path) -> Quirk:
    """Submodules as gitlink (mode 160000) entries naming commits that are not in the
    repository: added, moved to another commit, removed."""
    f = Forge.create(tmp / "gitlinks.git")
    modules = f.blob('[submodule "vendor/lib"]\n\tpath = vendor/lib\n\turl = ../lib.git\n')
    one, two = "1" * 40, "2" * 40
    vendor1 = f.tree([("160000", "lib", one)])
    first = f.commit(
        f.tree([("100644", ".gitmodules", modules), ("40000", "vendor", vendor1)]),
        message="add submodule\n",
    )
    vendor2 = f.tree([("160000", "lib", two)])
    second = f.commit(
        f.tree([("100644", ".gitmodules", modules), ("40000", "vendor", vendor2)]),
        parents=(first,),
        message="bump submodule\n",
    )
    f.commit(_files(f, {"README": "no more submodules\n"}), parents=(second,), message="drop\n")
    return Quirk(f.path)


def long_octopus(tmp: Path, parents: int = 66) -> Quirk:
    """One merge of 66 branches, as the Linux kernel's largest octopus (2,705 characters
    of parent ids: more than the 2,048 the parents column once held)."""
    f = Forge.create(tmp / "octopus.git")
    base = f.commit(_files(f, {"base.txt": "base\n"}), message="base\n", ref=None)
    heads = []
    for i in range(parents):
        tree = _files(f, {"base.txt": "base\n", f"branch{i:02d}.txt": f"{i}\n" * (i + 1)})
        heads.append(f.commit(tree, parents=(base,), message=f"branch {i}\n", ref=None))
    merged = {"base.txt": "base\n"} | {
        f"branch{i:02d}.txt": f"{i}\n" * (i + 1) for i in range(parents)
    }
    f.commit(_files(f, merged), parents=tuple(heads), message=f"octopus of {parents}\n")
    return Quirk(f.path)


def _linear(path: Path, n: int = 4) -> GitRepo:
    r = GitRepo.create(path)
    for i in range(n):
        r.commit(f"commit {i}", {f"f{i}.txt": f"{i}\n", "log.txt": "line\n" * (i + 1)})
    return r


def replaced_history(tmp: Path) -> Quirk:
    """``git replace`` swaps a commit for another (refs/replace/*).  Replacements are
    local to a repository: gitward fetches only the branch and runs git with
    ``GIT_NO_REPLACE_OBJECTS``, so the original objects are analysed."""
    r = _linear(tmp / "replaced")
    middle = r.git("rev-parse", "HEAD~1").strip()
    r.git("checkout", "-q", "--orphan", "rewrite")
    r.git("rm", "-rfq", ".")
    r.commit("the replacement", {"other.txt": "entirely different\n"})
    replacement = r.head()
    r.git("checkout", "-q", "main")
    r.git("replace", middle, replacement)
    return Quirk(r.path, ref="main", reference_env={"GIT_NO_REPLACE_OBJECTS": "1"})


def grafted_history(tmp: Path) -> Quirk:
    """``info/grafts`` cuts the origin's history (HEAD~1 made a root).  Not in the
    catalog: the origin's upload-pack honours the graft and sends a pack without the
    cut-off parents, which no fetch can connect, ``git clone`` included."""
    r = _linear(tmp / "grafted")
    cut = r.git("rev-parse", "HEAD~1").strip()
    info = r.path / ".git" / "info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "grafts").write_text(f"{cut}\n")
    return Quirk(r.path, ref="main")


def shallow_history(tmp: Path) -> Quirk:
    """A shallow clone (depth 2) submitted as the origin: the mirror is shallow too, and
    its boundary commit is a root, exactly as ``git log`` shows it in the origin."""
    full = _linear(tmp / "full", 5)
    shallow = tmp / "shallow"
    full.git("clone", "-q", "--depth", "2", f"file://{full.path}", str(shallow))
    return Quirk(shallow, ref="HEAD")


def trunk_default_branch(tmp: Path) -> Quirk:
    """A repository whose only branch is ``trunk``: no branch submitted, HEAD decides."""
    r = GitRepo.create(tmp / "trunk", branch="trunk")
    r.commit("on trunk", {"a.txt": "a\n"})
    r.commit("more trunk", {"b.txt": "b\n"})
    return Quirk(r.path, ref="trunk")


def head_on_master(tmp: Path) -> Quirk:
    """Both ``main`` and ``master`` exist with different histories and HEAD names
    ``master``: without a branch the remote's HEAD (master) is analysed, not main."""
    r = GitRepo.create(tmp / "master", branch="master")
    r.commit("master root", {"m.txt": "m\n"})
    r.commit("master work", {"m.txt": "m\nm\n"})
    r.git("checkout", "-q", "--orphan", "main")
    r.git("rm", "-rfq", ".")
    r.commit("unrelated main", {"main.txt": "x\n"})
    r.git("checkout", "-q", "master")
    return Quirk(r.path, ref="master")


def empty_trees(tmp: Path) -> Quirk:
    """A root commit of the empty tree, empty commits, and a commit deleting every file
    (back to the empty tree)."""
    f = Forge.create(tmp / "empty.git")
    f.git("hash-object", "-t", "tree", "-w", "--stdin", input=b"")
    root = f.commit(EMPTY_TREE, message="empty root\n")
    again = f.commit(EMPTY_TREE, parents=(root,), message="still empty\n")
    full = f.commit(_files(f, {"a.txt": "a\nb\n", "b.bin": "\0\1\2"}), parents=(again,))
    same = f.commit(_files(f, {"a.txt": "a\nb\n", "b.bin": "\0\1\2"}), parents=(full,))
    f.commit(EMPTY_TREE, parents=(same,), message="delete everything\n")
    return Quirk(f.path)


def huge_commit(tmp: Path, files: int = 5000) -> Quirk:
    """One commit adding thousands of files, then one touching half of them."""
    f = Forge.create(tmp / "huge.git")

    def commit(message: bytes, body: bytes) -> bytes:  # continues refs/heads/main
        head = b"commit refs/heads/main\n"
        head += f"committer {ADA} 1700000000 +0000\n".encode()
        return head + b"data %d\n%s" % (len(message), message) + body

    add = b"".join(
        b"M 644 inline d%03d/f%05d.txt\ndata 4\n%03d\n" % (i % 250, i, i % 1000)
        for i in range(files)
    )
    change = b"".join(
        b"M 644 inline d%03d/f%05d.txt\ndata 8\nchanged\n" % (i % 250, i)
        for i in range(0, files, 2)
    )
    f.fast_import(commit(b"thousands of files\n", add) + commit(b"half changed\n", change))
    return Quirk(f.path)


#: Every quirk, by name (the test ids).
CATALOG: dict[str, Callable[[Path], Quirk]] = {
    "zero-padded-modes": zero_padded_modes,
    "odd-time-zones": odd_time_zones,
    "odd-dates": odd_dates,
    "odd-emails": odd_emails,
    "legacy-encodings": legacy_encodings,
    "gitlinks": gitlinks,
    "octopus-66": long_octopus,
    "replaced-history": replaced_history,
    "shallow-history": shallow_history,
    "trunk-default-branch": trunk_default_branch,
    "head-on-master": head_on_master,
    "empty-trees": empty_trees,
    "huge-commit": huge_commit,
}
