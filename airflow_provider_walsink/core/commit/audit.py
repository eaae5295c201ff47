"""The audit gate (write-audit-publish): checks on a durable checkpoint's staged data
before anything is published.

Iceberg's write-audit-publish and lakeFS's pre-merge hooks check data between
"written" and "visible"; here the staged attempt is that place. A pipeline that
declares an audit runs ``write >> durable >> audit >> commit``, and its commit
publishes only an AUDITED attempt. Airflow-free, like the committer.

:func:`audit_checkpoint` reads the checkpoint's row and its sealed manifest
(digest and identity checked, as the commit does), opens the staged files
(paths from the manifest, each confined to the attempt's staging directory:
nothing outside the staging root is read), runs **every** check (not only up
to the first failure, so the UI shows all that is wrong) and records the
verdict on the sealed attempt, by its attempt id:

* all passed: AUDITED (each check's result in the history, as JSON);
* any failed: REJECTED, the failed checks as the checkpoint's ``error``
  (``not_null(user_id): 3 of 1,000 rows are NULL``); never published, until
  a new write attempt replaces the data (or the checkpoint is aborted).

**A verdict or an error.** A check that ran and found the data wanting
*fails* (REJECTED: retrying cannot help). A check that could not run (a file
format it cannot read, row counts the writer did not record, a bug in a user
callable, a DuckDB error) *raises*: nothing is recorded, the checkpoint stays
DURABLE and unaudited, and an audited pipeline's commit refuses it until the
audit has passed.

The checks that read rows use DuckDB (``pip install
"airflow-provider-walsink[audit]"``) in a connection that may read exactly the
attempt's staged files and nothing else (external access off but for those
paths, configuration locked), so a SQL predicate cannot reach another file.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from airflow_provider_walsink.core.commit.refusals import explain_not_committable
from airflow_provider_walsink.core.commit.sealed import read_sealed_attempt
from airflow_provider_walsink.core.protocol.errors import NotDurableError, WalsinkError
from airflow_provider_walsink.core.protocol.manifest import Manifest
from airflow_provider_walsink.core.protocol.partitions import HIVE_NULL, partition_value
from airflow_provider_walsink.core.protocol.states import CheckpointState
from airflow_provider_walsink.core.staging.cleanup import is_object_store
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import AttemptLocation, StagingStore
from airflow_provider_walsink.core.staging.resolve import as_store, staging_for
from airflow_provider_walsink.core.store.store import Actor, CommitterStore
from airflow_provider_walsink.core.targets.base import StagedAttempt

if TYPE_CHECKING:
    import duckdb

S = CheckpointState
#: The column that ties a staged row to its file while partition values are joined in.
_FILE_COLUMN = "__walsink_file"
#: History ``detail`` holds at most this much of the results (the store cuts at 10,000).
_DETAIL_LIMIT = 9000
_TEXT_LIMIT = 300


class AuditError(WalsinkError):
    """An audit check could not run (not a verdict on the data): nothing is recorded."""


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError:  # pragma: no cover - installed with the [audit] extra
        raise AuditError(
            'audit checks that read staged rows need DuckDB: pip install "airflow-provider-walsink[audit]"'
        ) from None
    return duckdb


def _cut(text: str, limit: int = _TEXT_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _rows(n: int) -> str:
    return f"{n:,} row{'s' if n != 1 else ''}"


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: its name, whether it passed, and why, in a sentence."""

    check: str
    passed: bool
    reason: str

    def __str__(self) -> str:
        return f"{self.check}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class StagedData:
    """The staged files of one sealed attempt, opened for checks (one per audit run).

    * ``manifest``: the sealed manifest (totals, committables, partitions);
    * ``files``: each committable's path, confined to the attempt directory;
    * :meth:`relation`: every staged row as a DuckDB relation, partition
      columns included (from the committables' directories, as VARCHAR; Hive's
      ``__HIVE_DEFAULT_PARTITION__`` as NULL), or ``None`` when the attempt
      staged no file; also registered as the view ``staged`` in
      :meth:`connection`, for SQL.

    The DuckDB connection may read these files and nothing else; it is closed
    with the audit.
    """

    #: Manifest file formats DuckDB reads here, and how.
    READERS = {
        "parquet": "read_parquet($files, filename = '__walsink_file', hive_partitioning = false, union_by_name = true)",
        "json": "read_json($files, format = 'newline_delimited', filename = '__walsink_file', "
        "hive_partitioning = false, union_by_name = true)",
        "csv": "read_csv($files, filename = '__walsink_file', hive_partitioning = false, union_by_name = true)",
    }

    def __init__(
        self,
        layout: StagingLayout | None,
        manifest: Manifest,
        attempt_dir: Path | str,
        *,
        store: tuple[StagingStore, AttemptLocation] | None = None,
    ) -> None:
        self.manifest = manifest
        self.attempt_dir = attempt_dir
        self._store = store
        if store is not None:
            staging, location = store
            # Confined lexically by the store (no links on an object store), as durability checked them.
            self.files: list[str] = [staging.committable(location, c.path) for c in manifest.committables]
        else:
            assert layout is not None
            resolve = layout.committable_resolver(Path(attempt_dir))
            # Confined, never through a symlink: the same resolution the durability check used.
            self.files = [resolve(c.path)[0] for c in manifest.committables]
        self._partitions = [c.partition for c in manifest.committables]
        self._conn: duckdb.DuckDBPyConnection | None = None
        self._relation: duckdb.DuckDBPyRelation | None = None

    @classmethod
    def of(cls, attempt: StagedAttempt, manifest: Manifest) -> StagedData:
        """A sealed attempt as :func:`~.sealed.read_sealed_attempt` found it: DuckDB reads the files of
        a local root in place; an object store's through the store (:meth:`on_store`)."""
        store, location = attempt.store, attempt.location
        if store.layout is not None:
            return cls(store.layout, manifest, Path(location.path))
        return cls.on_store(store, manifest, location)

    @classmethod
    def on_store(cls, staging: StagingStore, manifest: Manifest, location: AttemptLocation) -> StagedData:
        """The sealed attempt on an object store (``s3://``...): its Parquet committables are read
        through the store's own pyarrow file system, the one the durability check listed them with."""
        return cls(None, manifest, location.uri, store=(staging, location))

    @property
    def total_rows(self) -> int | None:
        """Rows the manifest counts (no data read), or None if a committable's count is unknown."""
        if any(c.rows is None for c in self.manifest.committables):
            return None
        return self.manifest.total_rows

    def connection(self) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection that can read the staged files only (view ``staged``, if any)."""
        conn = self._connect()
        self.relation()  # registers the view
        return conn

    def _connect(self) -> duckdb.DuckDBPyConnection:
        if self._conn is None:
            conn = _duckdb().connect(":memory:")
            try:
                # Exactly the confined files, then no other path, and no way back.
                conn.execute("SET allowed_paths = $paths", {"paths": self.files})
                conn.execute("SET enable_external_access = false")
                conn.execute("SET lock_configuration = true")
            except Exception:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def relation(self) -> duckdb.DuckDBPyRelation | None:
        """Every staged row (partition columns included), or None when no file was staged."""
        if not self.files:
            return None
        if self._relation is None and self._store is not None:
            self._relation = self._connect().from_arrow(self._store_dataset())
            self._relation.create_view("staged")
        if self._relation is None:
            conn = self._connect()
            reader = self.READERS.get(self.manifest.file_format)
            if reader is None:
                raise AuditError(
                    f"audit checks cannot read {self.manifest.file_format} files (DuckDB reads "
                    f"{', '.join(self.READERS)} here); use a row-count check or a callable that reads them"
                )
            duckdb = _duckdb()
            data = conn.sql(f"SELECT * FROM {reader}", params={"files": self.files})  # noqa: S608 - a constant
            columns = list(dict.fromkeys(c for pairs in self._partitions for c, _ in pairs))
            if columns:
                # Directories win over a same-named column in a file (Hive's rule).
                keep = [duckdb.ColumnExpression(c) for c in data.columns if c not in columns]
                data = data.project(*keep)
                values = {c: [dict(p).get(c) for p in self._partitions] for c in columns}
                table = {
                    _FILE_COLUMN: self.files,
                    # The values, not the directory text: %XX unescaped, the NULL directory as NULL.
                    **{
                        c: [None if v is None else partition_value(v) for v in vs] for c, vs in values.items()
                    },
                }
                partitions = conn.from_arrow(
                    pa.table({k: pa.array(v, type=pa.string()) for k, v in table.items()})
                )
                data = data.join(partitions, _FILE_COLUMN)
            self._relation = data.project(
                *(duckdb.ColumnExpression(c) for c in data.columns if c != _FILE_COLUMN)
            )
            self._relation.create_view("staged")
        return self._relation

    def _store_dataset(self) -> Any:
        """A pyarrow dataset of the staged files on the store, partition columns from their directories
        (as the local reader: VARCHAR, Hive's null marker as NULL; a same-named column in a file is
        dropped, the directory wins). DuckDB scans it lazily, pushing projections and filters down."""
        import pyarrow.dataset as ds

        from airflow_provider_walsink.core.protocol.file_schema import arrow_schema

        assert self._store is not None
        staging, location = self._store
        if self.manifest.file_format != "parquet":
            raise AuditError(
                f"audit checks read parquet files from an object store, not {self.manifest.file_format}; "
                "use a row-count check or a callable that reads them"
            )
        columns = list(dict.fromkeys(c for pairs in self._partitions for c, _ in pairs))
        if self.manifest.file_schema is not None:
            file_schema = arrow_schema(self.manifest.file_schema)
        else:  # files with different schemas: their union, by name (each footer read once)
            probe = ds.dataset(self.files, filesystem=staging.filesystem, format="parquet")
            file_schema = pa.unify_schemas([f.physical_schema for f in probe.get_fragments()])
        fields = [f for f in file_schema if f.name not in columns]
        partition_schema = pa.schema([(c, pa.string()) for c in columns])
        return ds.dataset(
            self.files,
            schema=pa.schema(fields + list(partition_schema)),
            filesystem=staging.filesystem,
            format="parquet",
            # pyarrow decodes %XX in a directory (segment_encoding="uri"), as partition_value does.
            partitioning=ds.HivePartitioning(partition_schema, null_fallback=HIVE_NULL) if columns else None,
            partition_base_dir=location.path,
        )

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = self._relation = None

    def __enter__(self) -> StagedData:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AuditCheck(abc.ABC):
    """One check of a sealed attempt's staged data, run by :func:`run_checks`.

    Contract: :meth:`run` reads the data only through the :class:`StagedData`
    it is given (never a path of its own), changes nothing, and returns a
    :class:`CheckResult` named :attr:`name` whose ``reason`` says, in one
    sentence a user can act on, what it found (``3 of 1,000 rows are NULL``).
    A check that cannot judge the data (unsupported format, missing counts,
    a query error) raises instead of failing it: then no verdict is recorded.
    Checks are built when the DAG is parsed and must be cheap to build;
    identifiers are quoted, never pasted into SQL.
    """

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """How the check is named in results, the UI and the checkpoint's error."""

    @abc.abstractmethod
    def run(self, staged: StagedData) -> CheckResult:
        """Judge the staged data (see the class docstring)."""

    def _result(self, passed: bool, reason: str) -> CheckResult:
        return CheckResult(_cut(self.name, 200), passed, _cut(reason))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class RowCountCheck(AuditCheck):
    """The attempt's row count lies within ``[min_rows, max_rows]`` (either bound optional).

    Read from the manifest's totals (no data is read); raises
    :class:`AuditError` if the writer did not count the rows of a committable.
    """

    def __init__(self, min_rows: int | None = None, max_rows: int | None = None) -> None:
        for label, bound in (("min_rows", min_rows), ("max_rows", max_rows)):
            if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool) or bound < 0):
                raise ValueError(f"RowCountCheck: {label} must be a non-negative integer, got {bound!r}")
        if min_rows is None and max_rows is None:
            raise ValueError("RowCountCheck needs min_rows, max_rows or both")
        if min_rows is not None and max_rows is not None and min_rows > max_rows:
            raise ValueError(f"RowCountCheck: min_rows {min_rows} is above max_rows {max_rows}")
        self.min_rows, self.max_rows = min_rows, max_rows

    @property
    def name(self) -> str:
        bounds = [f"{k}={v:,}" for k, v in (("min", self.min_rows), ("max", self.max_rows)) if v is not None]
        return f"row_count({', '.join(bounds)})"

    def run(self, staged: StagedData) -> CheckResult:
        rows = staged.total_rows
        if rows is None:
            unknown = [c.path for c in staged.manifest.committables if c.rows is None]
            raise AuditError(
                f"{self.name}: the manifest has no row count for {len(unknown)} committable(s) "
                f"({', '.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''}); the writer did not count them"
            )
        if self.min_rows is not None and rows < self.min_rows:
            return self._result(False, f"{_rows(rows)}, fewer than the minimum {self.min_rows:,}")
        if self.max_rows is not None and rows > self.max_rows:
            return self._result(False, f"{_rows(rows)}, more than the maximum {self.max_rows:,}")
        return self._result(True, f"{_rows(rows)}, within bounds")


