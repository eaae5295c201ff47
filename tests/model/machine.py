"""The Hypothesis state machine: random interleavings of every operation on one pipeline.

Each example (a *schedule*) picks one target combination, then runs random
steps (:mod:`.world` executes them with the real core and real processes) and
after every step checks the target and the committer table against the
reference model. A violation raises with the schedule so far, as JSON that
``python -m tests.model --replay FILE`` runs again; Hypothesis shrinks it
first, so the schedule printed last is the shortest it found.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test, initialize, invariant, rule

from . import people, storage_ops
from .kafka import KAFKA_KILL_POINTS
from .stores import ObjectStore
from .world import GROUP_KILL_POINTS, KEYS, KILL_POINTS, PAUSE_POINTS, Config, World, schedule_text


@dataclass(frozen=True)
class Combo:
    """One target combination: kind, mode, fencing (and the SQL database's URL), and where it
    stages: ``local``, or ``s3`` (tables and staging in the bucket of the S3 server at ``s3_endpoint``),
    ``gs`` or ``abfss`` (the same on the emulator ``store``: :mod:`.stores`)."""

    kind: str
    mode: str
    fencing: str
    sql_url: str | None = None
    staging: str = "local"
    s3_endpoint: str | None = None
    store: ObjectStore | None = None
    #: The mock Kafka cluster's bootstrap address: the pipeline reads a topic (``--source kafka``).
    kafka: str | None = None
    #: Partition values from the widened data domain (``tests/data_domain.py``), drawn per schedule.
    wide: bool = False
    #: Draw the commit's ``verify_checksums`` per schedule and the ``corrupt`` step (the CLI's runs);
    #: off (CI's random schedules): verify_checksums on and no ``corrupt``, so CI draws exactly the
    #: schedules it drew before (its cost stays; CI pins ``corrupt`` in fixed schedules instead).
    corrupting: bool = False
    #: The Iceberg catalog: ``sql``, or ``rest`` at ``rest_uri`` (``tests/model/rest.py``): then the
    #: ``unreported`` step is drawn too (a commit the catalog applied but did not report).
    catalog: str = "sql"
    rest_uri: str | None = None

    @property
    def label(self) -> str:
        sql = f"-{self.sql_url.split(':', 1)[0].split('+')[0]}" if self.sql_url else ""
        rest = "-rest" if self.catalog == "rest" else ""
        return (f"{self.kind}{sql}{rest}/{self.mode}/{self.fencing}" + (f"/{self.staging}" if self.staging != "local" else "")
                + ("/kafka" if self.kafka else "") + ("/wide" if self.wide else ""))  # fmt: skip

    def config(
        self,
        work: str,
        db_url: str,
        *,
        domain: tuple[tuple[str, str], ...] | None = None,
        verify_checksums: bool = True,
    ) -> Config:
        """A fresh pipeline of this combination in ``work`` (its S3 prefix derived from both), with
        the schedule's drawn partitions (``domain``) and ``verify_checksums``."""
        url = db_url if db_url != "sqlite" else f"sqlite:///{work}/committer.db"
        return Config(self.kind, self.mode, self.fencing, work, url, self.sql_url,
                      pipeline=f"m{uuid.uuid4().hex[:10]}", staging=self.staging,
                      s3_endpoint=self.s3_endpoint, store=self.store, kafka=self.kafka, domain=domain,
                      verify_checksums=verify_checksums, catalog=self.catalog, rest_uri=self.rest_uri)  # fmt: skip


@st.composite
def domain_partitions(draw: Any) -> tuple[tuple[str, str], ...]:
    """Five partitions ``(k, t)`` of the widened data domain (``tests/data_domain.py``), of distinct
    Hive directories (NULL and ``''`` share one): string values in a drawn order, temporal values
    drawn; half the time the first two are ``a`` and ``a `` with one ``t`` (a replace of one that
    compares with PAD SPACE, as MariaDB's collations do, would take the other)."""
    from airflow_provider_walsink.core.protocol.partitions import partition_dir
    from tests import data_domain as D

    names = draw(st.permutations(list(D.STRINGS)), label="strings")
    times = draw(st.lists(st.sampled_from(list(D.TEMPORAL)), min_size=len(names), max_size=len(names)),
                 label="temporal")  # fmt: skip
    pairs = list(zip(names, times, strict=True))
    if draw(st.booleans(), label="pad space"):
        pairs = [("plain", times[0]), ("trailing space", times[0])] + [
            p for p in pairs if p[0] not in ("plain", "trailing space")
        ]
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for k, t in pairs:
        directory = partition_dir(D.COLUMNS, (D.STRINGS[k], D.TEMPORAL[t]))
        if directory not in seen:
            seen.add(directory)
            out.append((k, t))
    return tuple(out[: len(KEYS)])


@dataclass
class Figures:
    """What a run did: schedules, steps, per-operation counts, violations with their schedules."""

    schedules: int = 0
    steps: int = 0
    counts: Counter = field(default_factory=Counter)
    violations: list[tuple[str, list[str], str]] = field(default_factory=list)  # (combo, problems, schedule)
    last_failure: tuple[str, list[str], str] | None = None

    def describe(self) -> str:
        c = self.counts
        ops = ", ".join(f"{k} {v}" for k, v in sorted(c.items()) if "@" not in k)
        kills = ", ".join(f"{k.split('@', 1)[1]} {v}" for k, v in sorted(c.items()) if k.startswith("kill@"))
        return (
            f"schedules {self.schedules}, steps {self.steps}, kills {c['kills']}, pauses {c['pauses']}, "
            f"violations {len(self.violations)}\n  operations: {ops}\n  kills at: {kills or '-'}"
        )


KEY = st.sampled_from(KEYS)
#: Operations and their weights (a name repeated is drawn more often). ``run`` is a whole DAG run:
#: write, durable check, commit; the others interleave with it.
WEIGHTED = (
    ["run"] * 6 + ["write"] * 2 + ["durable"] * 2 + ["commit"] * 2 + ["crash"] * 5 + ["pause"] * 3
    + ["race", "recommit", "abort", "abort", "abort_race", "reprocess", "reprocess", "retention", "gc", "maintain", "maintain",
       "maintain", "symlink"]
    + ["group"] * 3  # issue 24: skipped (a no-op step) where the combination cannot group
    # Hostile: a staged file changed after the seal; a second seal of the sealed attempt.
    + ["tamper"] * 2 + ["reseal"]
    # Composite: compaction then a reprocess (table targets); a crash, retention, a re-run with other data.
    + ["compact_reprocess"] * 2 + ["crash_rerun"] * 2
    # People and Airflow around the pipeline (people.py): partition keys, audit approvals, deadlines.
    + people.WEIGHTED
    # Issue 49: an abort while WRITING, racing seals, bytes and size changed, a files publish paused
    # between two moves (tests/model/storage_ops.py).
    + storage_ops.WEIGHTED
)  # fmt: skip
#: ``Combo.corrupting``: the operations with ``corrupt`` (hostile, every staging store: a staged value
#: changed in place, same size, after durability, then a commit), weighted as ``tamper``.
WEIGHTED_CORRUPTING = [*WEIGHTED, "corrupt", "corrupt"]
#: ``Combo.catalog == "rest"``: ``unreported`` too (issue 45: the catalog applied the commit, then
#: answered 5xx, dropped the connection or answered past the time-out), more often than a crash: about
#: one draw in six, as before issue 49's operations joined the list.
UNREPORTED = ["unreported"] * 12


def machine_for(
    combos: list[Combo], workdir: str, db_url: str, figures: Figures
) -> type[RuleBasedStateMachine]:
    """A state machine class over ``combos``; every example's figures are added to ``figures``."""

    class PipelineMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.world: World | None = None
            self.steps: list[dict[str, Any]] = []

        @initialize(combo=st.sampled_from(combos))
        def start(self, combo: Combo) -> None:
            # The world is built at the first step, which draws what the combination draws
            # (domain, verify_checksums): a combination that draws nothing more draws as before.
            self.combo = combo
            figures.schedules += 1

        def _build(self, data: st.DataObject) -> None:
            combo = self.combo
            verify = data.draw(st.booleans(), label="verify_checksums") if combo.corrupting else True
            domain = data.draw(domain_partitions(), label="domain") if combo.wide else None
            work = tempfile.mkdtemp(prefix="s-", dir=workdir)
            self.world = World(combo.config(work, db_url, domain=domain, verify_checksums=verify))
            figures.counts["verify_checksums.on" if verify else "verify_checksums.off"] += 1

        def _do(self, step: dict[str, Any]) -> None:
            assert self.world is not None
            self.steps.append(step)
            figures.steps += 1
            self.world.run(step)

        @property
        def kind(self) -> str:
            return self.world.cfg.kind if self.world else ""

        @rule(op=st.sampled_from(WEIGHTED), data=st.data())
        def step(self, op: str, data: st.DataObject) -> None:
            """One operation, drawn with the weights of :data:`WEIGHTED` (Hypothesis has no rule weights)."""
            if self.world is None:
                self._build(data)
            if self.combo.corrupting or self.combo.catalog == "rest":
                # Drawn again from the list with corrupt and/or unreported (CI's other draws stay as they were).
                ops = (WEIGHTED_CORRUPTING if self.combo.corrupting else WEIGHTED) + (
                    UNREPORTED if self.combo.catalog == "rest" else []
                )
                op = data.draw(st.sampled_from(ops), label="op")
            key = data.draw(KEY, label="key")
            if op in people.OPS:
                step = people.draw(op, key, data, self.world.cfg)
                if step is not None:
                    self._do(step)
                return
            if op in ("run", "write"):
                n = data.draw(st.sampled_from([2, 1, 3, 0]), label="n")  # 0: an empty checkpoint
                parts = data.draw(st.sampled_from([[0], [1], [0, 1]]), label="parts")
                nulls = data.draw(st.booleans(), label="nulls")
                self._do({"op": op, "key": key, "n": n, "parts": parts, "nulls": nulls})
            elif op in ("symlink", "tamper", "reseal") and self.world.cfg.staging != "local":
                # An object store has no symlinks; tamper rewrites local files; a store's seal is the
                # service's conditional create, tested on its own (and by CI's fixed schedules).
                return
            elif op in storage_ops.OPS:
                step = storage_ops.draw(op, key, data, self.world)
                if step is not None:
                    self._do(step)
            elif op == "durable":
                # The sensor's default checks sizes only; one in three without checksums.
                verify = data.draw(st.sampled_from([True, True, False]), label="verify")
                self._do({"op": op, "key": key} if verify else {"op": op, "key": key, "verify": False})
            elif op == "tamper":
                how = data.draw(st.sampled_from(["truncate", "extend", "same_size", "manifest"]), label="how")
                self._do({"op": op, "key": key, "how": how})
            elif op == "compact_reprocess":
                if self.kind not in ("iceberg", "delta"):
                    return
                self._do({"op": op, "key": key, "n": data.draw(st.integers(0, 3), label="n")})
            elif op == "crash_rerun":
                points = KILL_POINTS[self.kind]
                point = data.draw(st.sampled_from(points), label="point")
                self._do({"op": op, "key": key, "point": point, "n": data.draw(st.integers(0, 3), label="n")})
            elif op in (
                "durable",
                "commit",
                "recommit",
                "race",
                "abort",
                "abort_race",
                "symlink",
                "reseal",
                "corrupt",
            ):
                self._do({"op": op, "key": key})
            elif op == "group":
                point = data.draw(st.sampled_from([None, None, *GROUP_KILL_POINTS]), label="point")
                also = data.draw(st.lists(KEY, max_size=3, unique=True), label="also")
                race = data.draw(st.booleans(), label="race")
                self._do({"op": op, "key": key, "point": point, "also": also, "race": race})
            elif op == "unreported":
                from .rest import UNREPORTED as FAULTS

                # "slow" costs the client's time-out and more: drawn less often than the others.
                fault = data.draw(st.sampled_from([*FAULTS, *FAULTS[:-1]]), label="fault")
                down = data.draw(st.sampled_from([False, False, True]), label="down")
                group = data.draw(st.booleans(), label="group")
                also = data.draw(st.lists(KEY, max_size=2, unique=True), label="also") if group else []
                self._do({"op": op, "key": key, "fault": fault, "down": down, "group": group, "also": also})
            elif op == "crash":
                points = KILL_POINTS[self.kind] + (KAFKA_KILL_POINTS if self.world.cfg.kafka else ())
                point = data.draw(st.sampled_from(points), label="point")
                retry = data.draw(st.sampled_from([True, True, False]), label="retry")
                self._do({"op": op, "key": key, "point": point, "retry": retry})
            elif op == "pause":
                point = data.draw(st.sampled_from(PAUSE_POINTS[self.kind]), label="point")
                then = data.draw(
                    st.sampled_from(["commit", "abort", "reprocess", "rerun", "paused_commit"]), label="then"
                )
                self._do({"op": op, "key": key, "point": point, "then": then})
            elif op == "reprocess":
                self._do({"op": op, "key": key, "n": data.draw(st.integers(0, 3), label="n")})
            elif op in ("retention", "gc"):
                self._do({"op": op})
            elif op == "maintain":
                if self.kind == "delta":
                    action = data.draw(
                        st.sampled_from(["compact", "checkpoint", "cleanup", "vacuum"]), label="a"
                    )
                elif self.kind == "iceberg":
                    action = data.draw(st.sampled_from(["compact", "expire"]), label="a")
                else:
                    return
                self._do({"op": op, "action": action})

        @invariant()
        def matches_model(self) -> None:
            if self.world is None or not self.steps:
                return
            problems = self.world.check()
            if problems:
                text = schedule_text(self.world.cfg, self.steps)
                figures.last_failure = (self.world.cfg.label, problems, text)
                raise AssertionError(
                    f"{len(problems)} violation(s) on {self.world.cfg.label} after step {len(self.steps) - 1} "
                    f"({self.steps[-1]['op']}):\n  " + "\n  ".join(problems[:12]) + f"\nschedule: {text}"
                )

        def teardown(self) -> None:
            if self.world is not None:
                figures.counts.update(self.world.counts)
                work = self.world.cfg.work
                self.world.close()
                shutil.rmtree(work, ignore_errors=True)

    return PipelineMachine


def run_machine(
    combos: list[Combo],
    *,
    seed_value: int,
    schedules: int,
    steps: int,
    workdir: str,
    db_url: str = "sqlite",
    figures: Figures | None = None,
    shrink: bool = True,
) -> Figures:
    """Run ``schedules`` random schedules of up to ``steps`` steps over ``combos``; a violation is
    recorded in the figures (with its shrunk schedule), never raised."""
    figures = figures or Figures()
    Path(workdir).mkdir(parents=True, exist_ok=True)
    machine = machine_for(combos, workdir, db_url, figures)
    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if shrink else [])
    test = get_state_machine_test(
        machine,
        settings=settings(
            max_examples=schedules,
            stateful_step_count=steps,
            deadline=None,
            database=None,
            derandomize=False,
            phases=phases,
            suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False,
            print_blob=False,
        ),
        _min_steps=0,
        _flaky_state={"selecting_rule": False},
    )
    try:
        seed(seed_value)(test)()
    except BaseException as exc:  # noqa: BLE001 - AssertionError, or Flaky when a shrunk replay raced
        if isinstance(exc, KeyboardInterrupt):
            raise
        if figures.last_failure is not None:
            figures.violations.append(figures.last_failure)
        else:
            figures.violations.append(
                (",".join(c.label for c in combos), [f"{type(exc).__name__}: {exc}"[:2000]], "")
            )
    return figures


