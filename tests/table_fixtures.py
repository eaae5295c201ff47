"""Fixtures shared by the Iceberg and Delta target tests.

* ``s3_server``: moto in server mode on a loopback port (port 0: the OS picks
  a free one), session-scoped, stopped at the end; tables on it are reached
  through the table libraries' own S3 file IO, exactly as on a real store.
* ``place``: parametrised ``local`` / ``s3``, where a test's tables and staged
  files live.
* :func:`stage_attempt`: writes Parquet files with pyarrow where the write
  phase's executors would (``<staging root>/<pipeline>/<key>/attempt-N/``,
  Hive partition directories, no partition column inside the files, as Spark's
  ``partitionBy`` writes them) and returns the attempt's manifest.
"""

from __future__ import annotations

import io
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_walsink.core.protocol.file_schema import common_file_schema, file_schema_of
from airflow_provider_walsink.core.protocol.manifest import Committable, Manifest, build_manifest
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.targets._tables import S3Settings, Storage
from airflow_provider_walsink.core.targets.base import StaticContext

ACCESS_KEY = "walsink-test-key"
SECRET_KEY = "walsink-test-secret"
REGION = "us-east-1"


@dataclass
class S3Server:
    endpoint: str
    bucket: str

    @property
    def settings(self) -> S3Settings:
        return S3Settings(endpoint=self.endpoint, access_key=ACCESS_KEY, secret_key=SECRET_KEY, region=REGION)

    def iceberg_properties(self) -> dict[str, str]:
        return {
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.region": REGION,
        }

    def delta_options(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
            # moto has no conditional put for the log; a lock-free single-writer
            # setting would be wrong in production and is not used: deltalake's
            # S3 commits use conditional PUT (If-None-Match), which moto supports.
            "aws_conditional_put": "etag",
        }

    def list(self, prefix: str) -> list[str]:
        import boto3

        s3 = boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )  # fmt: skip
        keys = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys += [o["Key"] for o in page.get("Contents", [])]
        return keys


@pytest.fixture(scope="session")
def s3_server():
    from tests.moto_server import serve

    with serve("walsink") as endpoint:
        yield S3Server(endpoint, "walsink")


@dataclass
class Place:
    """Where one test's tables live: a local directory or a prefix in the S3 server's bucket."""

    kind: str
    root: str  # absolute path or s3://bucket/prefix
    s3: S3Server | None = None

    @property
    def storage(self) -> Storage:
        return Storage(self.s3.settings if self.s3 else None)

    def uri(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])


@dataclass
class StorePlace(Place):
    """A place on a staging store of its own kind (``gs://`` on fake-gcs-server, ``abfss://`` on
    Azurite), read through that store, as a table target reads what it staged there."""

    options: dict | None = None
    server: Any = None

    @property
    def storage(self) -> Storage:
        from airflow_provider_walsink.core.targets._tables import StoreStorage

        return StoreStorage(self.store())

    def store(self, root: str | None = None) -> Any:
        from airflow_provider_walsink.core.staging.object_store import StagingStore

        return StagingStore.open(root or self.root, self.options)

    def iceberg_properties(self) -> dict[str, str]:
        """pyiceberg's file IO properties for this place's emulator (the model checker's)."""
        from tests.model.stores import of_server

        return of_server(self.server).iceberg_properties()


#: ``place`` takes these too when a test asks for them (``indirect`` parametrisation): the
#: emulators' session fixtures, for the behaviour that must hold on every object store.
STORE_PLACES = ("gs", "abfss")


@pytest.fixture(params=["local", "s3"])
def place(request, tmp_path) -> Place:
    if request.param == "local":
        return Place("local", str(tmp_path / "tables"))
    prefix = uuid.uuid4().hex[:12]
    if request.param in STORE_PLACES:
        server = request.getfixturevalue("gcs_server" if request.param == "gs" else "azurite_server")
        root = f"gs://{server.bucket}/{prefix}" if request.param == "gs" else server.root(prefix)
        return StorePlace(request.param, root, options=server.options, server=server)
    s3: S3Server = request.getfixturevalue("s3_server")
    return Place("s3", f"s3://{s3.bucket}/{prefix}", s3)


def objects_under(place: Place, location: str) -> list[str]:
    """Every object (local: file) under ``location``, relative to it, as the service itself lists
    them: a marker object another client leaves behind is listed too."""
    if place.kind == "local":
        root = Path(location)
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    server = place.s3 or getattr(place, "server", None)
    prefix = location.split("://", 1)[1].split("/", 1)[1].rstrip("/") + "/"
    return sorted(k[len(prefix) :] for k in server.list(prefix))


def events_table(rows: list[tuple[str, int, str]]) -> pa.Table:
    """Rows ``(dt, id, name)`` as the job's DataFrame would hold them."""
    return pa.table(
        {
            "dt": pa.array([r[0] for r in rows], pa.string()),
            "id": pa.array([r[1] for r in rows], pa.int64()),
            "name": pa.array([r[2] for r in rows], pa.string()),
        }
    )


