"""The staging store (``core/staging/object_store.py``, ``gcs.py``, ``adls.py``) on a local root,
on S3 (moto's server), on GCS (fake-gcs-server) and on Azure Blob Storage (Azurite).

Each behaviour runs on every kind of root where it applies: the layout, the
seal written once (a conditional create on S3, GCS and Azure, refused by the
server when a manifest is there: 412, or 409 on Azure), manifest reads, sizes from metadata,
confinement, delete.
"""

from __future__ import annotations

import copy
import os
import re
import uuid

import pytest

from airflow_provider_walsink.core.protocol.checksum import file_checksum
from airflow_provider_walsink.core.protocol.errors import ManifestError, PathEscapeError, SymlinkRefusedError
from airflow_provider_walsink.core.protocol.manifest import Committable, build_manifest, digest_of
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import (
    AlreadySealedError,
    StagingStore,
    StagingStoreError,
)
from tests.table_fixtures import ACCESS_KEY, REGION, SECRET_KEY, s3_server  # noqa: F401

ATTEMPT_ID = "0123456789abcdef0123456789abcdef"


def s3_options(server) -> dict[str, str]:
    return {
        "endpoint_url": server.endpoint,
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "region": REGION,
    }


def object_store(request, kind: str) -> StagingStore:
    """A fresh prefix in the session's S3 (moto) or GCS (fake-gcs-server) bucket, or Azure (Azurite)
    container."""
    if kind == "abfss":
        server = request.getfixturevalue("azurite_server")
        return StagingStore.open(server.root(f"{uuid.uuid4().hex[:12]}/staging"), server.options)
    if kind == "gs":
        server = request.getfixturevalue("gcs_server")
        return StagingStore.open(f"gs://{server.bucket}/{uuid.uuid4().hex[:12]}/staging", server.options)
    server = request.getfixturevalue("s3_server")
    return StagingStore.open(f"s3://{server.bucket}/{uuid.uuid4().hex[:12]}/staging", s3_options(server))


@pytest.fixture(params=["local", "s3", "gs", "abfss", "memory"])
def store(request, tmp_path) -> StagingStore:
    if request.param == "local":
        return StagingStore.open(str(tmp_path / "staging"))
    if request.param == "memory":
        # A store without a conditional create: fsspec's in-memory one.
        return StagingStore.open(f"memory://b{uuid.uuid4().hex[:12]}/staging")
    return object_store(request, request.param)


@pytest.fixture(params=["s3", "gs", "abfss"])
def service_store(request) -> StagingStore:
    """A store on a service with a conditional create and checksums of its own (S3, GCS, Azure)."""
    return object_store(request, request.param)


def put(store: StagingStore, path: str, data: bytes) -> None:
    if store.layout is not None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with store.filesystem.open_output_stream(path) as f:
        f.write(data)


def manifest_for(paths_and_data: dict[str, bytes], *, job: str = "spark:app-1"):
    return build_manifest(
        pipeline="events",
        checkpoint_key="k1",
        sequence=1,
        attempt=1,
        attempt_id=ATTEMPT_ID,
        partition_columns=("dt",),
        file_format="parquet",
        committables=[
            Committable(p, len(d), 1, "crc32:" + format(__import__("zlib").crc32(d), "08x"))
            for p, d in paths_and_data.items()
        ],
        job=job,
    )


def test_attempts_are_placed_as_the_local_layout_places_them(store, tmp_path):
    location = store.attempt("events", "k1", 2, ATTEMPT_ID)
    assert location.path.endswith(f"/events/k1/attempt-2-{ATTEMPT_ID}")
    if store.layout is not None:
        assert location.uri == location.path
        assert location.path == str(
            StagingLayout(tmp_path / "staging").attempt_dir("events", "k1", 2, ATTEMPT_ID)
        )
    else:
        assert location.uri == store.root_uri.rstrip("/") + f"/events/k1/attempt-2-{ATTEMPT_ID}"
        assert location.path == f"{store.base}/events/k1/attempt-2-{ATTEMPT_ID}"
        assert not location.path.startswith("/")


