"""Bad input, property-based (hypothesis): hostile manifests and identifiers (DESIGN.md invariant 6).

Properties:

* manifest bytes, however corrupted or truncated, either parse into a valid
  manifest or raise :class:`ManifestError` naming the problem: never any
  other exception;
* a hostile sealed manifest is refused at commit with an error naming the
  problem, recorded on the checkpoint, which stays uncommitted; the target is
  unchanged and nothing outside the staging root is read, moved or deleted;
  a mutation that happens to be harmless commits exactly the source rows;
* pipeline ids and checkpoint keys with quotes, slashes, ``..``, unicode or
  SQL meta-characters are rejected with an error naming them, or stored
  exactly as given; they never appear in the text of any SQL statement.

Example counts are kept small for CI time; raise ``HYPOTHESIS_PROFILE=long``.
"""

from __future__ import annotations

import itertools
import json
import os
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event, func, select, update

from airflow_provider_walsink.core.commit import CheckpointCommitter
from airflow_provider_walsink.core.commit.refusals import BAD_INPUT
from airflow_provider_walsink.core.protocol import CheckpointState as S
from airflow_provider_walsink.core.protocol import digest_of
from airflow_provider_walsink.core.protocol.errors import InvalidIdentifierError, ManifestError
from airflow_provider_walsink.core.protocol.identifiers import validate_identifier
from airflow_provider_walsink.core.protocol.manifest import MAX_MANIFEST_BYTES, Manifest, parse_manifest
from airflow_provider_walsink.core.staging.durability import check_attempt
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.store.models import checkpoint_table, pipeline_table, transition_table
from airflow_provider_walsink.core.targets import FilePublisher
from tests.helpers import ACTOR, stage_checkpoint, target_files

settings.register_profile(
    "ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.register_profile(
    "long", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")

FILES = {f"dt=2026-01-01/part-{i}.csv": f"row {i}\n".encode() * 3 for i in range(3)}
SECRET = b"row 0\nrow 0\nrow 0\n"  # the size of a committable, to tempt a size-only check

HOSTILE_TEXT = [
    "'; DROP TABLE walsink_checkpoint; --",
    "x' OR '1'='1",
    'a"b',
    "a;b",
    "%s",
    "%(pipeline)s",
    ":pipeline",
    "?",
    "..",
    "../..",
    "a/../b",
    "a/b",
    "/etc/passwd",
    "a\\b",
    "a\x00b",
    "",
    " ",
    ".hidden",
    "ünïcødé",
    "表",
    "a\nb",
    "x" * 129,
    "-leading",
    "a..b",
    "~root",
    "$HOME",
]
HOSTILE_PATHS = [
    "../../outside/secret.csv",
    "dt=2026-01-01/../../../../outside/secret.csv",
    "/tmp/secret.csv",
    "dt=2026-01-01/./part-0.csv",
    "dt=2026-01-01//part-0.csv",
    ".hidden/part-0.csv",
    "dt=2026-01-01/.part-0.csv",
    "dt=2026-01-01/",
    "dt=../part-0.csv",
    "nocolumn/part-0.csv",
    "dt=2026-01-01\\..\\x.csv",
    "dt=2026-01-01/part\x00.csv",
    "dt=escape/part-0.csv",  # a symlinked directory pointing outside (planted per example)
    "dt=2026-01-01/link.csv",  # a symlinked file pointing outside (planted per example)
]

identifier_text = st.one_of(
    st.sampled_from(HOSTILE_TEXT),
    st.text(alphabet=st.sampled_from("aZ09_.=+-/\\'\";%:?$ \x00é表\n"), min_size=0, max_size=12),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.=+-]{0,20}", fullmatch=True),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=6,
)  # fmt: skip


def _valid_bytes() -> bytes:
    from airflow_provider_walsink.core.protocol.manifest import Committable, build_manifest

    committables = [
        Committable(path=p, size=len(d), rows=3, checksum=None, writer="w0") for p, d in FILES.items()
    ]
    m = build_manifest(
        pipeline="p",
        checkpoint_key="k1",
        sequence=1,
        attempt=1,
        attempt_id="0" * 32,
        file_format="csv",
        committables=committables,
    )
    return m.to_bytes()


