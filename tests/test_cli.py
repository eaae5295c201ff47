"""The ``walsink`` command as an operator meets it: the real console entry point in a
subprocess (stdout and stderr apart, exit status), against real SQLite, PostgreSQL and
MySQL URLs and a real Airflow connection.

Contracts under test: results alone on stdout, so ``--json`` always parses (errors
too); every failure is one line on stderr with a non-zero status and no traceback;
nothing is created by a read or by a mistyped path; gc cleans where the connection's
pipelines stage; the on-call listing filters by state and age.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from airflow_stack import free_port
from sqlalchemy import update

from airflow_provider_walsink import __version__
from airflow_provider_walsink.core.store.errors import PipelineOwnedError
from airflow_provider_walsink.core.store.models import checkpoint_table as ckpt
from airflow_provider_walsink.core.store.store import CommitterStore, utcnow
from tests.helpers import ACTOR, REPO


def walsink(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Run the installed ``walsink`` console script (this checkout's code via PYTHONPATH)."""
    script = Path(sys.executable).with_name("walsink")
    command = (
        [str(script)] if script.exists() else [sys.executable, "-m", "airflow_provider_walsink.cli.commands"]
    )
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), full_env.get("PYTHONPATH")]))
    full_env.pop("WALSINK_DATABASE_URL", None)
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, env=full_env, cwd=cwd or REPO, timeout=300
    )


def one_line_error(result: subprocess.CompletedProcess, *needles: str) -> str:
    """Assert a failure reported as one line naming the problem, without a traceback."""
    assert result.returncode != 0, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def filled(sqlite_store):
    """Pipelines ``orders`` and ``events`` with checkpoints in several states and ages."""
    store = sqlite_store
    now = utcnow()
    rows = [
        # pipeline, key, state, hours since the last change, error
        ("orders", "k1", "COMMITTED", 5, None),
        ("orders", "k2", "FAILED", 3, "PublishError: target refused\nsecond line"),
        ("orders", "k3", "WRITING", 0.1, None),
        ("events", "e1", "DURABLE", 2, None),
        ("events", "e2", "COMMITTED", 0.2, None),
    ]
    for pipeline, key, state, hours, error in rows:
        store.register(pipeline, key, mode="overwrite", actor=ACTOR)
        with store.engine.begin() as conn:
            conn.execute(
                update(ckpt)
                .where(ckpt.c.pipeline == pipeline, ckpt.c.checkpoint_key == key)
                .values(state=state, updated_at=now - timedelta(hours=hours), error=error)
            )
    return store


def test_json_output_parses_for_every_command(filled, tmp_path):
    url = str(filled.engine.url)
    staging = tmp_path / "staging"
    staging.mkdir()  # a --staging-root that does not exist is an error (a typo)
    results = {
        "status": walsink("--url", url, "status", "--json"),
        "status (flag first)": walsink("--json", "--url", url, "status"),
        "checkpoints": walsink("--url", url, "checkpoints", "--not-state", "COMMITTED", "--json"),
        "db upgrade": walsink("--url", url, "db", "upgrade", "--json"),
        "gc": walsink("--url", url, "gc", "--staging-root", str(staging), "--dry-run", "--json"),
        "reassign": walsink("--url", url, "reassign", "orders", "--dag", "orders_v2", "--json"),
        "error": walsink("--url", url, "status", "--pipeline", "nope", "--json"),
        "usage error": walsink("--json", "no-such-command"),
    }
    parsed = {name: json.loads(r.stdout) for name, r in results.items()}
    assert [p["pipeline"] for p in parsed["status"]] == ["events", "orders"]
    assert parsed["status (flag first)"] == parsed["status"]
    states = {c["key"]: c["state"] for p in parsed["status"] for c in p["checkpoints"]}
    assert states == {"k1": "COMMITTED", "k2": "FAILED", "k3": "WRITING", "e1": "DURABLE", "e2": "COMMITTED"}
    assert {c["key"] for c in parsed["checkpoints"]["checkpoints"]} == {"k2", "k3", "e1"}
    assert parsed["db upgrade"]["schema"] == "head"
    assert parsed["gc"]["dry_run"] is True and parsed["gc"]["staging_root"] == str(staging)
    assert "unknown pipeline 'nope'" in parsed["error"]["error"]
    assert "invalid choice" in parsed["usage error"]["error"]
    assert [r.returncode for r in results.values()] == [0, 0, 0, 0, 0, 0, 1, 2]
    # reassign hands the pipeline to the renamed DAG: the old DAG id is refused from then on.
    assert parsed["reassign"] == {
        "pipeline": "orders",
        "dag_id": "orders_v2",
        "previous_dag_id": ACTOR.dag_id,
    }
    with pytest.raises(PipelineOwnedError, match="belongs to DAG 'orders_v2'"):
        filled.register("orders", "k9", mode="overwrite", actor=ACTOR)


