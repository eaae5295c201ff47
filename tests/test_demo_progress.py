"""The demos' ``Progress.wait`` waits for every DAG's run, though the DAGs' runs share run ids.

Found by the cluster demo with a third DAG: the demos trigger every example DAG for the same days
with the run id ``demo__<day>``; keyed by run id alone, the wait saw one DAG's finished run for
all of them and moved on while another DAG's run was still queued (its checkpoint then stopped
WRITING when the demo stopped Airflow). A stand-in for the stack's REST answers, the only part
``Progress`` reads.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))  # the demo lives in scripts/

from demo import Progress  # noqa: E402


class Answers:
    """``dag_runs`` / ``task_instances`` as the api-server answers them, advanced one poll at a time."""

    def __init__(self, states: dict[str, list[str]]) -> None:
        self.states, self.polls = states, 0

    def dag_runs(self, dag_id: str) -> list[dict]:
        if dag_id == "a":
            self.polls += 1
        seq = self.states[dag_id]
        state = seq[min(self.polls - 1, len(seq) - 1)]
        return [{"dag_id": dag_id, "dag_run_id": "demo__2026-01-01", "state": state,
                 "logical_date": "2026-01-01T00:00:00Z"}]  # fmt: skip

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        return []


def test_wait_returns_only_when_every_dags_run_with_the_shared_run_id_has_finished(monkeypatch):
    monkeypatch.setattr("demo.time.sleep", lambda s: None)
    # DAG "a" is still queued and running while DAG "b" (same run id) has finished.
    answers = Answers({"a": ["queued", "running", "running", "success"], "b": ["success"]})
    Progress(answers).wait(["a", "b"], {("a", "demo__2026-01-01"), ("b", "demo__2026-01-01")})
    assert answers.polls == 4  # it waited for "a" to finish