VALID = _valid_bytes()


# ----------------------------------------------------------------------------- parsing


byte_mutations = st.one_of(
    st.integers(0, len(VALID)).map(lambda n: ("truncate", n)),
    st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)).map(lambda t: ("flip", t)),
    st.tuples(st.integers(0, len(VALID)), st.binary(min_size=1, max_size=16)).map(lambda t: ("insert", t)),
    st.binary(max_size=64).map(lambda b: ("replace", b)),
    st.integers(1, 50_000).map(lambda n: ("deep", n)),
)


def apply_bytes(mutation) -> bytes:
    kind, arg = mutation
    if kind == "truncate":
        return VALID[:arg]
    if kind == "flip":
        i, b = arg
        return VALID[:i] + bytes([b]) + VALID[i + 1 :]
    if kind == "insert":
        i, data = arg
        return VALID[:i] + data + VALID[i:]
    if kind == "deep":  # nesting deep enough to exhaust a recursive parser
        doc = json.loads(VALID)
        return json.dumps(doc)[:-1].encode() + b',"job":' + b"[" * arg + b"]" * arg + b"}"
    return arg


@settings(settings.get_profile(PROFILE), max_examples=settings.get_profile(PROFILE).max_examples * 4)
@given(byte_mutations)
def test_corrupted_or_truncated_manifest_bytes_parse_or_raise_manifest_error(mutation):
    data = apply_bytes(mutation)
    try:
        manifest = parse_manifest(data, source="manifest under test")
    except ManifestError as e:
        assert str(e).startswith("manifest under test: ") and len(str(e)) > len("manifest under test: ")
    else:
        assert isinstance(manifest, Manifest) and manifest.to_bytes()  # a valid one round-trips


# ----------------------------------------------------------------------------- hostile sealed manifests


def _set(path: list, value):
    def mutate(doc):
        obj = doc
        for step in path[:-1]:
            obj = obj[step]
        obj[path[-1]] = value

    return mutate


def _delete(path: list):
    def mutate(doc):
        obj = doc
        for step in path[:-1]:
            obj = obj[step]
        obj.pop(path[-1], None)

    return mutate


doc_mutations = st.one_of(
    st.tuples(st.integers(0, 2), st.sampled_from(HOSTILE_PATHS) | st.text(max_size=30)).map(
        lambda t: _set(["committables", t[0], "path"], t[1])
    ),
    st.tuples(st.integers(0, 2), st.sampled_from(["size", "rows", "checksum", "writer"]), json_values).map(
        lambda t: _set(["committables", t[0], t[1]], t[2])
    ),
    st.tuples(st.integers(0, 2), st.integers(-5, 2**64)).map(lambda t: _set(["committables", t[0], "size"], t[1])),
    st.sampled_from(["pipeline", "attempt", "format", "schema_version", "expected_count", "created_at", "job"]).flatmap(
        lambda k: (st.sampled_from(HOSTILE_TEXT) | json_values).map(lambda v: _set([k], v))
    ),
    (st.sampled_from(HOSTILE_TEXT) | json_values).map(lambda v: _set(["checkpoint", "key"], v)),
    st.lists(st.sampled_from(HOSTILE_TEXT) | st.sampled_from(HOSTILE_PATHS), min_size=1, max_size=3).map(
        lambda v: _set(["partitions"], v)
    ),
    json_values.map(lambda v: _set(["totals", "rows"], v)),
    json_values.map(lambda v: _set(["source_offsets"], v)),
    st.sampled_from(["pipeline", "checkpoint", "committables", "totals", "attempt", "format"]).map(lambda k: _delete([k])),
    st.text(min_size=1, max_size=10).map(lambda k: _set([k], 1)),
    st.integers(0, 2).map(lambda i: _set(["committables", i, "extra"], "x")),
    st.just(_set(["committables"], [])),
)  # fmt: skip

_seq = itertools.count()


