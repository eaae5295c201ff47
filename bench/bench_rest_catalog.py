"""Iceberg through a REST catalog vs the same commit through the SQL catalog, in one run.

walsink's commit of one checkpoint of N staged Parquet files (``IcebergPublisher.publish``:
load, marker check, footers, one snapshot carrying the marker) into a fresh table of:

* the **SQL catalog** (pyiceberg ``SqlCatalog`` on SQLite, in process): the baseline;
* a **REST catalog**: the REST protocol served over the same ``SqlCatalog`` kind on a loopback
  port (``tests/iceberg_rest.py``), reached with an OAuth2 client credential, as a production
  catalog is. Its cost over the baseline is the HTTP round trips (config, token, loads, the
  commit's requirements and updates as JSON) and the server's own metadata write.

Interleaved per repeat (SQL first on even repeats, REST first on odd ones), files staged before
the clock starts, every figure checked: the table holds exactly the rows staged.

Run: ``python -m bench.bench_rest_catalog [--files 10,100,1000] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from airflow_provider_walsink.core.targets.base import StaticContext

from .bench_tables import ROWS_PER_FILE, _stage
from .common import Table, Timer, fmt_s, machine, median, ratio, remove, spread, work_dir


def _publisher(base: Path, props: dict[str, str]):
    from airflow_provider_walsink.core.targets.iceberg import IcebergPublisher

    return IcebergPublisher(
        "bench.t", "append", catalog_name="bench", catalog_properties=props, create_table=True
    )


def commit(base: Path, n: int, props: dict[str, str]) -> float:
    """One walsink commit of ``n`` files into a fresh table (created before the clock starts)."""
    publisher = _publisher(base, props)
    attempt_dir = base / "staging" / "bench" / "k" / "attempt-1"
    manifest = _stage(attempt_dir, n, "k")
    footers = publisher.storage.footers(
        [(f"{attempt_dir}/{c.path}", c.size) for c in manifest.committables[:1]]
    )
    publisher._create(manifest, footers)
    with Timer() as t:
        publisher.publish(manifest, attempt_dir, StaticContext.for_manifest(manifest, epoch=1))
    rows = publisher.load_table().scan().to_arrow().num_rows
    assert rows == n * ROWS_PER_FILE, (rows, n)
    return t.wall


def main(argv: list[str] | None = None) -> list[Table]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="10,100,1000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--work-dir", default=None)
    args = parser.parse_args(argv)
    from tests.iceberg_rest import RestCatalogServer

    root = work_dir(args.work_dir)
    tables = [machine(str(root), {})]
    server = RestCatalogServer(root / "rest-server")
    try:
        table = Table(
            "Iceberg: one walsink commit of N files, REST catalog vs SQL catalog",
            ["files", "SQL catalog (median)", "REST catalog (median)", "ratio", "SQL spread", "REST spread"],
        )
        for n in [int(x) for x in args.files.split(",")]:
            sql, rest = [], []
            for r in range(args.repeats):
                for kind in ("sql", "rest") if r % 2 == 0 else ("rest", "sql"):
                    d = root / f"{kind}-{n}-{r}"
                    d.mkdir()
                    if kind == "sql":
                        props = {
                            "type": "sql",
                            "uri": f"sqlite:///{d}/catalog.db",
                            "warehouse": (d / "wh").as_uri(),
                        }
                        sql.append(commit(d, n, props))
                    else:
                        with server.lock:  # a fresh table of the same name in the server's catalog
                            if server.catalog.table_exists("bench.t"):
                                server.catalog.drop_table("bench.t")  # its files went with the last work dir
                        rest.append(commit(d, n, server.properties(warehouse="bench")))
                    remove(d)
            table.rows.append([n, fmt_s(median(sql)), fmt_s(median(rest)), ratio(median(rest), median(sql)),
                               spread(sql), spread(rest)])  # fmt: skip
        table.notes.append(
            "REST: the protocol over the same SqlCatalog kind on loopback (tests/iceberg_rest.py), OAuth2 "
            "client credential; the difference is the HTTP round trips and JSON, not a remote catalog's latency"
        )
        tables.append(table)
    finally:
        server.stop()
        remove(root)
    for t in tables:
        print(t.render(), end="\n\n")
    return tables


if __name__ == "__main__":
    main()
