"""Which ``git fsck`` findings a fetch accepts and which it refuses: one table.

Every fetch runs with ``transfer.fsckObjects``: index-pack checks each object it
receives with ``--strict``, which turns every fsck *warning* into an error.  Decades-old
public histories carry findings that git, GitHub and GitLab accept (zero-padded file
modes, odd time zones, malformed e-mails), so a plain ``--strict`` refuses well-known
repositories.  :data:`RULES` decides, per message id, what gitward accepts; git applies
it through its own ``fetch.fsck.<msg-id>`` settings (:func:`fetch_config`), which are the
only ones ``git fetch``/``git clone`` read (``fsck.<msg-id>`` and ``receive.fsck.<msg-id>``
do not apply to a fetch and are not fallen back on; checked with git 2.39).

The rule of thumb is git's own default severity: what ``git fsck`` reports only as a
warning or info is accepted, what it reports as an error is refused, with these
deliberate exceptions (each rule says why):

* refused although git only warns: path entries that could escape or alias a work tree
  (``.git``, ``..``, ``.``, empty names, names with ``/``), entries naming the null
  object, and a NUL in a commit message (it would cut gitward's NUL-separated parse);
* accepted although git calls them errors: the malformed *identity lines* of old
  converters and hand-written commits (bad time zones, dates, e-mails, missing spaces).
  ``git log`` parses them (an unparseable date reads as the epoch, as in git's own
  ``git log``), nothing runs or is written from them, and git's own documentation
  (``fsck.skipList``) calls such commits "errors that can be safely ignored".

``FATAL`` findings cannot be demoted by any configuration and are always refused.
Everything here is data; nothing imports Django or runs git.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "GIT_VERSION",
    "RULES",
    "Decision",
    "FsckRule",
    "Severity",
    "accepted_ids",
    "fetch_config",
    "rule_for",
]

#: The git release whose ``fsck.h`` (``FOREACH_FSCK_MSG_ID``) the table was taken from.
GIT_VERSION = "2.39"

Severity = Literal["fatal", "error", "warn", "info", "ignore"]
Decision = Literal["accept", "refuse"]


@dataclass(frozen=True, slots=True)
class FsckRule:
    """One fsck message id: git's default severity and what gitward does with it."""

    msg_id: str  # as git prints it, e.g. "zeroPaddedFilemode"
    severity: Severity  # git's default (without --strict)
    decision: Decision
    reason: str


def _r(msg_id: str, severity: Severity, decision: Decision, reason: str) -> FsckRule:
    return FsckRule(msg_id, severity, decision, reason)


_IDENT = (
    "legacy identity line (old converters, hand-written commits); git log parses it, "
    "so it is analysed exactly as git reports it"
)
_NO_DATE = (
    "legacy identity line; git log reports no author/committer date for it, which "
    "gitward stores as the epoch (what git's own git log shows)"
)
_TAG = (
    "malformed annotated tag; gitward fetches one branch and no tags, so this only "
    "appears in a forged or broken pack"
)
_SHA = "an object id that does not parse: a corrupt or forged object"

