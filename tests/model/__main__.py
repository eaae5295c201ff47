"""``python -m tests.model --seed S --schedules N [--targets files,delta,...] [--staging local,s3,gs,abfss]`` or ``--replay FILE``.

``--source kafka`` makes every pipeline read a topic of librdkafka's mock Kafka cluster (started in
a child process on loopback, and stopped) through the real Kafka source path, ``append`` only, with
producers appending between steps, SIGKILLs between the target commit and the group commit and
mid-read, and the Kafka invariants checked after every step (``tests/model/kafka.py``).

``--staging s3`` runs the Iceberg and Delta combinations with the tables and their staging
in a bucket of moto's S3 API server, which it starts on a loopback port (and stops).
``--staging gs`` and ``--staging abfss`` run the Iceberg combinations on fake-gcs-server and on
Azurite, each started on a loopback port and stopped (``tests/model/stores.py``).

``--catalog rest`` (or ``sql,rest``) runs the Iceberg combinations through a REST catalog
(``tests/model/rest.py``: ``tests/iceberg_rest.py``'s server, started in this process on a
loopback port, and stopped), reached through an ``iceberg`` connection, and draws the
``unreported`` step: the catalog applies a commit and answers 500/502/504, drops the connection,
or answers past the client's time-out (sometimes then goes down until the try has ended).

``--domain wide`` draws each schedule's five partitions from the widened data domain
(``tests/data_domain.py``: two partition columns ``(k, t)``, NULL and ``''``, Spark's escapes,
spaces, unicode, timestamps) instead of one ``dt`` column of dates. Every schedule draws the
commit's ``verify_checksums`` (on or off); the ``corrupt`` operation changes a staged value in
place after durability (same size): refused with it on, published as changed with it off.

Runs the model checker over every target combination asked for (kind x mode x
fencing), ``N`` schedules in all, and prints its figures and every violation
with its shrunk, replayable schedule (also written to ``--out``). The figures
count every schedule run, Hypothesis's shrinking replays included; a violation
ends its combination's run (Hypothesis stops at the first failure it shrinks).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable

from . import rest, stores
from .machine import Combo, Figures, drawn, load_schedule, minimize, run_machine
from .world import Config, replay

TARGETS = ("files", "iceberg", "delta", "sql-postgresql", "sql-mysql")
PG_ADMIN = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
MYSQL_ADMIN = "mysql+pymysql://root@127.0.0.1:3306/test"


def sql_database(backend: str) -> tuple[str, Callable[[], None]]:
    """A private database on the local server (dropped by the returned function)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin_url = PG_ADMIN if backend == "postgresql" else MYSQL_ADMIN
    name = f"walsink_model_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))  # a generated name: hex digits only

    def drop() -> None:
        with admin.connect() as conn:
            if backend == "postgresql":
                conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"),
                             {"d": name})  # fmt: skip
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        admin.dispose()

    return make_url(admin_url).set(database=name).render_as_string(hide_password=False), drop


def kafka_cluster(drops: list[Callable[[], None]]) -> str:
    """librdkafka's mock cluster in a child process (stopped by ``drops``): its bootstrap address."""
    from tests.kafka_mock import MockKafka

    cluster = MockKafka()
    drops.append(cluster.stop)
    return cluster.bootstrap