def test_logs_go_to_stderr(tmp_path):
    """The embedded default (no connection) is announced by a log line; it must not reach stdout."""
    home = tmp_path / "home"
    env = {"AIRFLOW_HOME": str(home), "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path}/af.db"}
    created = walsink("db", "upgrade", "--json", "--verbose", env=env)
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["source"] == "embedded default"
    assert "alembic" in created.stderr  # the migration's log lines went to stderr
    listed = walsink("status", "--json", "-v", env=env)
    assert listed.returncode == 0 and json.loads(listed.stdout) == []


def test_gc_cleans_the_connections_staging_root(airflow_db, tmp_path):
    """The connection (in Airflow's metadata database, as the UI makes it) names a staging
    root; gc must clean there, not in the default root. Its password is shorter than Airflow's
    masker masks: Airflow's "Skipping masking for a secret as it's too short" warning, on every
    command before (issue 47), is not the command's to say (it logs no secret); stderr stays empty."""
    staging = tmp_path / "conn-staging"
    committer = tmp_path / "committer.db"
    CommitterStore.from_url(f"sqlite:///{committer}").dispose()
    conn_id = f"walsink_gc_{os.getpid()}"
    subprocess.run(
        [sys.executable, "-m", "airflow", "connections", "add", conn_id, "--conn-type", "walsink",
         "--conn-schema", str(committer), "--conn-password", "pw",
         "--conn-extra", json.dumps({"backend": "sqlite", "staging_root": str(staging)})],
        check=True, capture_output=True, env=os.environ.copy(),
    )  # fmt: skip
    try:
        # A checkpoint directory the committer table does not know (its rows trimmed), two days
        # old, of a pipeline it knows (GC leaves unknown pipelines' directories alone): garbage.
        store = CommitterStore.from_url(f"sqlite:///{committer}")
        store.register("ghost", "k0", mode="overwrite", actor=ACTOR)
        store.dispose()
        orphan = staging / "ghost" / "k1" / "attempt-1"
        orphan.mkdir(parents=True)
        (orphan / "part-0.csv").write_text("x\n")
        stamp = time.time() - 2 * 86400
        for path in (orphan / "part-0.csv", orphan, orphan.parent):
            os.utime(path, (stamp, stamp))

        result = walsink("--conn-id", conn_id, "gc", "--json")
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
        report = json.loads(result.stdout)
        assert report["staging_root"] == str(staging)
        assert report["checkpoint_dirs_removed"] == ["ghost/k1"]
        assert not orphan.parent.exists()
    finally:
        subprocess.run(
            [sys.executable, "-m", "airflow", "connections", "delete", conn_id],
            capture_output=True, env=os.environ.copy(),
        )  # fmt: skip


@pytest.mark.parametrize("command", [["status"], ["checkpoints"], ["gc", "--dry-run"]])
def test_unknown_pipeline_is_an_error(filled, tmp_path, command):
    args = ["--url", str(filled.engine.url), *command, "--pipeline", "nope"]
    if command[0] == "gc":
        args += ["--staging-root", str(tmp_path)]
    one_line_error(walsink(*args), "unknown pipeline 'nope'", "orders")


