"""Shared plumbing for the benchmarks: machine facts, medians, tables, private databases.

Every benchmark measures walsink and its baseline in the same process run,
interleaved (the machine may be shared), repeats each measurement and reports
medians and the ratio walsink / baseline. Nothing here asserts on a timing.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from tabulate import tabulate

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get("WALSINK_BENCH_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test")


@dataclass
class Table:
    """One benchmark's result: a title, column headers, rows and notes printed under it."""

    title: str
    headers: Sequence[str]
    rows: list[Sequence[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        out = [f"### {self.title}", "", tabulate(self.rows, headers=self.headers, tablefmt="github")]
        if self.notes:
            out.append("")
            out.extend(f"- {n}" for n in self.notes)
        return "\n".join(out)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def ratio(walsink: float, baseline: float) -> str:
    return f"{walsink / baseline:.2f}x" if baseline > 0 else "n/a"


def fmt_s(seconds: float) -> str:
    """Seconds with a unit that keeps three significant digits."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def spread(values: Sequence[float]) -> str:
    """``min-max`` of the repeats, so a reader sees the noise behind each median."""
    return f"{fmt_s(min(values))} – {fmt_s(max(values))}"


@contextmanager
def stopwatch() -> Iterator[Callable[[], float]]:
    """``with stopwatch() as elapsed: ...`` then ``elapsed()`` is the block's wall time."""
    start = time.perf_counter()
    end: list[float] = []
    try:
        yield lambda: (end[0] if end else time.perf_counter()) - start
    finally:
        end.append(time.perf_counter())


class Timer:
    """Wall and CPU (user + system of this process) time of a block: ``with Timer() as t: ...``.

    CPU time is reported beside wall time because the machine may be shared:
    other processes stretch wall time, but hardly this process's own CPU time.
    """

    wall: float = 0.0
    cpu: float = 0.0

    def __enter__(self) -> Timer:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *_: object) -> None:
        self.wall = time.perf_counter() - self._wall
        self.cpu = time.process_time() - self._cpu


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _git_rev() -> str:
    """The short revision, marked when tracked files differ from it (the figures are then not its)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        rev = git("rev-parse", "--short", "HEAD")
        return rev + (
            " + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _fs_type(path: str) -> str:
    try:
        out = subprocess.run(["df", "-T", path], capture_output=True, text=True, check=True).stdout
        return out.splitlines()[1].split()[1]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown"


def _java() -> str:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=20).stderr
        return out.splitlines()[0].strip() if out else "-"
    except (OSError, subprocess.SubprocessError):
        return "-"


def machine(work_dir: str, extra: dict[str, str] | None = None) -> Table:
    """The machine the figures came from; load averages show how shared it was."""
    load = os.getloadavg()
    facts = {
        "cores": str(os.cpu_count()),
        "memory": _mem_gib(),
        "CPU": _cpu_model(),
        "kernel": platform.release(),
        "file system (work dir)": f"{_fs_type(work_dir)} ({work_dir})",
        "load average (1/5/15 min) at start": " / ".join(f"{x:.2f}" for x in load),
        "Python": platform.python_version(),
        "walsink": f"{_version('airflow-provider-walsink')} (git {_git_rev()})",
        "SQLAlchemy": _version("SQLAlchemy"),
        "psycopg2": _version("psycopg2-binary"),
        "pyspark": _version("pyspark"),
        "Java": _java(),
        "apache-airflow": _version("apache-airflow"),
    }
    facts.update(extra or {})
    return Table("Machine", ["", ""], [[k, v] for k, v in facts.items()])


def work_dir(base: str | None = None) -> Path:
    """A private scratch directory for one benchmark run (removed by the caller)."""
    return Path(tempfile.mkdtemp(prefix="walsink-bench-", dir=base))


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def print_run(prefix: str, base: str | None, produce: Callable[[Path], Sequence[Table]]) -> int:
    """Print the machine's table, then the tables ``produce(scratch)`` returns and how long it took,
    in a private scratch directory under ``base`` removed afterwards; the exit status (0)."""
    import textwrap

    scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    try:
        print(machine(str(scratch)).render())
        started = time.monotonic()
        for table in produce(scratch):
            print()
            print(table.render())
        print(textwrap.fill(f"(benchmark took {time.monotonic() - started:.0f} s)"))
    finally:
        remove(scratch)
    return 0


@contextmanager
def private_pg_database(admin_url: str = PG_ADMIN_URL) -> Iterator[str]:
    """Create a PostgreSQL database only this run uses; drop it afterwards. Yields its URL."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"walsink_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    with admin.connect() as conn:
        # The name is generated here from hex digits only; DDL cannot bind it.
        conn.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"), {"d": name}
            )
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        admin.dispose()


def pg_server_version(url: str) -> str:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return str(conn.execute(text("SHOW server_version")).scalar())
    finally:
        engine.dispose()