def _plant_escapes(attempt_dir: Path, outside: Path) -> None:
    """Symlinks inside the attempt pointing outside the staging root (for the hostile paths above)."""
    (attempt_dir / "dt=escape").symlink_to(outside, target_is_directory=True)
    (outside / "part-0.csv").write_bytes(SECRET)
    (attempt_dir / "dt=2026-01-01" / "link.csv").symlink_to(outside / "secret.csv")


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@settings(settings.get_profile(PROFILE))
@given(
    mutations=st.lists(doc_mutations, min_size=1, max_size=3), mode=st.sampled_from(["append", "overwrite"])
)
def test_hostile_sealed_manifest_is_refused_recorded_and_confined(sqlite_store, tmp_path, mutations, mode):
    store = sqlite_store
    work = tmp_path / uuid.uuid4().hex[:8]
    layout = StagingLayout(work / "staging")
    outside = work / "outside"
    outside.mkdir(parents=True)
    (outside / "secret.csv").write_bytes(SECRET)
    target = work / "target"
    target.mkdir()
    (target / "existing.csv").write_bytes(b"already here\n")
    pipeline = f"p{next(_seq)}"
    record, _, attempt_dir = stage_checkpoint(store, layout, pipeline, "k1", FILES, mode=mode)
    _plant_escapes(attempt_dir, outside)
    outside_before = _snapshot(outside)

    doc = json.loads(layout.manifest_path(pipeline, "k1", record.attempt).read_bytes())
    doc["pipeline"] = pipeline
    for mutate in mutations:
        try:
            mutate(doc)
        except (IndexError, KeyError, TypeError):
            pass  # the mutation's path no longer exists after an earlier one
    data = json.dumps(doc).encode()
    layout.manifest_path(pipeline, "k1", record.attempt).write_bytes(data)
    with store.engine.begin() as conn:  # sealed as a hostile or buggy writer would
        conn.execute(
            update(checkpoint_table)
            .where(checkpoint_table.c.id == record.id)
            .values(manifest_digest=digest_of(data))
        )

    # The durability check (the sensor's) never raises on a parsed manifest and never leaves the root.
    try:
        manifest = parse_manifest(data)
    except ManifestError:
        manifest = None
    if manifest is not None:
        report = check_attempt(layout, manifest, attempt_dir, verify_checksums=True)
        assert all("outside" in e or "symlink" in e for e in report.escaping)

    committer = CheckpointCommitter(
        store,
        layout,
        FilePublisher(target, mode, layout=layout, verify_checksums=True),
        mode=mode,
        verify_checksums=True,
    )
    try:
        committer.commit(pipeline, "k1", actor=ACTOR)
    except BAD_INPUT as exc:
        message = str(exc)
        assert message.strip(), "an error must name the problem"
        after = store.require(pipeline, "k1")
        assert after.state is S.FAILED and not after.is_committed
        assert after.error == message[:10000]  # visible in the committer table
        assert target_files(target) == {"existing.csv": b"already here\n"}
    else:
        # A harmless mutation (a job name, a writer...): exactly the staged rows were published.
        rows = sorted(line for d in target_files(target).values() for line in d.splitlines())
        assert rows == sorted([b"already here"] + [line for d in FILES.values() for line in d.splitlines()])
        assert store.require(pipeline, "k1").is_committed
    assert _snapshot(outside) == outside_before  # nothing outside was read into the target, moved or deleted
    assert (outside / "secret.csv").read_bytes() == SECRET


def test_oversized_manifest_is_refused_before_parsing(sqlite_store, layout, tmp_path):
    record, _, _ = stage_checkpoint(sqlite_store, layout, "big", "k1", FILES)
    path = layout.manifest_path("big", "k1", record.attempt)
    data = VALID[:-1] + b',"job":"' + b"x" * (MAX_MANIFEST_BYTES + 1) + b'"}'
    path.write_bytes(data)
    with sqlite_store.engine.begin() as conn:
        conn.execute(
            update(checkpoint_table)
            .where(checkpoint_table.c.id == record.id)
            .values(manifest_digest=digest_of(data[: MAX_MANIFEST_BYTES + 1]))
        )
    target = tmp_path / "target"
    committer = CheckpointCommitter(
        sqlite_store, layout, FilePublisher(target, "overwrite", layout=layout), mode="overwrite"
    )
    with pytest.raises(ManifestError, match="exceed the manifest limit"):
        committer.commit("big", "k1", actor=ACTOR)
    after = sqlite_store.require("big", "k1")
    assert after.state is S.FAILED and "exceed the manifest limit" in after.error
    assert target_files(target) == {}