@pytest.mark.parametrize(
    ("url", "needles"),
    [
        ("not a url", ["invalid database URL"]),
        ("nosuchdb://x/y", ["invalid database URL", "nosuchdb"]),
        ("postgresql+psycopg2://postgres@127.0.0.1:{port}/test", ["cannot use", "127.0.0.1", "refused"]),
        ("mysql+pymysql://root@127.0.0.1:{port}/test", ["cannot use", "127.0.0.1"]),
    ],
)
def test_bad_or_unreachable_database_url(url, needles):
    url = url.format(port=free_port())  # nothing listens there
    for command in (["status"], ["checkpoints"], ["db", "upgrade"]):
        one_line_error(walsink("--url", url, *command), *needles)


def test_password_is_not_printed():
    line = one_line_error(
        walsink("--url", f"postgresql+psycopg2://u:s3cret@127.0.0.1:{free_port()}/x", "status")
    )
    assert "s3cret" not in line and "***" in line


def test_missing_sqlite_directory_is_not_created(tmp_path):
    for command in (["status"], ["checkpoints"], ["db", "upgrade"]):
        result = walsink("--url", "sqlite:///missing/dir/x.db", *command, cwd=tmp_path)
        one_line_error(result, str(tmp_path / "missing" / "dir"), "does not exist")
        assert not (tmp_path / "missing").exists()
    absent = tmp_path / "absent.db"
    one_line_error(walsink("--url", f"sqlite:///{absent}", "status"), "no committer database", "db upgrade")
    assert not absent.exists()  # a read creates no database


def test_missing_driver_names_the_extra(tmp_path):
    # Whether or not mysqlclient is installed here, the CLI runs as if it were not:
    # a stand-in MySQLdb ahead on the path fails to import, as a missing package does.
    hidden = tmp_path / "no-driver"
    hidden.mkdir()
    (hidden / "MySQLdb.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'MySQLdb'\", name='MySQLdb')\n"
    )
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(hidden), os.environ.get("PYTHONPATH")]))}
    line = one_line_error(walsink("--url", "mysql://root@127.0.0.1:3306/test", "status", env=env))
    assert 'pip install "airflow-provider-walsink[mysql]"' in line and "mysql+pymysql://" in line


def test_version_and_help():
    version = walsink("--version")
    assert (
        version.returncode == 0
        and version.stdout.strip() == f"walsink {__version__} (airflow-provider-walsink)"
    )
    help_ = walsink("--help")
    assert help_.returncode == 0
    assert "examples:" in help_.stdout
    assert "walsink checkpoints --not-state COMMITTED --older-than 1h" in help_.stdout
    assert "airflow-provider-walsink[mysql]" in help_.stdout


def test_checkpoints_by_state_and_age_for_a_ticket(filled):
    url = str(filled.engine.url)
    result = walsink("--url", url, "checkpoints", "--not-state", "COMMITTED", "--older-than", "1h")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(
        "walsink checkpoints: state not COMMITTED, unchanged for at least 1h, all pipelines"
    )
    assert lines[1].startswith("committer database: sqlite:///")
    header, *rows, total = lines[2:]
    assert header.split()[:5] == ["pipeline", "seq", "checkpoint", "state", "att"]
    # k3 changed six minutes ago, the COMMITTED ones are excluded.
    assert [r.split()[:4] for r in rows] == [
        ["events", "1", "e1", "DURABLE"],
        ["orders", "2", "k2", "FAILED"],
    ]
    assert "PublishError: target refused" in rows[1] and "second line" not in result.stdout
    assert total == "2 checkpoints"

    only = walsink("--url", url, "checkpoints", "--state", "committed", "--pipeline", "orders", "--json")
    assert [c["key"] for c in json.loads(only.stdout)["checkpoints"]] == ["k1"]
    one_line_error(
        walsink("--url", url, "checkpoints", "--state", "STUCK"), "unknown state 'STUCK'", "COMMITTED"
    )
    one_line_error(
        walsink("--url", url, "checkpoints", "--older-than", "soon"), "--older-than", "invalid duration"
    )


