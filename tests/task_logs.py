"""What a pipeline's task logs say at INFO (issue 47, "Logs a person can read"): one line per
phase with its outcome, and none of the noise that used to fill them. Used by the tests that
already run a pipeline (``dag.test()`` of the demo's DAG, the quickstart through a real Airflow)."""

from __future__ import annotations

import json
import re
from pathlib import Path

#: What a task log may never say: PySpark's warning about pandas 3 (twice per write job on pandas
#: 3.x: constraints.txt pins pandas 2), Alembic's two lines per opening of the committer store, the
#: staging connection's ignored extra fields and Airflow's too-short-secret notice on every call,
#: a raw record's repr.
LOG_NOISE = (
    "PySpark does not yet fully support pandas",
    "Context impl ",
    "Will assume ",
    "staging ignores the extra fields",
    "Skipping masking for a secret",
    "TransitionRecord(",
)


def noise(log: str) -> list[str]:
    """The entries of :data:`LOG_NOISE` that ``log`` contains."""
    return [n for n in LOG_NOISE if n in log]


#: A Spark (log4j) INFO line as spark-submit prints it: ``26/11/29 03:12:21 INFO SparkContext: ...``.
_SPARK_INFO = re.compile(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d INFO (\w+): ")


def spark_info_loggers(log: str) -> set[str]:
    """The Spark loggers that said something at INFO in ``log`` (spark-submit's output). With
    ``spark.log.level`` WARN only SparkContext's first lines (version, OS, Java), said before
    it applies the level, are left."""
    return set(_SPARK_INFO.findall(log))


def phase_lines(log: str, pipeline: str, key: str, rows: int) -> dict[str, int]:
    """How many lines of ``log`` say each phase's outcome for checkpoint ``pipeline/key``."""
    name = re.escape(f"{pipeline}/{key}")
    phases = {
        "register": rf"Checkpoint {name} sequence \d+: attempt 1 stages into ",
        "seal": rf"Sealed {name} attempt 1: \d+ committables, {rows} rows, ",
        "durable": rf"checkpoint {name} attempt 1: all \d+ committables present and verified",
        "publish": rf"committed {name} \(lease fencing\): \d+ published, 0 already there, {rows} rows",
        "announce": rf"Checkpoint {name} committed by this task",
        "skip": rf"Checkpoint {name} is already COMMITTED .*: SKIPPED, nothing is rewritten",
    }
    return {phase: len(re.findall(pattern, log)) for phase, pattern in phases.items()}


def task_log(logs_dir: Path, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
    """The messages of one task try's log file (Airflow 3 writes it as JSON lines), one a line."""
    path = (
        logs_dir
        / f"dag_id={dag_id}"
        / f"run_id={run_id}"
        / f"task_id={task_id}"
        / f"attempt={try_number}.log"
    )
    return "\n".join(str(json.loads(line).get("event", "")) for line in path.read_text().splitlines() if line)