class NotNullCheck(AuditCheck):
    """No row has NULL in any of ``columns`` (partition columns included); a column
    missing from the staged data fails the check."""

    def __init__(self, *columns: str) -> None:
        if len(columns) == 1 and not isinstance(columns[0], str) and isinstance(columns[0], Iterable):
            columns = tuple(columns[0])
        if not columns or not all(isinstance(c, str) and c for c in columns):
            raise ValueError(f"NotNullCheck needs one or more column names, got {columns!r}")
        self.columns = tuple(dict.fromkeys(columns))

    @property
    def name(self) -> str:
        return f"not_null({', '.join(self.columns)})"

    def run(self, staged: StagedData) -> CheckResult:
        relation = staged.relation()
        if relation is None:
            return self._result(True, "no rows staged")
        present = {c.casefold() for c in relation.columns}  # SQL names match regardless of case
        missing = [c for c in self.columns if c.casefold() not in present]
        if missing:
            return self._result(
                False,
                f"column{'s' if len(missing) > 1 else ''} {', '.join(missing)} not in the staged data "
                f"(columns: {', '.join(relation.columns)})",
            )
        duckdb = _duckdb()
        counts = relation.aggregate(
            [duckdb.FunctionExpression("count_star")]
            + [duckdb.FunctionExpression("count", duckdb.ColumnExpression(c)) for c in self.columns]
        ).fetchall()[0]
        total, present = counts[0], counts[1:]
        nulls = [(c, total - n) for c, n in zip(self.columns, present, strict=True) if total - n]
        if not nulls:
            return self._result(True, f"no NULL in {_rows(total)}")
        if len(self.columns) == 1:
            return self._result(False, f"{nulls[0][1]:,} of {_rows(total)} are NULL")
        return self._result(False, "; ".join(f"{c}: {n:,} of {_rows(total)} are NULL" for c, n in nulls))


