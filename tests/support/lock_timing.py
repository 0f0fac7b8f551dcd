"""The Redlock timing of tests whose masters are all meant to answer.

Not the 50 ms default node timeout: on a loaded machine (2 cores, several suites at once)
a healthy master's reply can take longer — or the test process itself is not scheduled
for a while, and then every master of the round "times out" at once — and the test would
see a timeout vote, a lost extension or a refused lock it never caused. Only tests whose
masters really are stalled (SIGSTOP, DEBUG SLEEP, a held-back proxy) pass a shorter one,
and then only where the healthy masters' votes decide nothing.
"""

from __future__ import annotations

#: The per-master timeout of every Redlock whose masters are all meant to answer.
HEALTHY_NODE_TIMEOUT = 0.5

#: A lease short enough for a test to see its heartbeat (every TTL/3, so every second)
#: and long enough for that heartbeat with healthy masters: an extension gives up with
#: two node timeouts of validity left (``Redlock.extend_margin``), so this leaves it two
#: whole rounds, and the project's own check (``gitward.E001``: more than three node
#: timeouts plus the drift allowance) passes.
LEASE_TTL = 6 * HEALTHY_NODE_TIMEOUT

#: How long a job works (a ``sleep`` failpoint) while a test takes its lease away: two
#: TTLs. Its heartbeat (every TTL/3) finds the lease gone long before, so the job is still
#: inside the lease when the loss is noticed and must abort rather than write.
LOST_LEASE_WORK = 2 * LEASE_TTL