def test_each_backend_names_its_root_and_manifest_so_no_caller_asks_its_kind(store, tmp_path):
    location = store.attempt("events", "k1", 1, ATTEMPT_ID)
    with pytest.raises(FileNotFoundError):
        store.read_manifest_bytes(location)
    assert store.describe(location, "_manifest.json") is None
    manifest = manifest_for({})
    store.seal(location, manifest)
    assert store.read_manifest_bytes(location) == manifest.to_bytes()
    assert store.describe(location, "_manifest.json") == len(manifest.to_bytes())
    if store.layout is not None:
        root = str(tmp_path / "staging")
        assert store.root_location == root
        assert store.manifest_uri(location) == f"file://{location.path}/_manifest.json"
        assert store.names_root(f"file://{root}/") and not store.names_root("s3://b/staging")
    else:
        assert store.root_location == store.root_uri.rstrip("/")
        assert store.manifest_uri(location) == f"{location.uri}/_manifest.json"
        assert store.names_root(store.root_uri + "/") and not store.names_root(str(tmp_path))


@pytest.mark.parametrize("bad", ["../x", "a/b", "", ".hidden"])
def test_identifiers_are_validated_on_every_store(store, bad):
    with pytest.raises(Exception, match="invalid pipeline id|must be a string"):
        store.attempt(bad, "k1", 1, ATTEMPT_ID)


def test_seal_once_same_manifest_is_idempotent_another_is_refused(store):
    location = store.attempt("events", "k1", 1, ATTEMPT_ID)
    first = manifest_for({"dt=2026-01-01/a.parquet": b"aaaa"})
    digest = store.seal(location, first)
    assert digest == digest_of(first.to_bytes())
    assert store.seal(location, first) == digest  # a retried seal of the same bytes

    other = manifest_for({"dt=2026-01-01/b.parquet": b"bbbbbb"})
    with pytest.raises(AlreadySealedError, match="already sealed with another manifest"):
        store.seal(location, other)
    # The first seal is untouched and reads back, digest-checked.
    assert store.read_manifest(location, expected_digest=digest) == first
    with pytest.raises(ManifestError, match="does not match the sealed digest"):
        store.read_manifest(location, expected_digest=digest_of(other.to_bytes()))


def test_the_seal_is_the_services_conditional_create_a_second_one_refused_by_the_service(service_store):
    store = service_store
    location = store.attempt("events", "k1", 1, ATTEMPT_ID)
    first = manifest_for({"dt=2026-01-01/a.parquet": b"a"})
    store.seal(location, first)
    bucket, _, key = location.manifest_path.partition("/")
    # A second create-only write of that key, straight through the service's client: refused by
    # the service itself (not by a read before the write), and the seal stays as it was.
    if store.kind == "s3":
        from botocore.exceptions import ClientError

        with pytest.raises(ClientError) as raised:
            store._boto3().put_object(Bucket=bucket, Key=key, Body=b"{}", IfNoneMatch="*")
        assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    elif store.kind == "abfs":  # Put Blob with If-None-Match: * (overwrite=False): 409 BlobAlreadyExists
        from azure.core.exceptions import ResourceExistsError

        with pytest.raises(ResourceExistsError) as raised:
            store._blob_service().get_blob_client(bucket, key).upload_blob(b"{}", overwrite=False)
        assert (raised.value.status_code, raised.value.error_code) == (409, "BlobAlreadyExists")
    else:
        from google.api_core.exceptions import PreconditionFailed

        with pytest.raises(PreconditionFailed) as raised:
            store._gcs().bucket(bucket).blob(key).upload_from_string(b"{}", if_generation_match=0)
        assert raised.value.code == 412
    assert store.read_manifest_bytes(location) == first.to_bytes()


def test_the_seal_reads_nothing_before_it_writes(service_store, monkeypatch):
    """The refusal of a second seal comes from the service's answer: the store does not look first."""
    store = service_store
    location = store.attempt("events", "k1", 1, ATTEMPT_ID)
    store.seal(location, manifest_for({"dt=1/a.parquet": b"a"}))
    looked: list[str] = []
    real = store.filesystem

    class Watch:  # every read of the file system before the write is recorded
        def __getattr__(self, name):
            looked.append(name)
            return getattr(real, name)

    monkeypatch.setattr(store, "filesystem", Watch())
    if store.kind == "s3":  # the conditional put and the manifest's read go through boto3 there
        client = store._boto3()

        class WatchClient:
            def __getattr__(self, name):
                looked.append(name)
                return getattr(client, name)

        monkeypatch.setattr(store, "_s3_client", WatchClient())
    with pytest.raises(AlreadySealedError):
        store.seal(location, manifest_for({"dt=1/b.parquet": b"b"}))
    # Only the read of the sealed manifest, after the service refused the create (on S3 one GET,
    # no HEAD: the durability checks of a busy triggerer read manifests the same way).
    expected = ["put_object", "get_object"] if store.kind == "s3" else ["open_input_stream"]
    assert looked == expected, looked