class SqlPredicateCheck(AuditCheck):
    """A SQL predicate (DuckDB dialect) that must hold for **every** staged row.

    A row fails when the predicate is not TRUE for it (FALSE or NULL: stricter
    than a SQL CHECK constraint, which lets NULL pass; write ``x IS NULL OR
    x >= 0`` to allow NULL). Columns are the staged data's plus the partition
    columns (VARCHAR). The predicate must be one expression: it is parsed when
    the check is built (a syntax error fails the DAG's parse, not a run) and
    applied as an expression, never pasted into a statement; it runs in the
    audit's DuckDB connection, which cannot read any file but the staged ones.
    """

    def __init__(self, predicate: str, *, name: str | None = None) -> None:
        if not isinstance(predicate, str) or not predicate.strip():
            raise ValueError(f"SqlPredicateCheck needs a SQL predicate, got {predicate!r}")
        duckdb = _duckdb()
        try:
            duckdb.SQLExpression(predicate)
        except duckdb.Error as exc:
            raise ValueError(f"SqlPredicateCheck: {predicate!r} is not one SQL expression: {exc}") from None
        self.predicate = predicate.strip()
        self._name = name

    @property
    def name(self) -> str:
        return self._name or f"sql({_cut(self.predicate, 120)})"

    def run(self, staged: StagedData) -> CheckResult:
        relation = staged.relation()
        if relation is None:
            return self._result(True, "no rows staged")
        duckdb = _duckdb()
        holds = duckdb.SQLExpression(self.predicate)
        not_true = duckdb.CaseExpression(holds, duckdb.ConstantExpression(False)).otherwise(
            duckdb.ConstantExpression(True)
        )
        count_if = duckdb.FunctionExpression("count_if", not_true)
        total, failing = relation.aggregate([duckdb.FunctionExpression("count_star"), count_if]).fetchall()[0]
        where = f" `{_cut(self.predicate, 120)}`" if self._name else ""
        if failing:
            return self._result(False, f"{failing:,} of {_rows(total)} do not satisfy{where or ' it'}")
        return self._result(True, f"all {_rows(total)} satisfy{where or ' it'}")


