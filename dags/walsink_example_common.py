"""Shared by the walsink example pipelines: where things live and the raw data they read.

Locations (the example DAGs work copied unchanged into any Airflow):

* ``walsink_example_home``: Airflow Variable, else the environment variable
  ``WALSINK_EXAMPLE_HOME``, else ``$AIRFLOW_HOME/walsink/examples``. Raw input
  lives under ``<home>/raw/``, the target tables under ``<home>/target/``.
* Staging root and committer database come from the ``walsink_default``
  connection (default: ``$AIRFLOW_HOME/walsink/staging`` and an SQLite file).
* Spark: master ``local[*]``, unless the environment variable
  ``WALSINK_EXAMPLE_SPARK_CONN_ID`` names a Spark connection (read when the DAG is
  parsed), e.g. the standalone cluster of ``docker/compose.yaml`` or of
  ``scripts/cluster-demo.sh``.

The raw data is generated, deterministically, on first use: the same day
always yields the same rows, so a test (or a curious user) can recompute what
the target must hold.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import uuid
from datetime import date, datetime, timedelta
from pathlib import Path

JOBS_DIR = Path(__file__).resolve().parent / "walsink_jobs"

COUNTRIES = ("DE", "FR", "NL", "PL", "SE", "US", "BR", "JP")
EVENT_TYPES = ("view", "click", "cart", "purchase")
DAILY_COLUMNS = ("event_id", "ts", "user_id", "country", "event_type", "amount_cents")
#: The raw daily events as Spark reads them (DDL: no pyspark import when a DAG is parsed).
DAILY_EVENTS_DDL = (
    "event_id string NOT NULL, ts string NOT NULL, user_id int NOT NULL, country string NOT NULL, "
    "event_type string NOT NULL, amount_cents bigint NOT NULL"
)
FILES_PER_INTERVAL = 3


def default_example_home() -> str:
    airflow_home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return os.environ.get("WALSINK_EXAMPLE_HOME") or os.path.join(airflow_home, "walsink", "examples")


def spark_conn_id() -> str | None:
    """The Spark connection the examples submit through; ``None``: the default ``local[*]``."""
    return os.environ.get("WALSINK_EXAMPLE_SPARK_CONN_ID") or None


def home_template() -> str:
    """A Jinja expression for the example home, resolved when the task runs."""
    default = default_example_home().replace("\\", "/").replace("'", "")
    return "{{ var.value.get('walsink_example_home', '" + default + "') }}"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# --------------------------------------------------------------------------- daily events


def daily_events(day: date) -> list[dict]:
    """The raw events of one day: 2000-2600 rows, the same every time for the same day."""
    rng = random.Random(f"walsink-daily-{day.isoformat()}")
    count = 2000 + (day.toordinal() % 7) * 100
    start = datetime(day.year, day.month, day.day)
    rows = []
    for i in range(count):
        moment = start + timedelta(seconds=rng.randrange(86400))
        rows.append(
            {
                "event_id": f"{day:%Y%m%d}-{i:05d}",
                "ts": moment.strftime("%Y-%m-%d %H:%M:%S"),
                "user_id": rng.randrange(1, 5000),
                "country": rng.choice(COUNTRIES),
                "event_type": rng.choice(EVENT_TYPES),
                "amount_cents": rng.randrange(0, 20000),
            }
        )
    return rows


def daily_events_path(raw_root: str | os.PathLike[str], day: date) -> Path:
    return Path(raw_root) / f"dt={day.isoformat()}" / "events.csv"


def ensure_daily_events(raw_root: str | os.PathLike[str], day: date) -> Path:
    """Write the day's raw CSV if it is absent (atomically: readers never see a part)."""
    path = daily_events_path(raw_root, day)
    if not path.exists():
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=DAILY_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(daily_events(day))
        _write_atomic(path, buf.getvalue())
    return path


# --------------------------------------------------------------------------- incremental files


def arrival_file_names(interval_start: datetime) -> list[str]:
    """Names of the files that "arrive" during an interval; they sort in arrival order."""
    return [f"events-{interval_start:%Y%m%dT%H%M%S}-{k:02d}.jsonl" for k in range(FILES_PER_INTERVAL)]


def arrival_records(name: str) -> list[dict]:
    """The records of one arriving file (150-249 lines, deterministic per name)."""
    rng = random.Random(f"walsink-incoming-{name}")
    return [
        {"file": name, "line": i, "user_id": rng.randrange(1, 1000), "value": rng.randrange(0, 10_000)}
        for i in range(150 + rng.randrange(100))
    ]


def land_arrivals(incoming_dir: str | os.PathLike[str], interval_start: datetime) -> list[str]:
    """Simulate the upstream producer: land the interval's files if absent; return their names."""
    names = arrival_file_names(interval_start)
    for name in names:
        path = Path(incoming_dir) / name
        if not path.exists():
            _write_atomic(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in arrival_records(name)))
    return names


def files_after(incoming_dir: str | os.PathLike[str], last: str | None) -> list[str]:
    """Landed files that sort after offset ``last`` (all of them when ``last`` is None), in order."""
    directory = Path(incoming_dir)
    if not directory.is_dir():
        return []
    names = sorted(p.name for p in directory.iterdir() if p.name.endswith(".jsonl") and p.is_file())
    return [n for n in names if last is None or n > last]