def combos_for(
    targets: list[str],
    modes: list[str],
    fencings: list[str],
    sql_urls: dict[str, str],
    stagings: tuple[str, ...] = ("local",),
    objects: dict[str, stores.ObjectStore] | None = None,
    kafka: str | None = None,
    wide: bool = False,
    catalogs: tuple[str, ...] = ("sql",),
    rest_uri: str | None = None,
) -> list[Combo]:
    out = []
    for staging in stagings:
        for target in targets:
            kind = target.split("-")[0]
            if staging != "local" and kind not in stores.KINDS[staging]:
                continue  # only a table target on the same store commits a checkpoint staged there
            store = (objects or {}).get(staging)
            # The catalog dimension is Iceberg's, local or on S3: the others run once, whatever it says.
            for catalog in catalogs if kind == "iceberg" and staging in ("local", "s3") else ("sql",):
                for mode in modes:
                    for fencing in fencings:
                        if fencing == "table" and kind not in ("iceberg", "delta"):
                            continue  # table fencing: Iceberg and Delta only
                        out.append(Combo(kind, mode, fencing, sql_urls.get(target), staging,
                                         store.endpoint if staging == "s3" and store else None,
                                         store if staging in ("gs", "abfss") else None, kafka, wide, corrupting=True,
                                         catalog=catalog, rest_uri=rest_uri if catalog == "rest" else None))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.model", description=__doc__)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--schedules", type=int, default=20, help="schedules in all (split over the combinations)")
    p.add_argument("--steps", type=int, default=14, help="at most this many steps per schedule")
    p.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated, of {', '.join(TARGETS)}")
    p.add_argument("--modes", default="append,overwrite")
    p.add_argument("--fencing", default="lease,table")
    p.add_argument(
        "--staging",
        default="local",
        help="comma-separated, of local, s3, gs, abfss (s3: Iceberg and Delta; gs, abfss: Iceberg; each "
        "starts its own emulator on loopback: moto, fake-gcs-server, Azurite)",
    )
    p.add_argument(
        "--catalog",
        default="sql",
        help="comma-separated, of sql, rest: the Iceberg catalog (rest: starts the REST test catalog on loopback "
        "and draws commits it applies without reporting them)",
    )
    p.add_argument(
        "--source",
        default="files",
        choices=("files", "kafka"),
        help="kafka: read a topic of librdkafka's mock cluster (started on loopback; append mode only)",
    )
    p.add_argument(
        "--domain",
        default="dates",
        choices=("dates", "wide"),
        help="wide: partitions (k, t) drawn from tests/data_domain.py (files source only)",
    )
    p.add_argument(
        "--replay", metavar="FILE", help="run one schedule (JSON, as printed) and check every step"
    )
    p.add_argument("--no-shrink", action="store_true")
    p.add_argument("--out", default=None, help="write the violations (with schedules) to this JSON file")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.CRITICAL)
    for name in ("airflow_provider_walsink",):
        logging.getLogger(name).setLevel(logging.INFO if args.verbose else logging.CRITICAL)
    _quiet_structlog(args.verbose)
    if not args.verbose:
        logging.disable(logging.ERROR)  # the core logs every commit; the figures are the output
    workdir = tempfile.mkdtemp(prefix="walsink-model-")
    drops: list[Callable[[], None]] = []
    try:
        if args.replay:
            with open(args.replay) as f:
                text = f.read().strip()
            if text.startswith("schedule:"):
                text = text.removeprefix("schedule:").strip()
            config, steps = load_schedule(text)
            sql_url = endpoint = None
            if config["kind"] == "sql":
                sql_url, drop = sql_database(config.get("sql", "postgresql"))
                drops.append(drop)
            staging = config.get("staging", "local")
            store = stores.start(staging, drops) if staging != "local" else None
            endpoint = store.endpoint if store and staging == "s3" else None
            bootstrap = kafka_cluster(drops) if config.get("source") == "kafka" else None
            catalog, rest_uri = config.get("catalog", "sql"), None
            if catalog == "rest":
                rest_uri, stop = rest.start(tempfile.mkdtemp(prefix="rest-", dir=workdir), endpoint)
                drops.append(stop)
            cfg = Config(config["kind"], config["mode"], config["fencing"], workdir, f"sqlite:///{workdir}/c.db",
                         sql_url, pipeline=f"m{uuid.uuid4().hex[:10]}", staging=staging,
                         s3_endpoint=endpoint, store=store if staging in ("gs", "abfss") else None,
                         kafka=bootstrap, catalog=catalog, rest_uri=rest_uri,
                         **drawn(config))  # fmt: skip
            found = replay(cfg, steps, verbose=True)
            print(f"{len(found)} violation(s)")
            for v in found:
                print(f"  {v}")
            return 1 if found else 0
        targets = [t.strip() for t in args.targets.split(",") if t.strip()]
        sql_urls = {}
        for t in targets:
            if t.startswith("sql-"):
                sql_urls[t], drop = sql_database(t.split("-", 1)[1])
                drops.append(drop)
        stagings = tuple(x.strip() for x in args.staging.split(",") if x.strip())
        if set(stagings) - {"local", *stores.KINDS}:
            p.error(f"--staging: of local, {', '.join(stores.KINDS)}, not {args.staging!r}")
        objects = {staging: stores.start(staging, drops) for staging in stagings if staging != "local"}
        endpoint = objects["s3"].endpoint if "s3" in objects else None
        catalogs = tuple(x.strip() for x in args.catalog.split(",") if x.strip())
        if not catalogs or set(catalogs) - {"sql", "rest"}:
            p.error(f"--catalog: sql and/or rest, not {args.catalog!r}")
        rest_uri = None
        if "rest" in catalogs:
            rest_uri, stop = rest.start(tempfile.mkdtemp(prefix="rest-", dir=workdir), endpoint)
            drops.append(stop)
        modes = args.modes.split(",")
        bootstrap = None
        if args.source == "kafka":
            if "append" not in modes:
                p.error("--source kafka reads in append mode only")
            modes = ["append"]  # a Kafka source's offsets advance only when a checkpoint commits
            bootstrap = kafka_cluster(drops)
            if args.domain == "wide":
                p.error("--domain wide: the files source only (the Kafka source writes one dt column)")
        combos = combos_for(targets, modes, args.fencing.split(","), sql_urls, stagings, objects, bootstrap,
                            wide=args.domain == "wide", catalogs=catalogs, rest_uri=rest_uri)  # fmt: skip
        if not combos:
            p.error(f"no combination: an object store takes these targets only: {stores.KINDS}")
        per = max(1, args.schedules // len(combos))
        figures = Figures()
        started = time.monotonic()
        for i, combo in enumerate(combos):
            t0 = time.monotonic()
            before = (figures.schedules, len(figures.violations))
            run_machine([combo], seed_value=args.seed * 1000 + i, schedules=per, steps=args.steps,
                        workdir=workdir, figures=figures, shrink=not args.no_shrink)  # fmt: skip
            figures.last_failure = None
            found = len(figures.violations) - before[1]
            if found and not args.no_shrink:
                for j in range(before[1], len(figures.violations)):
                    label, problems, schedule = figures.violations[j]
                    if schedule:
                        config, steps = load_schedule(schedule)
                        steps, again = minimize(combo, steps, workdir, **drawn(config))
                        text = json.dumps({"config": config, "steps": steps})
                        figures.violations[j] = (label, again or problems, text)
            print(f"{combo.label:32s} schedules {figures.schedules - before[0]:4d}  "
                  f"{time.monotonic() - t0:6.1f}s  violations {found}", flush=True)  # fmt: skip
            for label, problems, schedule in figures.violations[before[1] :]:
                print(f"  VIOLATION on {label}:\n    " + "\n    ".join(problems[:10]) + f"\n  schedule: {schedule}",
                      flush=True)  # fmt: skip
        print(f"\n{figures.describe()}\n  seconds: {time.monotonic() - started:.0f}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(
                    [{"combo": c, "problems": p, "schedule": s} for c, p, s in figures.violations],
                    f,
                    indent=1,
                )
        return 1 if figures.violations else 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        for drop in drops:
            try:
                drop()
            except Exception:  # noqa: BLE001,S110 - best effort clean-up of a test database
                pass


def _quiet_structlog(verbose: bool) -> None:
    try:
        import structlog
    except ImportError:
        return
    if not verbose:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))


if __name__ == "__main__":
    sys.exit(main())