def test_symlinked_manifest_is_not_followed(sqlite_store, layout, tmp_path):
    record, _, _ = stage_checkpoint(sqlite_store, layout, "sym", "k1", FILES)
    path = layout.manifest_path("sym", "k1", record.attempt)
    real = tmp_path / "elsewhere.json"
    real.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(real)
    committer = CheckpointCommitter(
        sqlite_store, layout, FilePublisher(tmp_path / "target", "overwrite", layout=layout), mode="overwrite"
    )
    with pytest.raises(ManifestError, match="cannot be opened"):
        committer.commit("sym", "k1", actor=ACTOR)
    assert sqlite_store.require("sym", "k1").state is S.FAILED
    assert real.exists()


# ----------------------------------------------------------------------------- identifiers


@pytest.fixture
def sql_log(store):
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement)

    event.listen(store.engine, "before_cursor_execute", record)
    yield statements
    event.remove(store.engine, "before_cursor_execute", record)


@settings(settings.get_profile(PROFILE), max_examples=min(30, settings.get_profile(PROFILE).max_examples))
@given(value=identifier_text, as_key=st.booleans())
def test_hostile_identifiers_are_rejected_or_stored_exactly_and_always_bound(
    store, sql_log, tmp_path, value, as_key
):
    pipeline, key = ("idp", value) if as_key else (value, "k1")
    what = "checkpoint key" if as_key else "pipeline id"
    layout = StagingLayout(tmp_path / "staging")
    sql_log.clear()
    try:
        validate_identifier(value, what)
        valid = True
    except InvalidIdentifierError:
        valid = False
    if valid:
        record = store.register(pipeline, key, mode="overwrite", actor=ACTOR)
        assert (record.pipeline, record.checkpoint_key) == (pipeline, key)
        assert store.require(pipeline, key).checkpoint_key == key
        path = layout.checkpoint_dir(pipeline, key)
        assert layout.root in path.parents
    else:
        with pytest.raises(InvalidIdentifierError) as err:
            store.register(pipeline, key, mode="overwrite", actor=ACTOR)
        assert repr(value) in str(err.value) and what in str(err.value)  # the error names it
        with pytest.raises(InvalidIdentifierError):
            layout.checkpoint_dir(pipeline, key)
        assert store.get(pipeline, key) is None  # a lookup binds it and finds nothing
    if len(value) >= 2:
        # Formatted into SQL, a value shows up as a quoted literal (a bare substring could
        # be a column name: 'na' is in 'walsink_pipeline.name').
        quoted = [f"'{value}'", f'"{value}"', f"'{value.replace(chr(39), chr(39) * 2)}'"]
        assert not [s for s in sql_log if any(q in s for q in quoted)], (
            "an identifier reached SQL text unbound"
        )
    with store.engine.connect() as conn:  # the tables are all still there
        for table in (pipeline_table, checkpoint_table, transition_table):
            conn.execute(select(func.count()).select_from(table)).scalar_one()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mysql"])
def test_identifiers_differing_only_in_case_never_share_a_row(database_urls, backend):
    """MySQL/MariaDB compare strings case-insensitively by default: ``sales`` must never resolve to
    the row of ``Sales`` (its data would be taken as already committed). The identifier columns
    have a binary collation there, so every backend keeps them as distinct rows."""
    from tests.conftest import _empty, _migrated_store

    store = _migrated_store(database_urls(backend))
    _empty(store)
    first = store.register("Sales", "K1", mode="append", actor=ACTOR)
    ids = {first.id}
    for pipeline, key in (("sales", "K1"), ("sales", "k2"), ("Sales", "k1")):
        second = store.register(pipeline, key, mode="append", actor=ACTOR)
        assert (second.pipeline, second.checkpoint_key) == (pipeline, key)
        ids.add(second.id)
    assert len(ids) == 4
    assert store.get("SALES", "K1") is None  # a lookup never returns a case-insensitive match either