#: What a user callable may return: a bool, ``(passed, reason)`` or a CheckResult.
CallableOutcome = bool | tuple[bool, str] | CheckResult


class CallableCheck(AuditCheck):
    """A user function ``fn(staged: StagedData)`` judging the data.

    It returns ``True``/``False``, ``(passed, reason)`` or a
    :class:`CheckResult`; it reads through ``staged`` (``staged.relation()``,
    ``staged.connection().sql("... FROM staged ...")``, ``staged.manifest``).
    An exception it raises is an error, not a verdict (nothing is recorded).
    """

    def __init__(self, fn: Callable[[StagedData], CallableOutcome], *, name: str | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"CallableCheck needs a callable, got {type(fn).__name__}")
        self.fn = fn
        self._name = name or getattr(fn, "__name__", None) or type(fn).__name__

    @property
    def name(self) -> str:
        return self._name

    def run(self, staged: StagedData) -> CheckResult:
        out = self.fn(staged)
        if isinstance(out, CheckResult):
            return out
        if isinstance(out, bool):
            return self._result(out, "passed" if out else "returned False")
        if isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], bool) and isinstance(out[1], str):
            return self._result(out[0], out[1] or ("passed" if out[0] else "returned False"))
        raise AuditError(
            f"audit callable {self.name} returned {type(out).__name__}; return True/False, "
            "(passed, reason) or a CheckResult"
        )


