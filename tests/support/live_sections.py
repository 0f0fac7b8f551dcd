"""What the browser test of the live integrity group and Git hosts table plays into a
running ``manage.py up`` from another process (the same database and queue server), as
the verifier and a worker's fetch do it:

``python -m tests.support.live_sections mismatch NAME``: a repository row and one
verifier pass of it finding a stored row wrong, recorded through ``record_result`` (which
publishes ``repo.changed``); prints the verification's id.

``python -m tests.support.live_sections hold HOST GO_FILE``: takes a fetch slot of HOST
through the deployment's gate (``runs.fetch_gate``, which publishes ``fetch.changed``),
prints ``held``, keeps it until GO_FILE exists (at most 120 s), then lets it go."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

import django

django.setup()

from dashboard.analytics.integrity import record_result  # noqa: E402
from dashboard.models import Repository, Verification  # noqa: E402
from dashboard.repositories import current_fingerprint  # noqa: E402
from dashboard.runs import fetch_gate  # noqa: E402

__all__ = ["hold", "mismatch"]


def mismatch(name: str) -> int:
    url = f"https://example.invalid/{name}.git"
    repo = Repository.objects.create(url=url, fetch_url=url)
    row = Verification.objects.create(repository=repo, fingerprint=current_fingerprint())
    sha = "ab" * 20
    result = {
        "head": sha,
        "sampled": 7,
        "mismatches": [{"sha": sha, "git": 3, "stored": 4,
                        "fields": [{"path": "src/x.py", "field": "added", "git": 3,
                                    "stored": 4}]}],
        "totals": {"stored": {"commits": 7}, "git": None},
    }  # fmt: skip
    record_result(row, result, generation=repo.generation, next_at=None)
    print(row.pk, flush=True)
    return 0


def hold(host: str, go: Path) -> int:
    with fetch_gate().slot(host):
        print("held", flush=True)
        end = time.monotonic() + 120
        while not go.exists() and time.monotonic() < end:
            time.sleep(0.05)
    print("released", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "mismatch":
        sys.exit(mismatch(sys.argv[2]))
    sys.exit(hold(sys.argv[2], Path(sys.argv[3])))