def test_listing_gives_sizes_and_the_services_own_checksums(service_store):
    store = service_store
    location = store.attempt("events", "k1", 1, ATTEMPT_ID)
    put(store, f"{location.path}/dt=1/a.parquet", b"12345")
    put(store, f"{location.path}/dt=2/b.parquet", b"abc")
    listed = store.stored_checksums(location)
    assert {rel: size for rel, (size, _sum) in listed.items()} == store.list_attempt(location)
    if store.kind == "gs":  # CRC32C as the service computed it (the value in the object's metadata)
        assert listed["dt=2/b.parquet"] == (3, "crc32c:364b3fb7")  # CRC32C("abc")
    elif store.kind == "abfs":  # blocks and a block list: no Content-MD5 kept, the ETag
        assert listed["dt=2/b.parquet"][0] == 3 and listed["dt=2/b.parquet"][1].startswith("etag:")
        # One Put Blob (the seal's upload): the Content-MD5 the service computed.
        manifest = manifest_for({})
        store.seal(location, manifest)
        md5 = __import__("hashlib").md5(manifest.to_bytes()).hexdigest()
        assert store.stored_checksums(location)["_manifest.json"] == (len(manifest.to_bytes()), f"md5:{md5}")
    else:  # the ETag (pyarrow uploads in parts: not the MD5 of the bytes, but changed with them)
        assert listed["dt=2/b.parquet"][0] == 3 and listed["dt=2/b.parquet"][1].startswith("etag:")
    before = listed["dt=1/a.parquet"]
    put(store, f"{location.path}/dt=1/a.parquet", b"12346")  # same size, other bytes
    after = store.stored_checksums(location)["dt=1/a.parquet"]
    assert after[0] == before[0] and after[1] != before[1]


def test_an_unsealed_attempt_has_no_manifest(store):
    location = store.attempt("events", "k1", 1, ATTEMPT_ID)
    with pytest.raises(ManifestError, match="does not exist"):
        store.read_manifest(location)


def test_an_empty_or_unreadable_manifest_is_a_manifest_error(store, monkeypatch):
    """An empty object where the manifest belongs (S3 refuses a ranged read of one) and a store
    that does not answer are both a :class:`ManifestError` naming the manifest, never another
    exception: the durability check reports "not yet" and the commit refuses."""
    location = store.attempt("events", "k1", 1, ATTEMPT_ID)
    put(store, location.manifest_path, b"")
    with pytest.raises(ManifestError, match="_manifest.json"):
        store.read_manifest(location)
    if store.kind == "s3":  # nothing listens at the endpoint any more
        import boto3
        from botocore.config import Config

        gone = boto3.client(
            "s3", endpoint_url="http://127.0.0.1:9", aws_access_key_id="k", aws_secret_access_key="s",
            region_name=REGION, config=Config(retries={"max_attempts": 1}, connect_timeout=1),
        )  # fmt: skip
        monkeypatch.setattr(store, "_s3_client", gone)
        with pytest.raises(ManifestError, match="cannot be read"):
            store.read_manifest(location)


def test_sizes_come_from_metadata_and_a_listing(store):
    location = store.attempt("events", "k1", 1, ATTEMPT_ID)
    put(store, f"{location.path}/dt=2026-01-01/a.parquet", b"12345")
    put(store, f"{location.path}/dt=2026-01-01/_SUCCESS", b"")
    put(store, f"{location.path}/dt=2026-01-02/b.parquet", b"123")
    assert store.describe(location, "dt=2026-01-01/a.parquet") == 5
    assert store.describe(location, "dt=2026-01-01/missing.parquet") is None
    assert store.list_attempt(location) == {
        "dt=2026-01-01/a.parquet": 5,
        "dt=2026-01-01/_SUCCESS": 0,
        "dt=2026-01-02/b.parquet": 3,
    }
    assert store.list_attempt(location, visible_only=True) == {
        "dt=2026-01-01/a.parquet": 5,
        "dt=2026-01-02/b.parquet": 3,
    }
    assert store.checksum(location, "dt=2026-01-02/b.parquet", "sha256") == (
        "sha256:a665a45920422f9d417e4867efdc4fb8a04a1f3fff1fa07e998e86f7f7a27ae3"
    )