def as_checks(checks: Sequence[AuditCheck | Callable[..., Any]]) -> list[AuditCheck]:
    """The checks of ``audit=[...]``: check objects, and bare callables wrapped in :class:`CallableCheck`."""
    if isinstance(checks, AuditCheck) or callable(checks):
        checks = [checks]  # type: ignore[list-item]
    out = []
    for item in checks:
        if isinstance(item, AuditCheck):
            out.append(item)
        elif callable(item):
            out.append(CallableCheck(item))
        else:
            raise TypeError(f"an audit check must be an AuditCheck or a callable, got {item!r}")
    if not out:
        raise ValueError("an audit needs at least one check")
    names = [c.name for c in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(
            f"audit checks need distinct names; {', '.join(twice)} appear(s) twice (pass name=...)"
        )
    return out


@dataclass(frozen=True)
class AuditReport:
    """Every check's result on one sealed attempt."""

    attempt_id: str
    results: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if not r.passed]

    @property
    def reason(self) -> str:
        """The failed checks, ``; ``-separated (the REJECTED checkpoint's ``error``)."""
        return "; ".join(str(r) for r in self.failures)

    @property
    def summary(self) -> str:
        n = len(self.results)
        if self.passed:
            return f"all {n} audit check{'s' if n != 1 else ''} passed"
        return f"{len(self.failures)} of {n} audit check{'s' if n != 1 else ''} failed: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {
            "audit": {
                "attempt_id": self.attempt_id,
                "passed": self.passed,
                "summary": _cut(self.summary, 1000),
                "checks": [r.to_json() for r in self.results],
            }
        }

    def to_detail(self) -> str:
        """JSON for the history's ``detail``: every result, or, if too long, the failures."""
        doc = self.to_json()
        text = json.dumps(doc, ensure_ascii=False)
        if len(text) > _DETAIL_LIMIT:
            failures = [r.to_json() for r in self.failures]
            doc["audit"]["checks"] = failures
            doc["audit"]["passed_not_listed"] = len(self.results) - len(failures)
            while len(text := json.dumps(doc, ensure_ascii=False)) > _DETAIL_LIMIT and doc["audit"]["checks"]:
                doc["audit"]["checks"].pop()
        return text

    @classmethod
    def from_detail(cls, detail: str | None) -> dict[str, Any] | None:
        """The ``audit`` document of a history ``detail`` (None if it holds none)."""
        if not detail or not detail.startswith("{"):
            return None
        try:
            doc = json.loads(detail)
        except ValueError:
            return None
        audit = doc.get("audit") if isinstance(doc, dict) else None
        return audit if isinstance(audit, dict) and isinstance(audit.get("checks"), list) else None


