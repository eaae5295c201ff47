"""docs/quickstart.md, then docs/own-airflow.md, followed to the letter through one real Airflow
(issues 25 and 47).

The two pages are one reader's path: the quickstart's first pipeline on the embedded defaults,
then the same Airflow home run as a deployment. So one test runs both on one start of the
components (a second Airflow start and its Spark jobs would cost about a minute more).

Everything the test runs comes from the pages: each ```bash block runs as written in one
reader's shell (``PageShell``: a block sees what the blocks before it exported; any failing
command fails the test), the files of the code blocks are saved at the paths their headings
name, and the outputs the pages show (``walsink status``, the ``aws`` connection's Test) are
compared with what the commands print.

The quickstart: its section 0 (exports, ``mkdir``, ``airflow db migrate``), the DAG found
paused, ``airflow dags unpause``, ``airflow backfill create`` of its first day through the
scheduler, ``walsink status`` as the page shows it, the 100 rows once in the target, the
committer table and staging where the page says (no connection), and a second run of the
interval that changes nothing (the write task skips).

Its own-airflow sequel: the users of the simple auth manager (their generated passwords, a
token from ``/auth/token``; a viewer refused a trigger), the components started by the page's
four ``airflow <component> &`` lines, the committer table in a PostgreSQL database of its own
(``psql``, the ``walsink_default`` connection, ``walsink db upgrade``, ``airflow connections
test``), the ``aws`` connection's Test answered without the Amazon provider as the page shows,
a Spark Connect server started by the page's ``spark-submit --class ...SparkConnectServer``
line, and the partitioned DAG's run triggered through the REST API with a partition key: its
write job on the Connect server, staged under the connection's ``staging_root``, committed
once into ``dt=<key>`` and shown by ``walsink status`` as the page shows it.

What the test changes, each a value the pages export and a reader sets to their own:
``AIRFLOW_URL`` (the api-server listens on a free port, not 8080: other Airflows may run on
this host), ``SPARK_CONNECT_PORT`` (a free port), ``PGHOST``/``PGPORT``/``PGUSER`` (the test
server, ``WALSINK_TEST_PG_URL``) and ``WALSINK_DB`` (a database of its own per run, dropped at
the end). The components run with ``AirflowStack``'s settings beside the pages' (a free port
for the api-server and the log servers, one api-server worker, the SQLite metadata database's
busy timeout, a 5 s DAG-folder refresh so the new DAG file is parsed at once, and ``[scheduler]
use_job_schedule`` off, so unpausing the DAGs starts no run of the latest interval or
partition: the test runs exactly what the pages show); the auth manager's users and the
secrets in ``airflow.cfg`` are the pages' own. Not run: the quickstart's ``airflow dags test``
(see the re-run below) and what needs a browser (the UI's Trigger form; the trigger goes
through the REST call the page gives).

Paths as written: the pages' ``/tmp/walsink-quickstart/...`` home, targets and staging root are
used unchanged, removed before and after. Two test sessions on one host would collide there, so
the test holds an exclusive lock file for its whole run (a second session waits).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from airflow_stack import AirflowStack, StackUser, drop_postgres_database, free_port
from markdown_it import MarkdownIt

from airflow_provider_walsink.core.store.store import CommitterStore
from tests.task_logs import noise, phase_lines, task_log

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "docs" / "quickstart.md"
OWN_AIRFLOW = REPO / "docs" / "own-airflow.md"
DAG_ID = "my_events"
PIPELINE = "my_events"
#: The page's backfill is 2026-01-01 to 2026-01-03; section 4's ``walsink status`` shows the
#: first day's checkpoint only, so the test runs that day (one Spark job instead of three).
DAY = "2026-01-01"
KEY = "20260101T000000Z"
PARTITIONED = "my_events_by_day"
PARTITION = "2026-01-05"
SESSION_ID = os.environ.get("WALSINK_TEST_SESSION_ID", "x")  # set by conftest
PG_ADMIN_URL = os.environ.get("WALSINK_TEST_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test")
LOCK = Path(tempfile.gettempdir()) / "walsink-quickstart-test.lock"
#: AirflowStack's settings that the pages make themselves: the simple auth manager's users and
#: passwords, and the secrets `airflow db migrate` writes into airflow.cfg.
PAGE_MADE = (
    "AIRFLOW__CORE__AUTH_MANAGER",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS",
    "AIRFLOW__CORE__FERNET_KEY",
    "AIRFLOW__API__SECRET_KEY",
    "AIRFLOW__API_AUTH__JWT_SECRET",
)


# --------------------------------------------------------------------------- reading the pages


def _blocks_by_section(page: Path) -> dict[str, list[tuple[str, str]]]:
    """``{level-2 heading: [(fence info, code), ...]}`` in page order."""
    tokens = MarkdownIt("commonmark").parse(page.read_text(encoding="utf-8"))
    out: dict[str, list[tuple[str, str]]] = {}
    heading = ""
    for i, token in enumerate(tokens):
        if token.type == "heading_open" and token.tag == "h2":
            heading = tokens[i + 1].content
            out[heading] = []
        elif token.type == "fence" and heading:
            out[heading].append((token.info.strip(), token.content))
    return out


def _section(blocks: dict[str, list[tuple[str, str]]], prefix: str) -> tuple[str, list[tuple[str, str]]]:
    (heading,) = [h for h in blocks if h.startswith(prefix)]
    return heading, blocks[heading]


def _code(blocks: list[tuple[str, str]], lang: str) -> list[str]:
    return [code for info, code in blocks if info.split(" ")[0] == lang]


def _exports(script: str) -> dict[str, str]:
    """The variables the page's ``export`` lines set, ``$VAR`` references expanded."""
    env: dict[str, str] = {}
    for line in script.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] != ["export"]:
            continue
        for word in words[1:]:
            name, _, value = word.partition("=")
            env[name] = re.sub(r"\$(\w+)", lambda m: env[m.group(1)], value)
    return env