@pytest.mark.parametrize(
    ("relative", "message"),
    [
        ("../k2/attempt-1/x.parquet", "contains '..'"),
        ("dt=1/../../x", "contains '..'"),
        ("/etc/passwd", "is absolute"),
        ("a\x00b", "NUL"),
        ("", "empty"),
    ],
)
def test_paths_that_escape_the_attempt_are_refused(store, relative, message):
    location = store.attempt("events", "k1", 1, ATTEMPT_ID)
    with pytest.raises(PathEscapeError, match=message):
        store.committable(location, relative)
    with pytest.raises(PathEscapeError):
        store.describe(location, relative)


@pytest.mark.parametrize("relative", ["dt=1//x.parquet", "dt=1/./x.parquet"])
def test_object_keys_with_empty_or_dot_segments_are_refused(service_store, relative):
    store = service_store
    location = store.attempt("events", "k1", 1, ATTEMPT_ID)
    with pytest.raises(PathEscapeError, match="empty or '.' segment"):
        store.committable(location, relative)
    with pytest.raises(PathEscapeError, match="empty or '.' segment"):
        store.checksum(location, relative, "crc32")


def test_local_symlinks_inside_staging_are_refused_not_followed(tmp_path):
    store = StagingStore.open(f"file://{tmp_path}/staging")
    location = store.attempt("events", "k1", 1, ATTEMPT_ID)
    os.makedirs(location.path)
    outside = tmp_path / "secret.txt"
    outside.write_text("not staging")
    os.symlink(outside, f"{location.path}/x.parquet")
    with pytest.raises(SymlinkRefusedError):
        store.describe(location, "x.parquet")
    with pytest.raises(SymlinkRefusedError):
        store.list_attempt(location)
    with pytest.raises(SymlinkRefusedError):
        store.checksum(location, "x.parquet", "crc32")


def test_remove_attempt_deletes_that_attempt_only(store):
    mine = store.attempt("events", "k1", 1, ATTEMPT_ID)
    plain = store.attempt("events", "k1", 1, "v1-a1")  # attempt-1: a prefix of the one above
    other = store.attempt("events", "k1", 2, "f" * 32)
    for location in (mine, plain, other):
        put(store, f"{location.path}/dt=1/a.parquet", b"x")
    assert store.remove_attempt(mine) is True
    assert store.list_attempt(mine) == {}
    assert store.list_attempt(plain) == {"dt=1/a.parquet": 1}
    assert store.list_attempt(other) == {"dt=1/a.parquet": 1}
    assert store.remove_attempt(mine) is False
    # And the plain attempt-1, whose name prefixes attempt-1-<id>, takes only its own files.
    put(store, f"{mine.path}/dt=1/a.parquet", b"x")
    assert store.remove_attempt(plain) is True
    assert store.list_attempt(plain) == {} and store.list_attempt(mine) == {"dt=1/a.parquet": 1}


def test_remove_refuses_a_location_the_store_did_not_build(store):
    real = store.attempt("events", "k1", 1, ATTEMPT_ID)
    forged = type(real)(**{**real.__dict__, "path": real.path.rsplit("/", 3)[0]})
    with pytest.raises(PathEscapeError, match="not an attempt of this staging root"):
        store.remove_attempt(forged)