def run_checks(checks: Sequence[AuditCheck], staged: StagedData) -> AuditReport:
    """Run every check on ``staged`` (all of them, in order); raises what a check raises."""
    return AuditReport(staged.manifest.attempt_id, tuple(check.run(staged) for check in checks))


@dataclass
class AuditOutcome:
    """What an audit run did, as returned to Airflow (XCom) or printed.

    ``verdict``: AUDITED or REJECTED (``None``: nothing to audit, the
    checkpoint is being or was committed); ``already``: the verdict was
    recorded by an earlier run, this one changed nothing.
    """

    pipeline: str
    checkpoint_key: str
    state: str
    verdict: str | None
    already: bool
    message: str
    attempt_id: str | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rejected(self) -> bool:
        return self.verdict == S.REJECTED.value

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def audit_checkpoint(
    store: CommitterStore,
    layout: StagingLayout | Callable[[], StagingLayout],
    pipeline: str,
    checkpoint_key: str,
    checks: Sequence[AuditCheck],
    *,
    actor: Actor,
    stores: Callable[[str], StagingStore] | None = None,
) -> AuditOutcome:
    """Audit a durable checkpoint's sealed attempt and record the verdict (see the module docstring).

    * DURABLE (or FAILED after it was durable): runs the checks, records
      AUDITED or REJECTED;
    * AUDITED or REJECTED already: changes nothing and says so (a REJECTED
      verdict stands until a new write attempt);
    * COMMITTING or COMMITTED: nothing to audit (``verdict`` None).

    Raises ``NotDurableError`` (not yet durable, or ABORTED), ``ManifestError``
    (the sealed manifest is missing or does not match), :class:`AuditError`
    or a check's own error (no verdict recorded), ``StaleAttemptError`` (a
    new attempt started while the checks ran: the verdict is about old data
    and was not recorded). Repeating it is safe.

    The staged data is read under the checkpoint's recorded staging root;
    ``layout`` (or the function giving it) only for a row that records none.
    A checkpoint staged on an object store is read through ``stores(root)``
    (the store opened with its credentials, as the durability check opened
    it; Parquet only); without ``stores`` it raises :class:`AuditError` (no
    verdict recorded).
    """
    record = store.require(pipeline, checkpoint_key)
    name = f"checkpoint {pipeline}/{checkpoint_key}"

    def outcome(state: CheckpointState, verdict: CheckpointState | None, already: bool, message: str, **kw):
        return AuditOutcome(
            pipeline,
            checkpoint_key,
            state.value,
            verdict.value if verdict else None,
            already,
            message,
            attempt_id=record.sealed_attempt_id,
            **kw,
        )

    if record.state in (S.COMMITTING, S.COMMITTED):
        return outcome(record.state, None, True, f"{name} is {record.state}: nothing left to audit")
    if record.state is S.AUDITED:
        return outcome(
            record.state, S.AUDITED, True, f"{name} attempt {record.sealed_attempt} was already AUDITED"
        )
    if record.state is S.REJECTED:
        return outcome(record.state, S.REJECTED, True, f"{name} was already REJECTED: {record.error}")
    if record.state is not S.DURABLE and not (record.state is S.FAILED and record.durable_at):
        raise NotDurableError(explain_not_committable(record))
    if stores is None and record.staging_root and is_object_store(record.staging_root):
        raise AuditError(
            f"{name} is staged on an object store ({record.staging_root}) and this audit was given no "
            "way to open it (stores=); the audit task opens it with the walsink connection's staging "
            "credentials"
        )
    manifest, attempt = read_sealed_attempt(as_store(staging_for(record, layout, stores)), record)
    staged_data = StagedData.of(attempt, manifest)
    with staged_data as staged:
        report = run_checks(checks, staged)
    if report.passed:
        done = store.mark_audited(
            pipeline, checkpoint_key, attempt_id=manifest.attempt_id, actor=actor, detail=report.to_detail()
        )
        verdict = S.AUDITED
    else:
        done = store.reject(
            pipeline,
            checkpoint_key,
            attempt_id=manifest.attempt_id,
            reason=report.reason,
            actor=actor,
            detail=report.to_detail(),
        )
        verdict = S.REJECTED
    return outcome(
        done.state,
        verdict,
        False,
        f"{name} attempt {manifest.attempt}: {report.summary}",
        checks=[r.to_json() for r in report.results],
    )