def minimize(
    combo: Combo,
    steps: list[dict[str, Any]],
    workdir: str,
    *,
    db_url: str = "sqlite",
    domain: tuple[tuple[str, str], ...] | None = None,
    verify_checksums: bool = True,
) -> list[dict[str, Any]]:
    """Hypothesis's shrink, finished by hand: drop each step whose removal keeps a violation.

    Hypothesis shrinks the draws of a stateful run, which leaves steps that became no-ops (a
    run of a COMMITTED key); this greedy pass replays the schedule without each step in turn
    (one replay per step, so a few seconds per step) and keeps the shorter schedule that still
    fails. Timing-dependent violations may need the step they lose: then it stays. Returns the
    steps and the violations of their last failing replay.
    """
    found: list[str] = []
    from .world import replay

    def fails(candidate: list[dict[str, Any]]) -> bool:
        nonlocal found
        work = tempfile.mkdtemp(prefix="min-", dir=workdir)
        cfg = combo.config(work, db_url, domain=domain, verify_checksums=verify_checksums)
        try:
            problems = replay(cfg, candidate, verbose=False)
            if problems:
                found = problems
            return bool(problems)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    fails(steps)
    i = len(steps) - 1
    while i >= 0 and len(steps) > 1:
        candidate = steps[:i] + steps[i + 1 :]
        if fails(candidate):
            steps = candidate
        i -= 1
    fails(steps)
    return steps, found


def load_schedule(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    data = json.loads(text)
    return data["config"], data["steps"]


def drawn(config: dict[str, Any]) -> dict[str, Any]:
    """A schedule's drawn settings (as printed by ``schedule_text``), as ``Config`` arguments."""
    domain = config.get("domain")
    return {
        "domain": tuple(tuple(p) for p in domain) if domain else None,
        "verify_checksums": config.get("verify_checksums", True),
    }