def test_abort_by_hand(filled):
    url = str(filled.engine.url)
    result = walsink("--url", url, "abort", "orders", "k3", "--reason", "INC-1: corrupt input", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["state"] == "ABORTED"
    assert filled.require("orders", "k3").state.value == "ABORTED"
    assert "INC-1: corrupt input" in filled.history("orders", "k3")[-1].detail
    one_line_error(walsink("--url", url, "abort", "orders", "nope", "--reason", "x"), "no checkpoint 'nope'")
    one_line_error(walsink("--url", url, "abort", "orders", "k1"), "--reason")  # required: for the history


def test_read_commands_do_not_migrate(tmp_path):
    """A database without the schema is reported, not silently given one."""
    empty = tmp_path / "empty.db"
    import sqlite3

    sqlite3.connect(empty).close()
    one_line_error(
        walsink("--url", f"sqlite:///{empty}", "status"), "no walsink committer schema", "db upgrade"
    )
    with sqlite3.connect(empty) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)


@pytest.fixture(autouse=True)
def _no_stray_dirs():
    yield
    shutil.rmtree(REPO / "missing", ignore_errors=True)  # were a regression to create it here


def test_status_shows_the_newest_checkpoints_and_says_what_the_limit_hid(filled):
    url = str(filled.engine.url)
    result = walsink("--url", url, "status", "--pipeline", "orders", "--limit", "2")
    assert result.returncode == 0, result.stderr
    assert "1 earlier checkpoints not shown (--limit 2)" in result.stdout
    shown = [
        line.split()[1] for line in result.stdout.splitlines() if line.strip().split()[:1] in (["2"], ["3"])
    ]
    assert shown == ["k2", "k3"] and " k1 " not in result.stdout  # the newest two, oldest first
    listed = json.loads(
        walsink("--url", url, "status", "--pipeline", "orders", "--limit", "2", "--json").stdout
    )
    assert [c["key"] for c in listed[0]["checkpoints"]] == ["k2", "k3"]


@pytest.mark.parametrize("limit", ["0", "-1", "many"])
def test_a_limit_below_one_is_a_usage_error(filled, limit):
    url = str(filled.engine.url)
    for command in ("status", "checkpoints"):
        result = walsink("--url", url, command, f"--limit={limit}")
        assert result.returncode == 2 and "--limit" in result.stderr, result.stderr
        assert result.stdout == ""  # nothing printed before the error


def test_the_superseded_state_is_explained_not_silently_matched_to_nothing(filled):
    result = walsink("--url", str(filled.engine.url), "checkpoints", "--state", "superseded")
    one_line_error(result, "SUPERSEDED is the state of a reprocessed checkpoint's earlier versions")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["abort", "orders", "k1"], ["abort:", "required: --reason", "walsink abort --help"]),
        (["abort", "orders"], ["abort:", "required", "checkpoint"]),
        (["no-such-command"], ["invalid choice", "walsink --help"]),
        (["status", "--limit", "0"], ["status:", "--limit"]),
    ],
)
def test_a_bad_command_line_is_one_walsink_error_line(filled, args, needles):
    """Usage errors read like every other failure: one `walsink: error: ...` line, exit 2, no usage dump."""
    result = walsink("--url", str(filled.engine.url), *args)
    line = one_line_error(result, *needles)
    assert line.startswith("walsink: error: "), line
    assert result.returncode == 2 and "usage:" not in result.stderr and result.stdout == ""


def test_a_duration_without_a_unit_is_refused_naming_the_units(filled, tmp_path):
    """`--older-than 1` read as one second would list everything as stuck; as one day, hide it."""
    url = str(filled.engine.url)
    for args in (
        ["checkpoints", "--older-than", "1"],
        ["gc", "--staging-root", str(tmp_path), "--dry-run", "--retention", "30"],
        ["gc", "--staging-root", str(tmp_path), "--dry-run", "--history-retention", "7"],
    ):
        line = one_line_error(walsink("--url", url, *args), "walsink: error:", args[-2], "invalid duration")
        assert all(
            unit in line for unit in ("s (seconds)", "m (minutes)", "h (hours)", "d (days)", "w (weeks)")
        )