def test_resolution_errors_name_the_problem(tmp_path):
    with pytest.raises(StagingStoreError, match="unknown S3 storage options"):
        StagingStore.open("s3://b/p", {"acess_key": "x"})
    with pytest.raises(StagingStoreError, match="both access_key and secret_key"):
        StagingStore.open("s3://b/p", {"access_key": "x"})
    with pytest.raises(StagingStoreError, match="names no bucket"):
        StagingStore.open("s3:///p")
    with pytest.raises(StagingStoreError, match="apply to object stores only"):
        StagingStore.open(str(tmp_path), {"region": "x"})
    # Azure: the root as Spark writes it, and exactly one credential the connection holds.
    key = {"account_key": "a2V5"}
    for root, message in (
        ("az://c/p", "write an Azure root as abfss://<container>@<account>.dfs.core.windows.net"),
        ("abfss://c/p", "names no container and account"),
        ("abfss://c@acct.example.com/p", "names no container and account"),
        ("abfss://Stage@acct.dfs.core.windows.net/p", "'Stage' is not a container name"),
        ("abfss://stage@my_acct.dfs.core.windows.net/p", "'my_acct' is not a storage account name"),
    ):
        with pytest.raises(StagingStoreError, match=re.escape(message)):
            StagingStore.open(root, key)
    root = "abfss://stage@acct.dfs.core.windows.net/p"
    for options, message in (
        ({}, "give the storage account's key (account_key); walsink never falls back"),
        ({**key, "sas_token": "sv=x"}, "unknown Azure storage options ['sas_token']"),
        ({"account_key": "not base64!"}, "the account key is not base64"),
        ({**key, "endpoint_url": "http://127.0.0.1:10000"}, "like http://127.0.0.1:10000/acct"),
        ({**key, "client_id": "x"}, "unknown Azure storage options ['client_id']"),
    ):
        with pytest.raises(StagingStoreError, match=re.escape(message)) as info:
            StagingStore.open(root, options)
        assert "a2V5" not in str(info.value)


def test_options_never_show_in_repr():
    store = StagingStore.open("s3://b/p", {"access_key": "AKIDSECRETID", "secret_key": "SUPERSECRET"})
    assert "SUPERSECRET" not in repr(store) and "AKIDSECRETID" not in repr(store)
    store = StagingStore.open("abfss://c01@acct.dfs.core.windows.net/p", {"account_key": "U1VQRVJTRUNSRVQ="})
    assert "U1VQRVJTRUNSRVQ=" not in repr(store)


def test_a_local_file_checksum_matches_the_protocols(tmp_path):
    store = StagingStore.open(str(tmp_path / "staging"))
    location = store.attempt("events", "k1", 1, ATTEMPT_ID)
    put(store, f"{location.path}/a.parquet", b"some bytes")
    assert store.checksum(location, "a.parquet", "crc32") == file_checksum(
        f"{location.path}/a.parquet", "crc32"
    )


def test_durability_on_any_store_detects_missing_resized_and_escaping_files(store):
    from airflow_provider_walsink.core.staging.durability import check_stored_attempt

    location = store.attempt("events", "k1", 1, ATTEMPT_ID)
    files = {
        "dt=2026-01-01/a.parquet": b"aaaa",
        "dt=2026-01-01/b.parquet": b"bb",
        "dt=2026-01-02/c.parquet": b"c",
    }
    for rel, data in files.items():
        put(store, f"{location.path}/{rel}", data)
    manifest = manifest_for(files)
    store.seal(location, manifest)
    report = check_stored_attempt(store, manifest, location, verify_checksums=True)
    assert report.durable and report.checked == 3, report.describe()

    put(store, f"{location.path}/dt=2026-01-01/b.parquet", b"bbb")  # resized
    store.filesystem.delete_file(f"{location.path}/dt=2026-01-02/c.parquet")  # lost
    put(store, f"{location.path}/dt=2026-01-01/a.parquet", b"AAAA")  # same size, other bytes
    report = check_stored_attempt(store, manifest, location, verify_checksums=True)
    assert report.missing == ["dt=2026-01-02/c.parquet"]
    assert report.wrong_size == ["dt=2026-01-01/b.parquet (3 bytes, manifest says 2)"]
    assert [w.split(" ")[0] for w in report.wrong_checksum] == ["dt=2026-01-01/a.parquet"]
    assert not check_stored_attempt(store, manifest, location).wrong_checksum  # sizes only unless asked

    # A manifest naming a path outside the attempt (built past validation, as a hostile file would be).
    hostile = copy.copy(manifest)
    object.__setattr__(hostile, "committables", (Committable("../k2/x.parquet", 1, 1),))
    report = check_stored_attempt(store, hostile, location)
    assert not report.durable and report.escaping and "contains '..'" in report.escaping[0]
