"""``manage.py rollout start|status|promote|rollback|abort|takeover|drive|checklist|pin|unpin|
retire|freeze``.

Thin adapters over ``dashboard.rollouts.start`` / ``dashboard.rollouts.deploy_lock``; every refusal
is one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import getpass
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dashboard import locks, rollouts
from dashboard import versions as dashboard_versions
from dashboard.accounts import reason_problem
from dashboard.models import AnalyzerVersion, Rollout, RolloutEvent
from dashboard.rollouts import (
    RolloutDriver,
    abort_rollout,
    describe_rollout,
    rollback_rollout,
    rollout_checklist,
    takeover_rollout,
    warm_rollout,
)
from dashboard.versions import describe_lock, ensure_baseline, retire_version
from workers import locks as workers_locks

TERMINAL = {"completed", "rolled_back", "failed", "aborted"}
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def parse_value(key: str, raw: str) -> Any:
    if key == "exclude_paths":
        return [p for p in raw.split(",") if p]
    if raw.lower() in {"true", "yes", "1", "on"}:
        return True
    if raw.lower() in {"false", "no", "0", "off"}:
        return False
    raise CommandError(f"--set {key}: expected true or false, not {raw!r}")


def parse_steps(raw: str | None) -> list[int] | None:
    if raw is None:
        return None
    try:
        return [int(s) for s in raw.split(",") if s.strip()]
    except ValueError:
        raise CommandError(f"--steps must be comma-separated percentages, not {raw!r}") from None


class OneLineParser(CommandParser):
    """Usage errors (a missing ``--config``/``--set``, an id that is not a number, an
    unknown action) as one line on stderr and exit 2, like every other refusal of this
    command — not argparse's usage block. ``--help`` still prints the usage."""

    def error(self, message: str) -> Any:
        if self.called_from_command_line:
            self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
        raise CommandError(f"Error: {message}")