def _file_in_heading(heading: str, dags_folder: Path) -> Path:
    """The heading's ``(`dags/...`)`` path, inside the page's DAGs folder."""
    (rel,) = re.findall(r"`dags/([^`]+)`", heading)
    return dags_folder / rel


def _job_and_dag(
    blocks: dict[str, list[tuple[str, str]]], job_section: str, dag_section: str, dags_folder: Path
) -> tuple[dict[Path, str], Path]:
    """A page's job and DAG (``{the path its heading names: code}``) and the DAG's target."""
    files = {}
    for prefix in (job_section, dag_section):
        heading, section = _section(blocks, prefix)
        (code,) = _code(section, "python")
        files[_file_in_heading(heading, dags_folder)] = code
    (target,) = re.findall(r'target="([^"]+)"', code)  # the DAG's, the last one read
    return files, _under_tmp(Path(target))


def _under_tmp(path: Path) -> Path:
    """The test removes the page's paths: only ever under the temporary directory."""
    tmp = Path(tempfile.gettempdir()).resolve()
    resolved = path.resolve()
    assert resolved.is_relative_to(tmp) and resolved != tmp, (
        f"the page's path {path} is not under {tmp}: the test will not delete it"
    )
    return resolved


def _snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` (hidden bookkeeping included) -> sha256."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _status_lines(text: str) -> list[list[str]]:
    """``walsink status`` text as words per line, the bytes column ("1.9 KiB") dropped."""
    out = []
    for line in text.strip().splitlines():
        words = line.split()
        if re.fullmatch(r"\d+", words[0]):  # a checkpoint row: seq key... state att rows N unit
            (unit,) = [i for i, word in enumerate(words) if word in ("B", "KiB", "MiB")]
            assert re.fullmatch(r"[\d.]+", words[unit - 1]), line
            words = words[: unit - 1] + words[unit + 1 :]
        out.append(words)
    return out


def _commands(block: str) -> list[tuple[bool, str]]:
    """The block's commands in order, continuation lines joined: ``(in the background, command)``."""
    out: list[tuple[bool, str]] = []
    pending = ""
    for line in block.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        command = pending + line
        pending = ""
        background = re.fullmatch(r"(.*?)\s+&\s*(#.*)?", command)
        out.append((True, background.group(1).strip()) if background else (False, command))
    return out


def _overridden(block: str, overrides: dict[str, str]) -> str:
    """The block with the values of ``overrides`` in its ``export`` lines (see the module docstring)."""
    lines = []
    for line in block.splitlines():
        named = line.startswith("export ") and any(re.search(rf"\b{name}=", line) for name in overrides)
        words = shlex.split(line, comments=True) if named else []
        if any(word.partition("=")[0] in overrides for word in words[1:]):
            assert "$" not in line, f"an overridden export holds an expansion: {line}"
            words = [
                f"{name}={overrides.get(name, value)}"
                for name, _, value in (word.partition("=") for word in words[1:])
            ]
            line = "export " + " ".join(shlex.quote(word) for word in words)
        lines.append(line)
    return "\n".join(lines)


class PageShell:
    """One reader's shell: runs a page's bash blocks one after the other, each seeing what the
    blocks before it exported. Commands ending in ``&`` are handed to ``background``."""

    def __init__(self, env: dict[str, str], overrides: dict[str, str], work_dir: Path) -> None:
        self.env = dict(env)
        self.overrides = overrides
        self.work_dir = work_dir
        self._dump = work_dir / "page-shell.env"

    def run(self, block: str, background: Callable[[str, dict[str, str]], None] | None = None) -> str:
        """Run ``block``; its standard output."""
        out, pending = [], []
        for in_background, command in _commands(_overridden(block, self.overrides)):
            if not in_background:
                pending.append(command)
                continue
            assert background is not None, f"the page starts {command!r} in the background here"
            out.append(self._bash("\n".join(pending)))
            pending = []
            background(command, dict(self.env))
        out.append(self._bash("\n".join(pending)))
        return "".join(out)

    def _bash(self, script: str) -> str:
        if not script.strip():
            return ""
        dump = shlex.quote(str(self._dump))
        result = subprocess.run(
            ["bash", "-c", f"set -eo pipefail\n{script}\nenv -0 > {dump}"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, (
            f"the page's commands exited {result.returncode}:\n{script}\n"
            f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
        )
        self.env = dict(item.split("=", 1) for item in self._dump.read_text().split("\0") if "=" in item)
        return result.stdout


def _port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


# --------------------------------------------------------------------------- the test


@pytest.fixture
def quickstart_lock():
    """One run of the pages per host at a time (their paths are fixed)."""
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture
def page_database():
    """The name the test gives the page's ``WALSINK_DB`` (created by the page's ``psql``), dropped after."""
    from sqlalchemy import create_engine

    name = f"walsink_page_{uuid.uuid4().hex[:8]}"
    yield name
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    try:
        drop_postgres_database(admin, name)
    finally:
        admin.dispose()


def test_quickstart_then_own_airflow_to_the_letter_on_one_airflow(quickstart_lock, page_database):
    from sqlalchemy.engine import make_url

    from tests.helpers import missing_prerequisite

    for tool in ("java", "psql", "curl"):
        if shutil.which(tool) is None:
            missing_prerequisite(f"the quickstart and docs/own-airflow.md need {tool} on the PATH")
    quick = _blocks_by_section(QUICKSTART)
    own = _blocks_by_section(OWN_AIRFLOW)

    # Quickstart 0: the page's environment (read here for the paths; the block runs below).
    _, need = _section(quick, "0.")
    (setup,) = _code(need, "bash")
    doc_env = _exports(setup)
    home = _under_tmp(Path(doc_env["AIRFLOW_HOME"]))
    dags_folder = Path(doc_env["AIRFLOW__CORE__DAGS_FOLDER"])
    assert dags_folder.resolve() == home / "dags"

    # Quickstart 1 and 2, docs/own-airflow.md 5 and 6: the jobs and the DAGs, each saved where
    # its heading says (below), and their targets; the connection's staging root.
    files, target = _job_and_dag(quick, "1.", "2.", dags_folder)
    own_files, own_target = _job_and_dag(own, "5.", "6.", dags_folder)
    _, committer_blocks = _section(own, "3.")
    (staging_text,) = re.findall(r'"staging_root": "([^"]+)"', _code(committer_blocks, "bash")[0])
    staging = _under_tmp(Path(staging_text))
    made = (home, target, own_target, staging)

    for path in made:
        shutil.rmtree(path, ignore_errors=True)
    pg = make_url(PG_ADMIN_URL)
    started = time.monotonic()
    stack = AirflowStack(
        home,
        dags_folder=dags_folder,
        env=doc_env,
        users=(),
        artifacts_dir=REPO / "test-artifacts" / f"quickstart-{SESSION_ID}",
    )
    # The stack's one departure a reader would notice: ``[scheduler] use_job_schedule`` off
    # (AirflowStack's default), so unpausing starts no run the pages do not show.
    assert stack.env["AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE"] == "False"
    for name in PAGE_MADE:
        stack.env.pop(name, None)
    stack.env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), stack.env.get("PATH", "")])
    overrides = {
        "AIRFLOW_URL": stack.base_url,
        "SPARK_CONNECT_PORT": str(free_port()),
        "PGHOST": str(pg.host),
        "PGPORT": str(pg.port or 5432),
        "PGUSER": str(pg.username),
        "WALSINK_DB": page_database,
    }
    if pg.password:
        overrides["PGPASSWORD"] = pg.password
    shell = PageShell(stack.env, overrides, Path(tempfile.mkdtemp(prefix="walsink-page-shell-")))
    try:
        shell.run(setup)  # exports, mkdir -p $AIRFLOW__CORE__DAGS_FOLDER/jobs, airflow db migrate
        for path, code in files.items():
            path.write_text(code)

        # own-airflow 1 and 2: the users, then the four components as the page starts them.
        _, users_blocks = _section(own, "1.")
        (users_block,) = _code(users_blocks, "bash")
        shell.run(users_block)
        stack.env.clear()
        stack.env.update(shell.env)
        _, start_blocks = _section(own, "2.")
        components_block, passwords_block, token_block = _code(start_blocks, "bash")
        commands: list[list[str]] = []
        shell.run(components_block, background=lambda command, _env: commands.append(shlex.split(command)))
        assert [words[:1] for words in commands] == [["airflow"]] * 4, commands
        stack.commands = {words[1]: words for words in commands}
        stack.components = tuple(words[1] for words in commands)
        assert sorted(stack.components) == ["api-server", "dag-processor", "scheduler", "triggerer"]
        stack.start(migrate=False)  # the page's `airflow db migrate` ran in its section 0
        print(f"\npages' stack started in {time.monotonic() - started:.1f}s")

        # The generated passwords of the page's users: the test logs in with them.
        passwords = json.loads(shell.run(passwords_block))
        roles = dict(u.split(":") for u in shell.env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"].split(","))
        assert set(passwords) == set(roles) == {"admin", "ops", "analyst"}
        stack.users = {name: StackUser(name, roles[name], passwords[name]) for name in roles}
        shell.run(token_block)
        assert shell.env["TOKEN"]

        providers = stack.airflow("providers", "list").stdout
        assert "walsink" in providers, providers  # `airflow providers list | grep walsink`
        assert stack.get("/api/v2/connections")["total_entries"] == 0  # "No connection is needed"

        # own-airflow 4, run here so the Connect server boots while the quickstart's job runs.
        _, connect_blocks = _section(own, "4.")
        (connect_block,) = _code(connect_blocks, "bash")

        def start_connect_server(command: str, env: dict[str, str]) -> None:
            assert "org.apache.spark.sql.connect.service.SparkConnectServer" in command, command
            stack.start_component("spark-connect", ["bash", "-c", f"exec {command}"], env)

        shell.run(connect_block, background=start_connect_server)

        # Quickstart 3: run one interval, in a running Airflow: a new DAG starts paused.
        dag = stack.wait_for_dag(DAG_ID)
        assert dag["is_paused"] is True
        stack.airflow("dags", "unpause", DAG_ID)
        t0 = time.monotonic()
        (run,) = stack.wait_for_backfill(stack.backfill(DAG_ID, DAY, DAY), timeout=600)
        print(f"first run (backfill, Spark job) took {time.monotonic() - t0:.1f}s")
        states = stack.task_states(DAG_ID, run["dag_run_id"])
        assert run["state"] == "success", states
        assert states == {"events.write": "success", "events.durable": "success", "events.commit": "success"}
        # Its write task's log, as the UI shows it: each phase said once, no noise (issue 47).
        write_log = task_log(stack.logs_dir, DAG_ID, run["dag_run_id"], "events.write")
        assert noise(write_log) == [], write_log[-5000:]
        said = phase_lines(write_log, PIPELINE, KEY, 100)
        assert (said["register"], said["seal"]) == (1, 1), write_log[-5000:]

        # Quickstart 4: see the committed checkpoint, as the page shows it.
        _, see = _section(quick, "4.")
        (status_block,) = _code(see, "bash")
        (expected_status,) = _code(see, "text")
        status = shell.run(status_block)
        assert _status_lines(status) == _status_lines(expected_status), status
        # The committer table and staging are where section 0 says, with no connection.
        assert (home / "walsink" / "committer.db").is_file()
        assert (home / "walsink" / "staging").is_dir()
        # The table: one partition, the 100 rows of the job once, in files that name the
        # checkpoint and the committed attempt.
        store = CommitterStore.from_url(f"sqlite:///{home}/walsink/committer.db")
        try:
            (record,) = store.checkpoints(PIPELINE)
        finally:
            store.dispose()
        assert (record.checkpoint_key, record.state.value, record.rows) == (KEY, "COMMITTED", 100)
        import pyarrow.parquet as pq

        assert sorted(p.name for p in target.iterdir() if not p.name.startswith(("_", "."))) == [f"dt={DAY}"]
        files = sorted((target / f"dt={DAY}").glob("*.parquet"))
        assert files and all(f.name.startswith(f"{KEY}-{record.sealed_attempt_id}-") for f in files), files
        rows = pq.ParquetDataset([str(f) for f in files]).read().to_pylist()
        assert sorted((r["n"], r["user"]) for r in rows) == [(n, f"user-{n % 7}") for n in range(100)]
        before = _snapshot(target)

        # A second run of the same interval changes nothing: the write task finds the
        # checkpoint COMMITTED and skips the Spark job (and the durability and commit tasks with
        # it). The page says to re-run `airflow dags test`; in a running Airflow with the DAG
        # unpaused that is not a clean re-run (read in Airflow 3.3's code, not tried): it deletes
        # the scheduler's run of that logical date (`get_or_create_dagrun`) and its in-process
        # run is also one the scheduler examines and may queue tasks of
        # (`DagRun.get_running_dag_runs_to_examine`). So the re-run goes through the scheduler: a
        # backfill re-running the completed interval.
        t0 = time.monotonic()
        (rerun,) = stack.wait_for_backfill(
            stack.backfill(DAG_ID, DAY, DAY, reprocess_behavior="completed"), timeout=600
        )
        print(f"second run (write skipped) took {time.monotonic() - t0:.1f}s")
        states = stack.task_states(DAG_ID, rerun["dag_run_id"])
        assert rerun["state"] == "success", states
        assert states == {"events.write": "skipped", "events.durable": "skipped", "events.commit": "skipped"}
        decision = stack.xcom(DAG_ID, rerun["dag_run_id"], "events.write", key="reprocess")
        assert decision["decision"] == "skip" and decision["state"] == "COMMITTED", decision
        assert _snapshot(target) == before
        history = shell.run(f"walsink history {PIPELINE} {KEY} --json")  # the page's section 5 command
        assert "write skipped" in json.dumps(json.loads(history)), history

        # own-airflow 3: the committer table on PostgreSQL, its connection tested; the aws
        # connection's Test answered as the page shows without the Amazon provider.
        t0 = time.monotonic()
        committer_block, aws_block = _code(committer_blocks, "bash")
        tested = shell.run(committer_block)
        assert "Connection success!" in tested, tested
        (aws_answer,) = _code(committer_blocks, "text")
        assert json.loads(shell.run(aws_block)) == json.loads(aws_answer)

        # own-airflow 5 and 6: the partitioned job and DAG; 7: a run triggered with a partition key.
        for path, code in own_files.items():
            path.write_text(code)
        stack.wait_for_dag(PARTITIONED)
        connect_port = int(overrides["SPARK_CONNECT_PORT"])
        stack.wait_until("the page's Spark Connect server", lambda: _port_open(connect_port), timeout=180)
        # A viewer may not trigger (section 1); the page's admin may.
        refused = stack.client("analyst").post(
            f"/api/v2/dags/{PARTITIONED}/dagRuns", json={"logical_date": None, "partition_key": PARTITION}
        )
        assert refused.status_code == 403, refused.text
        _, trigger_blocks = _section(own, "7.")
        (trigger_block,) = _code(trigger_blocks, "bash")
        shell.run(trigger_block)
        (partition_run,) = stack.dag_runs(PARTITIONED)
        assert partition_run["partition_key"] == PARTITION, partition_run
        done = stack.wait_for_runs(PARTITIONED, [partition_run["dag_run_id"]], timeout=600)
        states = stack.task_states(PARTITIONED, partition_run["dag_run_id"])
        assert done[partition_run["dag_run_id"]]["state"] == "success", states
        # The write and commit tasks' logs, its job run on the Connect server in the task's process.
        logs = "\n".join(
            task_log(stack.logs_dir, PARTITIONED, partition_run["dag_run_id"], task)
            for task in ("events.write", "events.commit")
        )
        assert noise(logs) == [], logs[-5000:]
        said = phase_lines(logs, PARTITIONED, f"pk={PARTITION}", 100)
        assert said == {"register": 1, "seal": 1, "durable": 0, "publish": 1, "announce": 1, "skip": 0}, logs

        # own-airflow 8: the committed partition, as the page shows it.
        _, own_see = _section(own, "8.")
        (own_status_block,) = _code(own_see, "bash")
        (own_expected_status,) = _code(own_see, "text")
        own_status = shell.run(own_status_block)
        assert _status_lines(own_status) == _status_lines(own_expected_status), own_status
        print(f"docs/own-airflow.md after the quickstart took {time.monotonic() - t0:.1f}s")
        committer = CommitterStore.from_url(
            pg.set(database=page_database).render_as_string(hide_password=False), migrate=False
        )
        try:
            (partition,) = committer.checkpoints(PARTITIONED)
        finally:
            committer.dispose()
        assert (partition.checkpoint_key, partition.state.value, partition.rows) == (
            f"pk={PARTITION}",
            "COMMITTED",
            100,
        )
        # Staged under the connection's staging_root (a directory-of-files target), its job a
        # Spark Connect session on the page's connection; the commit removed the attempt.
        assert partition.staging_root == str(staging), partition.staging_root
        assert (partition.write_job or {}).get("runner") == "spark_connect", partition.write_job
        assert partition.write_job["conn_id"] == "spark_connect_local", partition.write_job
        assert not (staging / PARTITIONED / f"pk={PARTITION}").exists()
        assert sorted(p.name for p in own_target.iterdir() if not p.name.startswith(("_", "."))) == [
            f"dt={PARTITION}"
        ]
        rows = pq.ParquetDataset([str(f) for f in (own_target / f"dt={PARTITION}").glob("*.parquet")])
        assert sorted((r["n"], r["user"]) for r in rows.read().to_pylist()) == [
            (n, f"user-{n % 7}") for n in range(100)
        ]
        stack.stop_component("spark-connect")  # the page's `kill %<n>`
    finally:
        stack.stop()
        for path in made:
            shutil.rmtree(path, ignore_errors=True)
        for parent in {p.parent for p in made} - {Path(tempfile.gettempdir()).resolve()}:
            with contextlib.suppress(OSError):
                parent.rmdir()  # the page's /tmp/walsink-quickstart, if nothing else is in it
        shutil.rmtree(shell.work_dir, ignore_errors=True)