def test_checkpoints_are_listed_in_sequence_order_not_by_time(filled):
    """A checkpoint changed recently (a retry of an earlier interval) is still listed at its
    place in the sequence: the first one stuck is the one that blocks the rest."""
    url = str(filled.engine.url)
    now = utcnow()
    for key, hours in (("k1", 0.5), ("k2", 9), ("k3", 4)):  # time order k2, k3, k1
        with filled.engine.begin() as conn:
            conn.execute(
                update(ckpt)
                .where(ckpt.c.pipeline == "orders", ckpt.c.checkpoint_key == key)
                .values(updated_at=now - timedelta(hours=hours))
            )
    text = walsink("--url", url, "checkpoints", "--pipeline", "orders")
    assert text.returncode == 0, text.stderr
    rows = [line.split()[:3] for line in text.stdout.splitlines() if line.startswith("orders ")]
    assert rows == [["orders", "1", "k1"], ["orders", "2", "k2"], ["orders", "3", "k3"]]
    listed = json.loads(walsink("--url", url, "checkpoints", "--json").stdout)["checkpoints"]
    assert [(c["pipeline"], c["sequence"]) for c in listed] == [
        ("events", 1),
        ("events", 2),
        ("orders", 1),
        ("orders", 2),
        ("orders", 3),
    ]


def test_history_shows_one_checkpoints_transitions(filled):
    """What the UI's checkpoint page shows, from a shell: from, to, when (UTC), who, detail."""
    from airflow_provider_walsink.core.store import Actor

    url = str(filled.engine.url)
    oncall = Actor(name="oncall@host (walsink abort)")  # no Airflow task: named by the actor
    filled.abort("orders", "k3", reason="INC-7: partner resent the file", actor=oncall)
    recorded = filled.history("orders", "k3")
    assert len(recorded) >= 2

    listed = walsink("--url", url, "history", "orders", "k3", "--json")
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    assert data["checkpoint"]["key"] == "k3" and data["checkpoint"]["state"] == "ABORTED"
    assert [(t["from_state"], t["to_state"], t["attempt"]) for t in data["transitions"]] == [
        (t.from_state, t.to_state, t.attempt) for t in recorded
    ]
    assert [t["at"] for t in data["transitions"]] == [
        t.at.replace(microsecond=0).isoformat() + "Z" for t in recorded
    ]
    first, last = data["transitions"][0], data["transitions"][-1]
    assert (first["dag_id"], first["run_id"], first["task_id"], first["try_number"]) == (
        ACTOR.dag_id,
        ACTOR.run_id,
        ACTOR.task_id,
        ACTOR.try_number,
    )
    assert last["to_state"] == "ABORTED" and "INC-7" in last["detail"] and last["dag_id"] is None

    text = walsink("--url", url, "history", "orders", "k3")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith("orders/k3: ABORTED (sequence 3")
    body = [line for line in lines if line[:4].isdigit()]
    assert len(body) == len(recorded)
    assert f"{ACTOR.dag_id} / {ACTOR.run_id} / {ACTOR.task_id} / try {ACTOR.try_number}" in body[0]
    assert "REGISTERED  ABORTED" not in body[0] and "ABORTED" in body[-1]
    assert "oncall@host (walsink abort)" in body[-1] and "INC-7: partner resent the file" in body[-1]
    assert lines[-1] == f"{len(recorded)} transitions"

    one_line_error(walsink("--url", url, "history", "orders", "nope"), "no checkpoint 'nope'")
    one_line_error(walsink("--url", url, "history", "nope", "k1"), "unknown pipeline 'nope'")