class Command(BaseCommand):
    help = "Roll out, inspect and roll back analyzer versions (docs/rollouts.md)."

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.__class__ = OneLineParser  # its own errors (no or an unknown action) too
        return parser

    def add_arguments(self, parser: Any) -> None:
        sub = parser.add_subparsers(dest="action", required=True, parser_class=OneLineParser)
        start = sub.add_parser("start", help="start a rollout of a new analyzer config")
        start.add_argument("--queue", default=dashboard_versions.QUEUE)
        src = start.add_mutually_exclusive_group(required=True)
        src.add_argument("--config", type=Path, help="a JSON file with the analyzer config")
        src.add_argument("--set", action="append", metavar="KEY=VALUE", help="a config key")
        src.add_argument(
            "--version",
            metavar="FP",
            help="a known version's fingerprint (a code rollout: docs/rollouts.md)",
        )
        start.add_argument("--steps", help="ramp percentages, e.g. 10,50,100")
        start.add_argument("--auto", action="store_true", help="advance steps by health check")
        start.add_argument(
            "--option",
            action="append",
            default=[],
            metavar="KEY=SECONDS",
            help="driver knob: step_pause, min_samples, warm_timeout",
        )
        start.add_argument(
            "--step-deadline",
            type=float,
            help="seconds a step may stay inconclusive (docs/rollouts.md#step-deadlines)",
        )
        start.add_argument(
            "--on-inconclusive",
            choices=["pause", "fail"],
            help="an inconclusive step at its deadline: pause (default) or fail (roll back)",
        )
        start.add_argument(
            "--check",
            action="append",
            default=[],
            metavar="JSON",
            help='a PromQL check, e.g. \'{"name": "errors", "query": "…", "failure": '
            '"result > 0.05"}\' (docs/rollouts.md#checks-and-gates); repeatable',
        )
        start.add_argument("--warm-repositories", type=int, help="size of the warm set")
        start.add_argument("--warm-commits", type=int, help="newest commits per repository")
        start.add_argument("--warm-threshold", type=float, help="coverage needed, 0..1")
        start.add_argument(
            "--driver",
            choices=["queue", "here", "none"],
            default="queue",
            help="who holds the deploy lock: an RQ job on the 'rollouts' queue (default), "
            "this process in the foreground, or nobody yet (use `rollout drive ID`)",
        )
        start.add_argument("--wait", action="store_true", help="block until it ends")
        start.add_argument("--timeout", type=float, default=30.0)
        status = sub.add_parser("status", help="versions and rollouts")
        status.add_argument("--queue", default=dashboard_versions.QUEUE)
        status.add_argument("--json", action="store_true")
        for name, text in [
            ("promote", "next ramp step, or make the version current after the last"),
            ("rollback", "route back to the previous version and drain the new one"),
            ("abort", "end a rollout that has not ended, from any of its states"),
            ("takeover", "take the deploy lock of a rollout whose driver died (or --force)"),
            ("drive", "run a rollout's driver in the foreground"),
            ("checklist", "the rollout's release checklist as Markdown"),
        ]:
            p = sub.add_parser(name, help=text)
            p.add_argument("id", type=int)
            if name in {"rollback", "abort", "takeover", "drive"}:
                p.add_argument(
                    "--force", action="store_true", help="break a lease still held (audited)"
                )
                p.add_argument("--reason", default="")
            if name in {"promote", "rollback", "abort"}:
                p.add_argument("--timeout", type=float, default=30.0)
            if name == "drive":
                p.add_argument("--takeover", action="store_true")
        for name, text in [
            ("pin", "pin repositories to the ramping version (docs/rollouts.md#pinning)"),
            ("unpin", "unpin repositories from the ramping version"),
        ]:
            p = sub.add_parser(name, help=text)
            p.add_argument("id", type=int)
            p.add_argument("repositories", type=int, nargs="+", metavar="REPO_ID")
        retire = sub.add_parser(
            "retire", help="retire a registered, drained or warm-failed version"
        )
        retire.add_argument("fingerprint", help="the version's fingerprint (or a prefix)")
        retire.add_argument("--queue", default=dashboard_versions.QUEUE)
        retire.add_argument("--reason", default="")
        freeze = sub.add_parser(
            "freeze", help="stop-the-line on|off (audited), or the freeze status"
        )
        freeze.add_argument("switch", choices=["on", "off", "status"])
        freeze.add_argument("--reason", default="", help="why (required to switch it on)")
        freeze.add_argument("--json", action="store_true")
        for p in sub.choices.values():
            p.add_argument("--actor", default=f"{getpass.getuser()} (cli)")

    def handle(self, *args: Any, **options: Any) -> None:
        # Before acting: an ESC in a reason would reach an operator's terminal later.
        if (problem := reason_problem(options.get("reason", ""))) is not None:
            raise CommandError(problem.replace('"reason"', "--reason"))
        try:
            getattr(self, f"do_{options['action']}")(options)
        except dashboard_versions.RolloutError as exc:
            raise CommandError(str(exc)) from None
        except Rollout.DoesNotExist:
            raise CommandError(f"no rollout #{options.get('id')}") from None

    # ------------------------------------------------------------------------ actions

    def do_start(self, o: dict[str, Any]) -> None:
        config: dict[str, Any] | None
        if o["version"] is not None:
            config = None
        elif o["config"] is not None:
            try:
                config = json.loads(o["config"].read_text())
            except (OSError, ValueError) as exc:
                raise CommandError(f"--config {o['config']}: {exc}") from None
            if not isinstance(config, dict):
                raise CommandError("--config must hold a JSON object")
        else:
            config = {}
            for item in o["set"]:
                key, sep, raw = item.partition("=")
                if not sep:
                    raise CommandError(f"--set expects KEY=VALUE, not {item!r}")
                config[key.strip()] = parse_value(key.strip(), raw.strip())
        options: dict[str, Any] = {}
        for item in o["option"]:
            key, sep, raw = item.partition("=")
            try:
                options[key.strip()] = float(raw)
            except ValueError:
                raise CommandError(f"--option expects KEY=NUMBER, not {item!r}") from None
            if not sep:
                raise CommandError(f"--option expects KEY=NUMBER, not {item!r}")
        if o["step_deadline"] is not None:
            options["step_deadline"] = o["step_deadline"]
        if o["on_inconclusive"] is not None:
            options["on_inconclusive"] = o["on_inconclusive"]
        if o["check"]:
            try:
                options["checks"] = [json.loads(c) for c in o["check"]]
            except ValueError as exc:
                raise CommandError(f"--check must be a JSON object: {exc}") from None
        warm = {
            k: o[f"warm_{name}"]
            for k, name in [
                ("repositories", "repositories"),
                ("commits_per_repository", "commits"),
                ("threshold", "threshold"),
            ]
            if o[f"warm_{name}"] is not None
        }
        if "threshold" in warm and not 0 < warm["threshold"] <= 1:
            raise CommandError("--warm-threshold must be in (0, 1]")
        if any(warm.get(k, 1) < 1 for k in ("repositories", "commits_per_repository")):
            raise CommandError("--warm-repositories and --warm-commits must be at least 1")

        ensure_baseline(queue=o["queue"], actor=o["actor"])
        ro = rollouts.start_rollout(
            queue=o["queue"],
            config=config,
            version=o["version"],
            steps=parse_steps(o["steps"]),
            auto=o["auto"],
            actor=o["actor"],
            warm_set=warm,
            options=options,
            enqueue_driver=o["driver"] == "queue",
        )
        if o["driver"] == "here":
            self.stdout.write(f"rollout {ro.pk}")
            self._drive(RolloutDriver(ro.pk, warmer=warm_rollout), o, takeover=False)
            return
        if o["driver"] == "queue":
            ro = self._wait(ro.pk, lambda r: r.state != "pending", o["timeout"], "the deploy lock")
        self.stdout.write(f"rollout {ro.pk} {ro.state}")
        if o["wait"]:
            ro = self._wait(
                ro.pk, lambda r: r.state in TERMINAL, None, "the end", say=self._freeze_waits()
            )
            self.stdout.write(f"rollout {ro.pk} {ro.state}: {ro.outcome}")
            if ro.state != "completed":
                raise CommandError(f"rollout {ro.pk} {ro.state}: {ro.outcome}")

    def _wait(
        self, pk: int, done: Any, timeout: float | None, what: str, say: Any = None
    ) -> Rollout:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ro = Rollout.objects.select_related("version").get(pk=pk)
            if done(ro) or ro.state in TERMINAL:
                return ro
            if say is not None:
                say(ro)
            if deadline is not None and time.monotonic() > deadline:
                raise CommandError(
                    f"rollout {pk}: no driver took {what} within {timeout:.0f}s "
                    "(is a worker serving the 'rollouts' queue? or use `rollout drive "
                    f"{pk}`)"
                )
            time.sleep(0.2)

    def _freeze_waits(self) -> Any:
        """For ``start --wait``: print each ``freeze.waiting`` of the rollout once (the
        driver waits out a freeze window: docs/rollouts.md#freeze-windows)."""
        seen: set[int] = set()

        def say(ro: Rollout) -> None:
            for ev in RolloutEvent.objects.filter(rollout=ro, action="freeze.waiting").exclude(
                pk__in=seen
            ):
                seen.add(ev.pk)
                self.stdout.write(f"rollout {ro.pk} {ev.reason}")

        return say

    def do_pin(self, o: dict[str, Any]) -> None:
        """docs/rollouts.md#pinning: refused (one line, exit 1) unless the rollout ramps."""
        ids = rollouts.pin_repositories(
            rollout=o["id"], repositories=o["repositories"], actor=o["actor"]
        )
        self.stdout.write(f"rollout {o['id']}: pinned {', '.join(f'#{i}' for i in ids)}")

    def do_unpin(self, o: dict[str, Any]) -> None:
        ids = rollouts.unpin_repositories(
            rollout=o["id"], repositories=o["repositories"], actor=o["actor"]
        )
        left = ", ".join(f"#{i}" for i in ids) or "nothing"
        self.stdout.write(f"rollout {o['id']}: {left} pinned")

    def do_retire(self, o: dict[str, Any]) -> None:
        v = retire_version(
            fingerprint=o["fingerprint"], queue=o["queue"], actor=o["actor"], reason=o["reason"]
        )
        self.stdout.write(f"{v.queue}@{v.fp12} retired")

    def do_freeze(self, o: dict[str, Any]) -> None:
        """docs/rollouts.md#freeze-windows: flip stop-the-line, or show what is frozen."""
        if o["switch"] == "on" and not o["reason"].strip():
            raise CommandError("rollout freeze on needs --reason (it is shown with every refusal)")
        if o["switch"] != "status":
            rollouts.set_stop_the_line(on=o["switch"] == "on", actor=o["actor"], reason=o["reason"])
        data = rollouts.freeze_status()
        if o["json"]:
            self.stdout.write(json.dumps(data, indent=2))
            return
        active = data["active"]
        self.stdout.write(f"frozen: {active['message']}" if active else "not frozen")
        line = data["stop_the_line"]
        self.stdout.write(
            f"stop-the-line: {'on' if line['on'] else 'off'}"
            + (
                f" (by {line['actor']} at {line['changed_at']}: {line['reason']})"
                if line["actor"]
                else ""
            )
        )
        for w in data["windows"]:
            days = ",".join(DAYS[d] for d in w.get("days", []))
            when = (
                f"{w['from']} – {w['until']}" if "from" in w
                else f"{w['start']}–{w['end']} UTC starting on {days}"
            )  # fmt: skip
            self.stdout.write(f"window {w['name']}: {when}")

    def do_status(self, o: dict[str, Any]) -> None:

        versions = AnalyzerVersion.objects.filter(queue=o["queue"]).order_by("-created_at")
        active = rollouts.active_rollout(o["queue"])
        lock = locks.redlock().inspect(workers_locks.deploy(o["queue"]))
        data = {
            "queue": o["queue"],
            "versions": [
                {
                    "fingerprint": v.fingerprint,
                    "state": v.state,
                    "ramp_percent": v.ramp_percent,
                    "code_version": v.code_version,
                    "config": v.config,
                    "queue": dashboard_versions.physical_queue(v.queue, v.fingerprint),
                    "verified_at": v.verified_at.isoformat() if v.verified_at else None,
                }
                for v in versions
            ],
            "rollout": describe_rollout(active) if active else None,
            "deploy_lock": describe_lock(lock) if lock else None,
            "frozen": rollouts.rollout_freeze(active) if active else None,
        }
        # The queue's latest rollout, also once it ended: a rollout the result contract
        # rolled back names its offending commits there (docs/rollouts.md#result-contract).
        last = Rollout.objects.filter(queue=o["queue"]).order_by("-pk").first()
        data["latest"] = describe_rollout(last) if last else None
        if o["json"]:
            self.stdout.write(json.dumps(data))
            return
        for v in data["versions"]:
            ramp = f" {v['ramp_percent']}%" if v["state"] == "ramping" else ""
            self.stdout.write(f"{v['queue']}  {v['state']}{ramp}  {json.dumps(v['config'])}")
        if active is None:
            self.stdout.write("no active rollout")
        else:
            self.stdout.write(
                f"rollout {active.pk} {active.state}: {active.version.fp12} by "
                f"{active.started_by}; lock {data['deploy_lock'] or 'not held'}"
            )
        result = (data["latest"] or {}).get("contract") or {}
        if result:
            latest = data["latest"]["id"]
            self.stdout.write(f"result contract (rollout {latest}): {result['summary']}")
        if data["frozen"]:
            held = f" ({data['frozen']['step']} waits)" if data["frozen"]["step"] else ""
            self.stdout.write(f"frozen: {data['frozen']['message']}{held}")
        for step in data["rollout"]["measurements"] if data["rollout"] else []:
            for kind in ("checks", "gates"):
                for m in step[kind]:
                    dry = " (dry run)" if m["dry_run"] else ""
                    self.stdout.write(
                        f"step {step['percent']}% {kind[:-1]} {m['name']}{dry}: {m['outcome']} "
                        f"{m['message']}"
                    )
        waits = data["rollout"]["waiting"] if data["rollout"] else None
        if waits and not data["frozen"]:  # docs/rollouts.md#waiting-reason (a freeze: above)
            until = f" (until {waits['until']})" if waits["until"] else ""
            self.stdout.write(f"waiting: {waits['reason']}{until}")

    def do_promote(self, o: dict[str, Any]) -> None:
        ro = rollouts.request_action(rollout=o["id"], action="promote", actor=o["actor"])
        ro = self._wait(ro.pk, lambda r: r.pending_action is None, o["timeout"], "the request")
        version = AnalyzerVersion.objects.get(pk=ro.version_id)
        self.stdout.write(f"rollout {ro.pk} {ro.state}: {version.state} {version.ramp_percent}%")

    def do_rollback(self, o: dict[str, Any]) -> None:
        self._end(rollback_rollout, "rollback", o)

    def do_abort(self, o: dict[str, Any]) -> None:
        self._end(abort_rollout, "abort", o)

    def _end(self, action: Any, verb: str, o: dict[str, Any]) -> None:
        """Roll back or abort (``deploy_lock``): refused in one line when it does not
        apply to the rollout's state; a live driver is asked and the request awaited."""
        ro = action(
            rollout=o["id"],
            actor=o["actor"],
            reason=o["reason"] or verb,
            force=o["force"],
            wait=o["timeout"],
        )
        if ro.pending_action and ro.pending_action.get("action") in {"rollback", "abort"}:
            self.stdout.write(f"rollout {ro.pk}: {verb} requested from its driver {ro.lock_holder}")
            ro = self._wait(ro.pk, lambda r: r.pending_action is None, o["timeout"], "the request")
        self.stdout.write(f"rollout {ro.pk} {ro.state}")

    def do_takeover(self, o: dict[str, Any]) -> None:
        driver = takeover_rollout(
            rollout=o["id"],
            actor=o["actor"],
            reason=o["reason"] or "takeover",
            force=o["force"],
            warmer=warm_rollout,
        )
        self.stdout.write(f"rollout {o['id']} taken over with token {driver.token}")
        self._drive(driver, o, takeover=True, acquired=True)

    def do_drive(self, o: dict[str, Any]) -> None:
        self._drive(RolloutDriver(o["id"], warmer=warm_rollout), o, takeover=o["takeover"])

    def _drive(
        self, driver: RolloutDriver, o: dict[str, Any], *, takeover: bool, acquired: bool = False
    ) -> None:
        """Hold the lock in the foreground; SIGTERM/SIGINT release it and leave the
        rollout for a takeover."""
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        if not acquired:
            driver.acquire(
                actor=o["actor"],
                takeover=takeover,
                force=o.get("force", False),
                reason=o.get("reason") or "driver started",
            )
        self.stdout.write(f"holding the deploy lock with token {driver.token}")
        self.stdout.flush()
        final = driver.run(stop=stop)
        self.stdout.write(f"rollout {driver.rollout_id} {final}")

    def do_checklist(self, o: dict[str, Any]) -> None:
        self.stdout.write(rollout_checklist(Rollout.objects.get(pk=o["id"])), ending="")