#: Every message id git 2.39 can emit, in ``fsck.h`` order (grouped by severity).
RULES: tuple[FsckRule, ...] = (
    # fatal: git refuses these whatever the configuration
    _r("nulInHeader", "fatal", "refuse", "NUL byte in an object header: a corrupt object"),
    _r("unterminatedHeader", "fatal", "refuse", "object header without end of line: corrupt"),
    # errors
    _r("badDate", "error", "accept", _NO_DATE),
    _r("badDateOverflow", "error", "accept", _NO_DATE),
    _r("badEmail", "error", "accept", _IDENT),
    _r(
        "badName",
        "error",
        "refuse",
        "a '>' inside the name makes the identity ambiguous (where the e-mail starts is a "
        "guess that git's parsers make differently); a forgery, not a legacy quirk",
    ),
    _r("badObjectSha1", "error", "refuse", _SHA),
    _r("badParentSha1", "error", "refuse", _SHA),
    _r(
        "badTimezone",
        "error",
        "accept",
        _IDENT + "; an offset Python cannot represent (24 h or more) is stored as UTC",
    ),
    _r("badTree", "error", "refuse", "a tree that cannot be parsed: corrupt or forged"),
    _r("badTreeSha1", "error", "refuse", _SHA),
    _r("badType", "error", "refuse", "an object of the wrong type where another is required"),
    _r(
        "duplicateEntries",
        "error",
        "refuse",
        "two entries with one name: diffs and checkouts of the tree are ambiguous",
    ),
    _r("missingAuthor", "error", "refuse", "a commit without an author line: malformed"),
    _r("missingCommitter", "error", "refuse", "a commit without a committer line: malformed"),
    _r("missingEmail", "error", "accept", _NO_DATE + "; the name and e-mail are empty"),
    _r("missingNameBeforeEmail", "error", "accept", _IDENT + " (an empty name)"),
    _r("missingObject", "error", "refuse", _TAG),
    _r("missingSpaceBeforeDate", "error", "accept", _IDENT),
    _r("missingSpaceBeforeEmail", "error", "accept", _IDENT),
    _r("missingTag", "error", "refuse", _TAG),
    _r("missingTagEntry", "error", "refuse", _TAG),
    _r("missingTree", "error", "refuse", "a commit without a tree line: malformed"),
    _r("missingType", "error", "refuse", _TAG),
    _r("missingTypeEntry", "error", "refuse", _TAG),
    _r(
        "multipleAuthors",
        "error",
        "refuse",
        "two author lines: which one counts is undefined; malformed",
    ),
    _r(
        "treeNotSorted",
        "error",
        "refuse",
        "git's tree walkers assume sorted entries: diffs of the tree would be wrong",
    ),
    _r("unknownType", "error", "refuse", "an object of a type git does not know"),
    _r("zeroPaddedDate", "error", "accept", _IDENT),
    _r(
        "gitmodulesMissing",
        "error",
        "refuse",
        "a .gitmodules git cannot read: submodule tricks are not checked for (CVE-2018-11235)",
    ),
    _r("gitmodulesBlob", "error", "refuse", "a .gitmodules that is not a file: submodule trick"),
    _r("gitmodulesLarge", "error", "refuse", "a .gitmodules too large to check: submodule trick"),
    _r(
        "gitmodulesName",
        "error",
        "refuse",
        "a submodule name that escapes .git/modules (CVE-2018-11235)",
    ),
    _r("gitmodulesSymlink", "error", "refuse", "a .gitmodules that is a symlink (CVE-2018-11235)"),
    _r(
        "gitmodulesUrl",
        "error",
        "refuse",
        "a submodule URL that is an option or leaks credentials (CVE-2017-1000117, CVE-2020-5260)",
    ),
    _r(
        "gitmodulesPath",
        "error",
        "refuse",
        "a submodule path that looks like an option (CVE-2018-17456)",
    ),
    _r(
        "gitmodulesUpdate",
        "error",
        "refuse",
        "a submodule update command ('!cmd') that would run a program (CVE-2019-19604)",
    ),
    _r(
        "gitattributesMissing",
        "error",
        "refuse",
        "a .gitattributes git cannot read: the attribute overflow checks are skipped "
        "(CVE-2022-41953/23521)",
    ),
    _r(
        "gitattributesLarge",
        "error",
        "refuse",
        "a .gitattributes over git's size limit (CVE-2022-23521)",
    ),
    _r(
        "gitattributesLineLength",
        "error",
        "refuse",
        "a .gitattributes line over git's limit (CVE-2022-23521)",
    ),
    _r("gitattributesBlob", "error", "refuse", "a .gitattributes that is not a file"),
    # warnings (errors under transfer.fsckObjects unless configured)
    _r(
        "emptyName",
        "warn",
        "refuse",
        "a tree entry with an empty name: its path aliases the directory itself",
    ),
    _r(
        "fullPathname",
        "warn",
        "refuse",
        "a tree entry whose name contains '/': two different trees print the same path",
    ),
    _r("hasDot", "warn", "refuse", "a tree entry named '.': path trick (safety)"),
    _r(
        "hasDotdot",
        "warn",
        "refuse",
        "a tree entry named '..': escapes the work tree on checkout (safety)",
    ),
    _r(
        "hasDotgit",
        "warn",
        "refuse",
        "a tree entry named '.git' (or an NTFS/HFS alias of it): writes into the "
        "repository on checkout, CVE-2014-9390 (safety)",
    ),
    _r("nullSha1", "warn", "refuse", "a tree entry naming the null object id: nothing to read"),
    _r(
        "zeroPaddedFilemode",
        "warn",
        "accept",
        "mode '040000' instead of '40000', written by old git versions; harmless",
    ),
    _r(
        "nulInCommit",
        "warn",
        "refuse",
        "a NUL in a commit message: it would cut gitward's NUL-separated git log parse "
        "and PostgreSQL cannot store it",
    ),
    # infos (git reports them as warnings but never fails on them)
    _r("badFilemode", "info", "accept", "an unusual mode such as 100664 from early git; harmless"),
    _r(
        "gitmodulesParse",
        "info",
        "accept",
        "a .gitmodules git cannot parse is never used; gitward never recurses submodules",
    ),
    _r(
        "gitignoreSymlink",
        "info",
        "accept",
        "a .gitignore symlink; gitward has no work tree, nothing follows it",
    ),
    _r(
        "gitattributesSymlink",
        "info",
        "accept",
        "a .gitattributes symlink; gitward has no work tree, nothing follows it",
    ),
    _r(
        "mailmapSymlink",
        "info",
        "accept",
        "a .mailmap symlink; git reads HEAD:.mailmap as a blob, so only the link text "
        "is parsed, nothing is followed",
    ),
    _r("badTagName", "info", "accept", "an annotated tag with an odd name; no tags are fetched"),
    _r(
        "missingTaggerEntry",
        "info",
        "accept",
        "an annotated tag without a tagger, common in old histories; no tags are fetched",
    ),
    # ignored by git unless asked for
    _r("extraHeaderEntry", "ignore", "accept", "extra tag headers; git ignores them too"),
)

_BY_ID = {rule.msg_id.lower(): rule for rule in RULES}
if len(_BY_ID) != len(RULES):  # pragma: no cover - guards edits of the table
    raise RuntimeError("duplicate msg-id in fsckpolicy.RULES")
if any(r.severity == "fatal" and r.decision == "accept" for r in RULES):  # pragma: no cover
    raise RuntimeError("a fatal fsck finding cannot be accepted")


def rule_for(msg_id: str) -> FsckRule | None:
    """The rule for ``msg_id`` (git prints camelCase, config keys are case-insensitive)."""
    return _BY_ID.get(msg_id.lower())


def accepted_ids() -> tuple[str, ...]:
    return tuple(r.msg_id for r in RULES if r.decision == "accept")


def fetch_config() -> tuple[tuple[str, str], ...]:
    """``(key, value)`` pairs for ``git -c``: ``fetch.fsck.<id>=ignore`` for every
    accepted id, ``=error`` for every refused one git lets us configure (so a refusal
    does not depend on ``--strict`` promoting warnings).  Fatal ids are left out: git
    refuses them anyway and dies if asked to demote them."""
    return tuple(
        (f"fetch.fsck.{r.msg_id}", "ignore" if r.decision == "accept" else "error")
        for r in RULES
        if r.severity != "fatal"
    )