def test_status_and_history_show_an_overdue_checkpoint_and_where_its_job_runs(filled):
    """What the UI's OVERDUE badge and checkpoint page show, from a shell: a checkpoint whose
    pipeline's commit deadline passed before it committed, and the Spark Connect session its
    current attempt runs in (recorded on the row, never a secret); a committed one is not overdue,
    nor is one aborted after its deadline passed (issue 47: nothing is late any more)."""
    url = str(filled.engine.url)
    filled.register("orders", "k4", mode="overwrite", actor=ACTOR)
    job = {"runner": "spark_connect", "conn_id": "spark_connect_prod", "session_id": "5f0c-1d2e"}
    filled.start_attempt("orders", "k4", actor=ACTOR, write_job=job)
    due = utcnow() - timedelta(minutes=5)
    # k1 is COMMITTED: the miss is in its history, it is not overdue; k3 is aborted after its miss.
    for key in ("k4", "k1", "k3"):
        filled.record_deadline_miss("orders", key, due_at=due, actor=ACTOR, detail="commit deadline missed")
    filled.abort("orders", "k3", reason="INC-8: interval given up", actor=ACTOR)

    text = walsink("--url", url, "status", "--pipeline", "orders")
    assert text.returncode == 0, text.stderr
    k4 = next(line for line in text.stdout.splitlines() if " k4 " in line)
    assert "WRITING" in k4 and "OVERDUE (commit due " in k4, text.stdout
    for key in ("k1", "k3"):
        assert "OVERDUE" not in next(line for line in text.stdout.splitlines() if f" {key} " in line)

    listed = json.loads(walsink("--url", url, "status", "--pipeline", "orders", "--json").stdout)
    by_key = {c["key"]: c for c in listed[0]["checkpoints"]}
    assert by_key["k4"]["overdue"] is True and by_key["k4"]["commit_due_at"].endswith("Z")
    assert by_key["k4"]["write_job"] == job
    assert by_key["k1"]["overdue"] is False and by_key["k1"]["write_job"] is None
    assert by_key["k3"]["state"] == "ABORTED" and by_key["k3"]["overdue"] is False

    history = walsink("--url", url, "history", "orders", "k4")
    assert history.returncode == 0, history.stderr
    assert "OVERDUE: its pipeline's commit deadline passed at " in history.stdout
    assert "write job: spark_connect on connection 'spark_connect_prod', session 5f0c-1d2e" in history.stdout
    aborted = walsink("--url", url, "history", "orders", "k3")
    assert aborted.returncode == 0 and "OVERDUE" not in aborted.stdout, aborted.stdout + aborted.stderr