def stage_attempt(
    place: Place,
    staging_root: str,
    pipeline: str,
    key: str,
    rows: list[tuple[str, int, str]],
    *,
    attempt: int = 1,
    files_per_partition: int = 1,
    partitioned: bool = True,
    table: pa.Table | None = None,
    sequence: int = 1,
    record_schema: bool = True,
    attempt_id: str | None = None,
) -> tuple[Manifest, str]:
    """Write an attempt's Parquet files where executors would; return (manifest, attempt location).

    ``record_schema``: seal the files' common schema in the manifest as the write job does
    (``file_schema``); False: a manifest without it (an older writer), publishers read every footer.
    ``attempt_id``: the committer table's id of the attempt (the store's ``attempt-<n>-<id>``).
    """
    # With the committer table's attempt id, where the store's layout puts that attempt.
    suffix = f"-{attempt_id}" if attempt_id else ""
    attempt_dir = f"{staging_root.rstrip('/')}/{pipeline}/{key}/attempt-{attempt}{suffix}"
    data = table if table is not None else events_table(rows)
    groups: dict[str, pa.Table] = {}
    if partitioned:
        for dt in sorted(set(data.column("dt").to_pylist())):
            mask = pa.compute.equal(data.column("dt"), dt)
            groups[f"dt={dt}"] = data.filter(mask).drop_columns(["dt"])
    else:
        groups[""] = data
    committables = []
    schemas = []
    storage = place.storage
    for partition, part in groups.items():
        chunk = max(1, -(-part.num_rows // files_per_partition))
        for i in range(files_per_partition):
            piece = part.slice(i * chunk, chunk)
            rel = f"{partition}/part-{i:05d}-{uuid.uuid4().hex[:8]}.parquet".lstrip("/")
            buf = io.BytesIO()
            pq.write_table(piece, buf)
            payload = buf.getvalue()
            schemas.append(file_schema_of(pq.read_metadata(pa.BufferReader(payload))))
            fs, path = storage.fs_and_path(f"{attempt_dir}/{rel}")
            if place.kind == "local":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            with fs.open_output_stream(path) as out:
                out.write(payload)
            committables.append(Committable(rel, len(payload), piece.num_rows, None, f"executor-{i}"))
    manifest = build_manifest(
        pipeline=pipeline,
        checkpoint_key=key,
        sequence=sequence,
        attempt=attempt,
        file_format="parquet",
        committables=committables,
        attempt_id=attempt_id or uuid.uuid4().hex,
        partition_columns=("dt",) if partitioned else (),
        partitions=tuple(p for p in groups if p),
        file_schema=common_file_schema(schemas) if record_schema else None,
    )
    fs, path = storage.fs_and_path(f"{attempt_dir}/_manifest.json")
    with fs.open_output_stream(path) as out:
        out.write(manifest.to_bytes())
    return manifest, attempt_dir


def ctx(manifest: Manifest, epoch: int = 1, **kwargs: Any) -> StaticContext:
    return StaticContext.for_manifest(manifest, epoch=epoch, **kwargs)


def layout_for(place: Place, root: str) -> Any:
    """What ``finish`` takes: a :class:`StagingLayout` for local roots, the root URI on S3, the
    staging store on the other object stores (as the committer hands it)."""
    if isinstance(place, StorePlace):
        return place.store(root)
    return StagingLayout(root) if place.kind == "local" else root


def local_table_spec(kind: str, tmp_path: Path) -> dict:
    """A fresh local table of ``kind``: an Iceberg identifier in an SQLite catalog, or a Delta path."""
    if kind == "iceberg":
        return {
            "identifier": f"ns.events_{uuid.uuid4().hex[:6]}",
            "props": {
                "type": "sql",
                "uri": f"sqlite:///{tmp_path}/catalog.db",
                "warehouse": f"file://{tmp_path}/warehouse",
            },
        }
    return {"uri": str(tmp_path / f"events_{uuid.uuid4().hex[:6]}")}


def staging_of(root: str, server: S3Server | None) -> Any:
    """The staging a table target's own root is read and written through: its local layout, or
    the moto bucket opened with the test keys."""
    if server is None:
        return StagingLayout(root)
    from airflow_provider_walsink.core.staging.object_store import StagingStore

    options = {
        "endpoint_url": server.endpoint,
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "region": REGION,
    }
    return StagingStore.open(root, options)


def put_staged(staging: Any, where: Any, relative: str, data: bytes) -> None:
    """Write a staged file: in the attempt's directory, or as the attempt's object."""
    if isinstance(where, Path):
        (where / relative).parent.mkdir(parents=True, exist_ok=True)
        (where / relative).write_bytes(data)
        return
    with staging.filesystem.open_output_stream(staging.committable(where, relative)) as out:
        out.write(data)