def test_every_time_the_cli_prints_says_its_zone(filled, tmp_path):
    """Stored times are naive UTC; printed, each carries its zone (``Z``), never a bare local-looking time."""
    url = str(filled.engine.url)
    filled.abort("orders", "k3", reason="INC-9", actor=ACTOR)
    outputs = [
        walsink("--url", url, *command)
        for command in (
            ["status", "--json"],
            ["checkpoints"],
            ["checkpoints", "--json"],
            ["history", "orders", "k3"],
            ["history", "orders", "k3", "--json"],
        )
    ]
    stamps = []
    for result in outputs:
        assert result.returncode == 0, result.stderr
        assert not re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", result.stdout), result.stdout  # str(datetime)
        stamps += re.findall(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[^\s\",]*", result.stdout)
    assert len(stamps) > 10
    assert all(s.endswith("Z") or s.endswith("+00:00") for s in stamps), stamps


@pytest.mark.parametrize(
    ("scheme", "port", "user"),
    [
        ("postgresql+psycopg2", 5432, "postgres"),
        ("postgresql+psycopg", 5432, "postgres"),
        ("mysql+pymysql", 3306, "root"),
    ],
)
def test_a_server_database_that_does_not_exist_says_create_it_then_db_upgrade(scheme, port, user):
    """The server answers but has no such database: the error names it and the two steps
    (walsink creates no server database), for reads and for `db upgrade` alike."""
    name = f"walsink_absent_{os.getpid()}_{int(time.time() * 1000) % 10**6}"
    url = f"{scheme}://{user}@127.0.0.1:{port}/{name}"
    for command in (["status"], ["checkpoints"], ["history", "p", "k"], ["db", "upgrade"]):
        line = one_line_error(
            walsink("--url", url, *command), f"database '{name}' does not exist", "create it"
        )
        assert "CREATE DATABASE" in line and "db upgrade" in line, line
    # From a connection: the command to run names it.
    conn_id = f"walsink_absent_{os.getpid()}"
    env = {
        f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(
            {"conn_type": "walsink", "extra": {"url": url, "staging_root": "/nonexistent"}}
        )
    }
    line = one_line_error(
        walsink("--conn-id", conn_id, "status", env=env), f"database '{name}' does not exist"
    )
    assert f"walsink --conn-id {conn_id} db upgrade" in line, line


def test_reassign_group_hands_a_kafka_consumer_group_to_another_pipeline(sqlite_store):
    """`walsink reassign-group`: a group id recorded on two clusters needs --cluster (the refusal
    lists them); with it (a bare cluster id is enough) the group belongs to the new pipeline, not
    registered yet: the previous owner is refused it at its next plan, the new one takes it."""
    from airflow_provider_walsink.core.store.errors import ConsumerGroupOwnedError

    store, url = sqlite_store, str(sqlite_store.engine.url)
    store.claim_consumer_group("cluster:c1", "lag", "orders")
    store.claim_consumer_group("cluster:c2", "lag", "events")
    one_line_error(
        walsink("--url", url, "reassign-group", "lag", "--pipeline", "orders_v2"),
        "recorded on several clusters (cluster:c1, cluster:c2): pass --cluster",
    )
    result = walsink(
        "--url", url, "reassign-group", "lag", "--cluster", "c1", "--pipeline", "orders_v2", "--json"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"group_id": "lag", "cluster": "cluster:c1", "pipeline": "orders_v2",
                                         "previous_pipeline": "orders", "registered": False}  # fmt: skip
    assert store.consumer_group_owner("cluster:c1", "lag") == "orders_v2"
    assert store.consumer_group_owner("cluster:c2", "lag") == "events"  # another cluster's group: untouched
    with pytest.raises(ConsumerGroupOwnedError, match="belongs to pipeline 'orders_v2'; pipeline 'orders'"):
        store.claim_consumer_group("cluster:c1", "lag", "orders")
    assert store.claim_consumer_group("cluster:c1", "lag", "orders_v2") == "orders_v2"


#: Partition keys as a user writes them (docs/backfill.md, "Partitioned runs"), registered in
#: this order: not the order of the keys.
PARTITION_KEYS = ["münchen-ü", "eu west 1", "a=b"]


def test_partition_checkpoints_are_named_and_found_by_the_key_as_written(sqlite_store):
    from airflow_provider_walsink.core.protocol.partition_keys import checkpoint_key_for_partition

    store = sqlite_store
    encoded = {key: checkpoint_key_for_partition(key) for key in PARTITION_KEYS}
    assert encoded["münchen-ü"] == "pk=m+C3+BCnchen-+C3+BC" and encoded["a=b"] == "pk=a+3Db"
    for key in PARTITION_KEYS:
        store.register("regions", encoded[key], mode="overwrite", actor=ACTOR)
    store.register("regions", "20260101T000000Z", mode="overwrite", actor=ACTOR)  # not a partition
    url = str(store.engine.url)

    status = json.loads(walsink("--url", url, "status", "--pipeline", "regions", "--json").stdout)
    listed = json.loads(walsink("--url", url, "checkpoints", "--pipeline", "regions", "--json").stdout)
    for checkpoints in (status[0]["checkpoints"], listed["checkpoints"]):
        assert {c["key"]: c["partition_key"] for c in checkpoints} == {
            **{encoded[key]: key for key in PARTITION_KEYS},
            "20260101T000000Z": None,
        }
    text = walsink("--url", url, "status", "--pipeline", "regions")
    assert text.returncode == 0, text.stderr
    for key in PARTITION_KEYS:
        assert f"{key} ({encoded[key]})" in text.stdout, text.stdout

    # `history` finds each by its key as written (the encoded one is found as before).
    for key in ("a=b", "eu west 1"):
        found = walsink("--url", url, "history", "regions", key, "--json")
        assert found.returncode == 0, found.stderr
        checkpoint = json.loads(found.stdout)["checkpoint"]
        assert (checkpoint["key"], checkpoint["partition_key"]) == (encoded[key], key)
    text = walsink("--url", url, "history", "regions", "münchen-ü")
    assert text.stdout.startswith("regions/münchen-ü (pk=m+C3+BCnchen-+C3+BC): REGISTERED"), text

    # A checkpoint whose key is exactly what was given wins over the partition key's encoding.
    store.register("regions", "a", mode="overwrite", actor=ACTOR)
    store.register("regions", "pk=a", mode="overwrite", actor=ACTOR)
    exact = json.loads(walsink("--url", url, "history", "regions", "a", "--json").stdout)
    assert exact["checkpoint"]["key"] == "a" and exact["checkpoint"]["partition_key"] is None
    one_line_error(walsink("--url", url, "history", "regions", "wien"), "no checkpoint 'wien' or 'pk=wien'")
