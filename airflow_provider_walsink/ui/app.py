"""The commit-state FastAPI app, mounted by the plugin in Airflow's api-server at ``/walsink``.

JSON API (``/walsink/api/...``) and server-rendered pages (Jinja2, autoescape
on, no JavaScript, no CDN) over the committer table, read through the same
:class:`~airflow_provider_walsink.core.store.store.CommitterStore` the tasks use
(``WalsinkHook(conn_id).get_store()``; the connection id is
``[walsink] ui_conn_id``, default ``walsink_default``).

Security: Airflow does not authenticate plugin apps, so *every* route here,
static files included, depends on ``GetUserDep`` (401 without a valid bearer
token or ``_token`` cookie) and filters or refuses pipelines by per-DAG read
access (see :mod:`.access`).
"""

from __future__ import annotations

import functools
import re
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode, urlsplit

from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from airflow.configuration import conf
from fastapi import Depends, FastAPI, Form, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from pydantic import BaseModel, Field
from sqlalchemy import select

from airflow_provider_walsink.core.commit.abort import AbortOutcome, AbortRefusedError
from airflow_provider_walsink.core.protocol.errors import WalsinkError
from airflow_provider_walsink.core.protocol.partition_keys import checkpoint_keys_named_by
from airflow_provider_walsink.core.runners import describe_job_ref
from airflow_provider_walsink.core.staging.layout import StagingLayout
from airflow_provider_walsink.core.staging.object_store import StagingStore
from airflow_provider_walsink.core.staging.resolve import as_store, staging_for
from airflow_provider_walsink.core.store.records import Actor, CheckpointRecord
from airflow_provider_walsink.core.store.store import CommitterStore, utcnow
from airflow_provider_walsink.hooks.walsink import WalsinkHook

from . import views
from .access import may_edit, require_edit, require_pipeline, visible

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
_STATIC_TYPES = {".css": "text/css", ".svg": "image/svg+xml", ".png": "image/png"}
_STATIC_NAME = re.compile(r"[A-Za-z0-9_-]+\.(css|svg|png)")
MAX_PAGE = 500
#: Pipelines per overview page (API and page), unless ``limit`` says otherwise.
PIPELINE_PAGE = 100
#: States whose checkpoint an editor may abort (COMMITTED data is in the target; ABORTED is done).
ABORTABLE = frozenset(s for s in views.STATE_ORDER if s not in ("COMMITTED", "ABORTED", "SUPERSEDED"))
MAX_REASON = 2000

StateFilter = Annotated[list[str] | None, Query(description="Only these states (repeatable)")]
AgeFilter = Annotated[
    str | None,
    Query(
        description="Only checkpoints not committed (nor aborted) for longer than this since they were "
        "registered: 90s, 15m, 12h, 7d, 2w"
    ),
]


def _registered_before(not_committed_for: str | None) -> datetime | None:
    """The cut-off of a "not committed for longer than" filter (naive UTC, as stored); 422 if unreadable."""
    if not not_committed_for:
        return None
    try:
        age = views.parse_age(not_committed_for)
    except ValueError as exc:
        raise HTTPException(422, f"not_committed_for: {exc}") from None
    return utcnow() - age


def conn_id() -> str:
    return conf.get("walsink", "ui_conn_id", fallback=WalsinkHook.default_conn_name)


#: How long a resolved connection is reused: a request must not cost a connection
#: lookup (secrets backends, metadata DB), yet an edited connection is picked up soon.
HOOK_TTL_S = 60.0
_hooks: dict[str, tuple[float, WalsinkHook]] = {}
_hooks_lock = threading.Lock()


def _hook() -> WalsinkHook:
    name = conn_id()
    now = time.monotonic()
    with _hooks_lock:
        cached = _hooks.get(name)
        if cached is not None and cached[0] > now:
            return cached[1]
    hook = WalsinkHook(name)
    hook.sqlalchemy_url  # noqa: B018 - resolve the connection once, outside the lock
    with _hooks_lock:
        _hooks[name] = (now + HOOK_TTL_S, hook)
    return hook


def get_store() -> CommitterStore:
    """The committer store of the configured connection (one engine per URL and process)."""
    return _hook().get_store()


def _staging_of(record: CheckpointRecord) -> StagingStore:
    """The checkpoint's staging store: its recorded root (local, or an object store opened with
    the walsink connection's staging credentials, never the process environment)."""
    hook = _hook()
    return as_store(staging_for(record, get_layout, hook.get_staging_store))


def get_layout() -> StagingLayout:
    """The connection's staging layout: where checkpoints whose rows record no root were staged."""
    return _hook().get_layout()


StoreDep = Annotated[CommitterStore, Depends(get_store)]


@functools.cache
def templates() -> Environment:
    # autoescape for every template: pipeline ids, error messages, paths and
    # lease holders are user-controlled text.
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    env.filters["duration"] = _duration
    env.filters["count"] = lambda v: "–" if v is None else f"{v:,}"
    env.filters["size"] = _size
    env.filters["plural"] = views.plural
    env.filters["kv"] = views.key_values
    env.filters["partition"] = views.partition_as_written
    env.filters["local"] = local_time
    env.filters["job"] = describe_job_ref
    env.globals["STATES"] = views.STATE_ORDER
    env.globals["FAILURES"] = views.FAILURE_STATES
    env.globals["q"] = quote  # URL path segments (macros see globals, not the render context)
    return env


def display_timezone() -> Any:
    """Airflow's ``[core] default_timezone`` (``system`` is the server's own zone), read per
    request through Airflow's conf, so the pages show times as the rest of the Airflow UI."""
    import pendulum

    name = conf.get("core", "default_timezone", fallback="utc") or "utc"
    try:
        return pendulum.local_timezone() if name.strip().lower() == "system" else pendulum.timezone(name)
    except Exception:  # noqa: BLE001 - Airflow itself refuses to start with a bad zone; be safe here
        return pendulum.timezone("UTC")


def local_time(iso: str | None) -> str:
    """An ISO UTC timestamp (as the API returns it) in the configured zone, to the second,
    with the zone's abbreviation or offset: ``2026-01-03 05:30:00 IST``."""
    if not iso:
        return "–"
    import pendulum

    moment = pendulum.parse(iso).in_timezone(display_timezone())
    abbreviation = moment.format("zz")
    suffix = abbreviation if abbreviation and abbreviation[0] not in "+-" else moment.format("Z")
    return f"{moment.format('YYYY-MM-DD HH:mm:ss')} {suffix}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _size(n: int | None) -> str:
    if n is None:
        return "–"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _json(payload: Any) -> JSONResponse:
    """Already JSON-native payloads (ISO strings, ints, dicts): skip FastAPI's
    ``jsonable_encoder``, which costs more than the query on a 100-row page."""
    return JSONResponse(payload)


def _pipeline_or_404(store: CommitterStore, user: Any, pipeline: str) -> dict[str, Any]:
    row = store.get_pipeline(pipeline)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "Pipeline not found")
    require_pipeline(user, pipeline, views.pipeline_writers(store, [pipeline]).get(pipeline, set()))
    return row


def known_dag(dag_id: str, session: SessionDep) -> None:
    """404 for a DAG id Airflow does not know (a typo must not look like "no checkpoints")."""
    from airflow.models.dag import DagModel

    if session.get(DagModel, dag_id) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"DAG {dag_id!r} not found")


def _page(
    store: CommitterStore,
    pipeline: str,
    states: list[str] | None,
    before: int | None,
    after: int | None,
    limit: int,
    not_committed_for: str | None = None,
) -> dict[str, Any]:
    """One keyset page, newest first (or oldest first after ``after``), plus the next cursors."""
    bad = sorted(set(states or ()) - set(views.STATE_ORDER))
    if bad:
        raise HTTPException(422, f"Unknown state(s): {', '.join(bad)}")
    descending = after is None
    cutoff = _registered_before(not_committed_for)
    records = store.checkpoints(
        pipeline,
        states=states or None,
        before_sequence=before,
        after_sequence=after,
        limit=limit + 1,
        descending=descending,
        registered_before=cutoff,
    )
    more = len(records) > limit
    records = records[:limit]
    if not descending:
        records.reverse()  # pages always read newest first
    # Cursors from the rows read (the version filter below may leave fewer on the page).
    newest = records[0].sequence if records else None
    oldest = records[-1].sequence if records else None
    items = views.checkpoint_dicts(store, _uncommitted_since(store, records, cutoff))
    return {
        "checkpoints": items,
        # Older page: strictly below the oldest row shown; newer page: strictly above the newest.
        "next_before": oldest if (more or not descending) and oldest is not None else None,
        "next_after": newest if (before is not None or (after is not None and more)) else None,
    }


def _uncommitted(
    store: CommitterStore, user: Any, not_committed_for: str | None, limit: int
) -> list[dict[str, Any]]:
    """The oldest ``limit`` checkpoints not committed of the pipelines the user may read.

    Reads the open checkpoints of every pipeline oldest first, page by page (keyset), and
    decides access only for the pipelines those pages hold: the cost follows what is open,
    not the number of pipelines or the history.
    """
    cutoff = _registered_before(not_committed_for)
    found: list[Any] = []
    decided: dict[str, bool] = {}
    cursor = None
    while len(found) < limit:
        batch = store.uncommitted(None, registered_before=cutoff, limit=limit, after=cursor)
        undecided = sorted({r.pipeline for r in batch} - decided.keys())
        if undecided:
            allowed = visible(user, views.pipeline_writers(store, undecided))
            decided.update({name: name in allowed for name in undecided})
        found += [r for r in batch if decided[r.pipeline]]
        if len(batch) < limit:
            break
        cursor = (batch[-1].created_at, batch[-1].pipeline, batch[-1].sequence)
    return views.checkpoint_dicts(store, _uncommitted_since(store, found[:limit], cutoff))


def _uncommitted_since(store: CommitterStore, records: list[Any], cutoff: datetime | None) -> list[Any]:
    """Drop reprocessed checkpoints whose current version began after ``cutoff``: a version
    begun a minute ago is not "not committed for longer than an hour" (its registration
    may be months old, and its earlier version is still the published one)."""
    if cutoff is None:
        return records
    starts = store.version_starts([r.id for r in records if r.version > 1])
    return [r for r in records if starts.get(r.id, r.created_at) <= cutoff]


def _visible_pipelines(
    store: CommitterStore, user: Any, *, after: str | None = None, limit: int = PIPELINE_PAGE
) -> tuple[list[dict[str, Any]], str | None]:
    """One keyset page of the pipelines the user may read, in name order after ``after``,
    and the cursor of the next page (``None`` on the last one).

    Reads pipeline rows in batches by primary key and decides access per batch, so a page
    costs the same at any depth and with any number of pipelines the user may not see;
    only the page's pipelines are summarised.
    """
    shown: list[dict[str, Any]] = []
    cursor = after
    more = False
    while True:
        batch = store.pipeline_page(after=cursor, limit=limit + 1)
        if not batch:
            break
        allowed = visible(user, views.pipeline_writers(store, [r["name"] for r in batch]))
        for row in batch:
            if row["name"] not in allowed:
                cursor = row["name"]
                continue
            if len(shown) == limit:
                more = True  # a further readable pipeline exists: there is a next page
                break
            shown.append(row)
            cursor = row["name"]
        if more or len(batch) <= limit:
            break
    next_after = shown[-1]["name"] if more and shown else None
    return views.pipeline_dicts(store, shown), next_after


def _named_checkpoint(store: CommitterStore, pipeline: str, given: str) -> CheckpointRecord | None:
    """The checkpoint ``given`` names: its exact key, else (a run's partition key as written,
    ``münchen-ü``) its encoded checkpoint key; an exact key always wins, nothing is guessed."""
    for key in checkpoint_keys_named_by(given):
        if (record := store.get(pipeline, key)) is not None:
            return record
    return None


#: Airflow task states in which a human-in-the-loop task waits for a person's answer: parked
#: (Airflow 3.3) or deferred to its trigger (the HITL operators of Airflow 3.1 and 3.2).
_AWAITING_A_PERSON = ("awaiting_input", "deferred")


def _decision(session: Any, record: CheckpointRecord, history: list[Any]) -> dict[str, Any] | None:
    """The question a person has yet to answer about this REJECTED checkpoint, or None.

    The committer table names the task that asked (:func:`views.decision_asked`); Airflow's own
    task instance says whether it still waits, so a question answered, timed out or abandoned
    (the task failed, the run was deleted) is never shown as waiting.
    """
    asked = views.decision_asked(record, history)
    if asked is None:
        return None
    from airflow.models.taskinstance import TaskInstance

    states = session.scalars(
        select(TaskInstance.state).where(
            TaskInstance.dag_id == asked.dag_id,
            TaskInstance.run_id == asked.run_id,
            TaskInstance.task_id == asked.task_id,
        )
    ).all()
    return views.decision_dict(asked) if any(s in _AWAITING_A_PERSON for s in states) else None


def _checkpoint_or_404(
    store: CommitterStore, user: Any, pipeline: str, given: str, session: Any
) -> dict[str, Any]:
    _pipeline_or_404(store, user, pipeline)
    record = _named_checkpoint(store, pipeline, given)
    if record is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "Checkpoint not found")
    key = record.checkpoint_key
    history = store.history(pipeline, key)
    transitions = [views.transition_dict(t) for t in history]
    version_phases = views.version_phases(history) if record.version > 1 else []
    started = store.version_starts([record.id]).get(record.id) if record.version > 1 else None
    return {
        "checkpoint": views.checkpoint_dict(
            record, waits=views.wait_context(store, [pipeline]), version_started_at=started
        ),
        # A reprocessed checkpoint: each version's own phases, oldest first (empty for a first version).
        "version_phases": version_phases,
        # The Airflow task try whose log says why it is where it is (a failure, a refusal, a wait).
        "log": views.log_link(history),
        # A person is asked in Airflow whether this REJECTED attempt is published anyway: which
        # task asks, since when, and the run's Required actions page to answer it (else None).
        "decision": _decision(session, record, history),
        # Under the root the write phase recorded; the connection's only for a row without one.
        "committables": views.committables(record, _staging_of(record)),
        "audit": views.audit_results(record, transitions),
        "history": transitions,
        "versions": [views.version_dict(v) for v in store.versions(pipeline, key)]
        if record.version > 1
        else [],
        "skipped_reruns": views.skipped_reruns(history),
    }


class AbortRequest(BaseModel):
    """``POST /api/pipelines/{pipeline}/checkpoints/{key}/abort``: why, and (optionally) which attempt."""

    reason: str = Field(min_length=1, max_length=MAX_REASON)
    #: The attempt the caller saw: the abort is refused (409) if the checkpoint moved on since.
    attempt: int | None = None


def _same_origin(request: Request) -> None:
    """A state-changing request from a page must come from this server's own pages.

    Airflow's ``_token`` cookie is ``SameSite=Lax`` (not sent with a cross-site
    POST); this also refuses a POST whose ``Origin`` names another site.
    """
    origin = request.headers.get("origin")
    if origin is None:
        return
    host = request.headers.get("x-forwarded-host") or request.headers.get("host")
    if origin == "null" or urlsplit(origin).netloc != host:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "Forbidden: cross-site request")


def _abort_checkpoint(
    store: CommitterStore,
    user: Any,
    session: Any,
    pipeline: str,
    key: str,
    reason: str,
    attempt: int | None,
) -> AbortOutcome:
    """The abort behind the button and the API: permission, the aborter, Airflow's audit log.

    Raises 403 (no edit right on the pipeline's DAGs), 404, 409 (not abortable,
    the checkpoint moved on since the caller looked, or refused: the target
    holds the attempt), 422 (no reason).
    """
    from airflow_provider_walsink.hooks.aborts import aborter_for, audit_extra, record_audit_log

    _pipeline_or_404(store, user, pipeline)
    require_edit(user, pipeline, views.pipeline_writers(store, [pipeline]).get(pipeline, set()))
    record = store.get(pipeline, key)
    if record is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "Checkpoint not found")
    reason = (reason or "").strip()
    if not reason:
        raise HTTPException(
            422, "Give a reason: it is recorded in the checkpoint's history and Airflow's audit log"
        )
    if record.state.value not in ABORTABLE:
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"Checkpoint {key} is {record.state.value}: nothing to abort"
        )
    if attempt is not None and attempt != record.attempt:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"Checkpoint {key} moved on to attempt {record.attempt} since the page showed attempt {attempt}; "
            "look again before aborting",
        )
    name = user.get_name()
    actor = Actor(name=f"{name} (walsink UI)")
    hook = _hook()
    refused: str | None = None
    outcome: AbortOutcome | None = None
    try:
        aborter = aborter_for(
            store, pipeline, staging_root=hook.staging_root, checkpoint_key=key, stores=hook.get_staging_store
        )
        outcome = aborter.abort(pipeline, key, reason=reason[:MAX_REASON], actor=actor)
    except AbortRefusedError as exc:
        refused = str(exc)
    except WalsinkError as exc:  # COMMITTED meanwhile, a committer took it, a target that cannot load
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    record_audit_log(
        dag_id=record.dag_id or (store.get_pipeline(pipeline) or {}).get("dag_id"),
        run_id=record.run_id,
        owner=name,
        extra=audit_extra(
            pipeline=pipeline,
            checkpoint_key=key,
            reason=reason,
            source="walsink UI",
            outcome=outcome.to_dict() if outcome else None,
            refused=refused,
        ),
        session=session,
    )
    session.commit()  # also when the refusal below ends the request (an error rolls the session back)
    if refused is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, refused)
    assert outcome is not None
    return outcome


def _abort_form(user: Any, store: CommitterStore, record: dict[str, Any]) -> dict[str, Any] | None:
    """What the checkpoint page needs for its Abort button, or None when this user gets none."""
    if record["state"] not in ABORTABLE:
        return None
    writers = views.pipeline_writers(store, [record["pipeline"]]).get(record["pipeline"], set())
    if not may_edit(user, writers):
        return None
    return {"attempt": record["attempt"], "max_reason": MAX_REASON}


def create_app() -> FastAPI:
    app = FastAPI(
        title="walsink commit state",
        description="Checkpoints of walsink pipelines: written, durable, committed or stuck, and why.",
        # Same-origin iframe pages; no docs UI (it would need a CDN and bypass nothing useful).
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    # ------------------------------------------------------------------ JSON API

    @app.get("/api/pipelines")
    def api_pipelines(
        user: GetUserDep,
        store: StoreDep,
        after: Annotated[
            str | None, Query(description="Only pipelines whose name sorts after this (the next page)")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = PIPELINE_PAGE,
    ) -> JSONResponse:
        """A page of the pipelines the user may read, in name order, with counts per state,
        latest commit and last error; ``next_after`` is the next page's cursor (null: last)."""
        items, next_after = _visible_pipelines(store, user, after=after, limit=limit)
        return _json({"pipelines": items, "total_entries": len(items), "next_after": next_after})

    @app.get("/api/pipelines/{pipeline}")
    def api_pipeline(pipeline: str, user: GetUserDep, store: StoreDep) -> JSONResponse:
        return _json(views.pipeline_dict(store, _pipeline_or_404(store, user, pipeline)))

    @app.get("/api/pipelines/{pipeline}/checkpoints")
    def api_checkpoints(
        pipeline: str,
        user: GetUserDep,
        store: StoreDep,
        state: StateFilter = None,
        before: Annotated[int | None, Query(description="Only sequences below (older page)")] = None,
        after: Annotated[int | None, Query(description="Only sequences above (newer page)")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
        not_committed_for: AgeFilter = None,
    ) -> JSONResponse:
        """A page of checkpoints, newest first, keyset-paginated by sequence."""
        _pipeline_or_404(store, user, pipeline)
        return _json(_page(store, pipeline, state, before, after, limit, not_committed_for))

    @app.get("/api/checkpoints")
    def api_uncommitted(
        user: GetUserDep,
        store: StoreDep,
        not_committed_for: AgeFilter = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
    ) -> JSONResponse:
        """Checkpoints of every pipeline the user may read that are neither committed nor aborted
        (for longer than ``not_committed_for``), oldest registration first: what is stuck."""
        return _json({"checkpoints": _uncommitted(store, user, not_committed_for, limit)})

    @app.get("/api/pipelines/{pipeline}/checkpoints/{checkpoint_key}")
    def api_checkpoint(
        pipeline: str, checkpoint_key: str, user: GetUserDep, store: StoreDep, session: SessionDep
    ) -> JSONResponse:
        """One checkpoint with its committables (from the sealed manifest) and transition history."""
        return _json(_checkpoint_or_404(store, user, pipeline, checkpoint_key, session))

    @app.get("/api/pipelines/{pipeline}/checkpoints/{checkpoint_key}/committables")
    def api_committables(
        pipeline: str, checkpoint_key: str, user: GetUserDep, store: StoreDep, session: SessionDep
    ) -> JSONResponse:
        return _json(_checkpoint_or_404(store, user, pipeline, checkpoint_key, session)["committables"])

    @app.get("/api/pipelines/{pipeline}/checkpoints/{checkpoint_key}/history")
    def api_history(pipeline: str, checkpoint_key: str, user: GetUserDep, store: StoreDep) -> JSONResponse:
        _pipeline_or_404(store, user, pipeline)
        if (record := _named_checkpoint(store, pipeline, checkpoint_key)) is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, "Checkpoint not found")
        return _json(
            {
                "transitions": [
                    views.transition_dict(t) for t in store.history(pipeline, record.checkpoint_key)
                ]
            }
        )

    @app.post("/api/pipelines/{pipeline}/checkpoints/{checkpoint_key}/abort")
    def api_abort(
        pipeline: str,
        checkpoint_key: str,
        body: AbortRequest,
        request: Request,
        user: GetUserDep,
        store: StoreDep,
        session: SessionDep,
    ) -> JSONResponse:
        """Abort the checkpoint's current attempt (edit right on its DAGs); recorded in the audit log."""
        _same_origin(request)
        outcome = _abort_checkpoint(store, user, session, pipeline, checkpoint_key, body.reason, body.attempt)
        return _json(outcome.to_dict())

    @app.get(
        "/api/dags/{dag_id}/checkpoints",
        dependencies=[Depends(requires_access_dag("GET")), Depends(known_dag)],
    )
    def api_dag_checkpoints(
        dag_id: str,
        store: StoreDep,
        run_id: str | None = None,
        limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
    ) -> JSONResponse:
        """Checkpoints registered by a DAG, or by one of its runs (the DAG and run tabs)."""
        records = store.checkpoints_of_run(dag_id, run_id, limit=limit)
        return _json({"checkpoints": views.checkpoint_dicts(store, records)})

    # ------------------------------------------------------------------ pages

    def render(request: Request, template: str, **values: Any) -> HTMLResponse:
        base = request.scope.get("root_path", "").rstrip("/")
        html = templates().get_template(template).render(base=base, **values)
        return HTMLResponse(html)

    @app.get("/", response_class=HTMLResponse)
    def page_overview(
        request: Request,
        user: GetUserDep,
        store: StoreDep,
        not_committed_for: AgeFilter = None,
        after: str | None = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = PIPELINE_PAGE,
    ) -> HTMLResponse:
        pipelines, next_after = _visible_pipelines(store, user, after=after, limit=limit)
        keep = [("not_committed_for", not_committed_for)] if not_committed_for else []
        if limit != PIPELINE_PAGE:
            keep.append(("limit", str(limit)))
        return render(
            request,
            "overview.html",
            pipelines=pipelines,
            # Keyset pages of pipelines: the next one, and back to the first.
            more_pipelines=urlencode([*keep, ("after", next_after)]) if next_after else None,
            first_pipelines=urlencode(keep) if after else None,
            uncommitted=_uncommitted(store, user, not_committed_for, MAX_PAGE),
            not_committed_for=not_committed_for or "",
            age_choices=views.AGE_CHOICES,
        )

    @app.get("/pipelines/{pipeline}", response_class=HTMLResponse)
    def page_pipeline(
        request: Request,
        pipeline: str,
        user: GetUserDep,
        store: StoreDep,
        state: StateFilter = None,
        before: int | None = None,
        after: int | None = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 200,
        not_committed_for: AgeFilter = None,
    ) -> HTMLResponse:
        row = _pipeline_or_404(store, user, pipeline)
        page = _page(store, pipeline, state, before, after, limit, not_committed_for)
        filters = [("state", s) for s in state or ()]
        if not_committed_for:
            filters.append(("not_committed_for", not_committed_for))
        return render(
            request,
            "pipeline.html",
            pipeline=views.pipeline_dict(store, row),
            page=page,
            timeline=views.timeline_order(page["checkpoints"]),
            selected_states=state or [],
            not_committed_for=not_committed_for or "",
            age_choices=views.AGE_CHOICES,
            older=urlencode([*filters, ("before", page["next_before"])]) if page["next_before"] else None,
            newer=urlencode([*filters, ("after", page["next_after"])]) if page["next_after"] else None,
        )

    @app.get("/pipelines/{pipeline}/find")
    def page_find(request: Request, pipeline: str, key: str, user: GetUserDep, store: StoreDep) -> Response:
        """The pipeline page's search: a checkpoint by its key, or by the run's partition key as written."""
        _pipeline_or_404(store, user, pipeline)
        record = _named_checkpoint(store, pipeline, key.strip())
        if record is None:
            tried = " or ".join(repr(k) for k in checkpoint_keys_named_by(key.strip()))
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"Pipeline {pipeline!r} has no checkpoint {tried}")
        base = request.scope.get("root_path", "").rstrip("/")
        return RedirectResponse(
            f"{base}/pipelines/{quote(pipeline)}/checkpoints/{quote(record.checkpoint_key)}",
            status_code=status.HTTP_303_SEE_OTHER,
        )

    @app.get("/pipelines/{pipeline}/checkpoints/{checkpoint_key}", response_class=HTMLResponse)
    def page_checkpoint(
        request: Request,
        pipeline: str,
        checkpoint_key: str,
        user: GetUserDep,
        store: StoreDep,
        session: SessionDep,
    ) -> HTMLResponse:
        data = _checkpoint_or_404(store, user, pipeline, checkpoint_key, session)
        return render(request, "checkpoint.html", **data, abort=_abort_form(user, store, data["checkpoint"]))

    @app.get("/pipelines/{pipeline}/checkpoints/{checkpoint_key}/log")
    def page_log(
        request: Request, pipeline: str, checkpoint_key: str, user: GetUserDep, store: StoreDep
    ) -> Response:
        """From a checkpoint to the Airflow log of the task try that failed, refused or waited on it."""
        _pipeline_or_404(store, user, pipeline)
        if (record := _named_checkpoint(store, pipeline, checkpoint_key)) is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, "Checkpoint not found")
        link = views.log_link(store.history(pipeline, record.checkpoint_key))
        if link is None:
            raise HTTPException(
                status.HTTP_404_NOT_FOUND,
                f"No Airflow task is recorded on checkpoint {checkpoint_key} (written outside Airflow, or "
                "its history was trimmed by retention): see `walsink history` for what is recorded",
            )
        return RedirectResponse(link["url"], status_code=status.HTTP_303_SEE_OTHER)

    @app.post("/pipelines/{pipeline}/checkpoints/{checkpoint_key}/abort", response_class=HTMLResponse)
    def page_abort(
        request: Request,
        pipeline: str,
        checkpoint_key: str,
        user: GetUserDep,
        store: StoreDep,
        session: SessionDep,
        reason: Annotated[str, Form(max_length=MAX_REASON)] = "",
        confirm: Annotated[str | None, Form()] = None,
        attempt: Annotated[int | None, Form()] = None,
    ) -> Response:
        """The Abort button: a confirmed form post, then back to the checkpoint (303, never a GET that acts)."""
        _same_origin(request)
        if confirm != "yes":
            raise HTTPException(
                422, "Tick the confirmation: the checkpoint's current attempt will never be committed"
            )
        _abort_checkpoint(store, user, session, pipeline, checkpoint_key, reason, attempt)
        base = request.scope.get("root_path", "").rstrip("/")
        return RedirectResponse(
            f"{base}/pipelines/{quote(pipeline)}/checkpoints/{quote(checkpoint_key)}",
            status_code=status.HTTP_303_SEE_OTHER,
        )

    @app.get(
        "/dags/{dag_id}",
        response_class=HTMLResponse,
        dependencies=[Depends(requires_access_dag("GET")), Depends(known_dag)],
    )
    def page_dag(request: Request, dag_id: str, store: StoreDep) -> HTMLResponse:
        return _dag_page(request, store, dag_id, None)

    @app.get(
        "/dags/{dag_id}/runs/{run_id:path}",
        response_class=HTMLResponse,
        dependencies=[Depends(requires_access_dag("GET")), Depends(known_dag)],
    )
    def page_run(request: Request, dag_id: str, run_id: str, store: StoreDep) -> HTMLResponse:
        return _dag_page(request, store, dag_id, run_id)

    def _dag_page(request: Request, store: CommitterStore, dag_id: str, run_id: str | None) -> HTMLResponse:
        """The DAG tab (every run) or the run tab: that DAG's / run's checkpoints."""
        records = store.checkpoints_of_run(dag_id, run_id, limit=2000)
        checkpoints = views.checkpoint_dicts(store, records)
        return render(request, "dag.html", dag_id=dag_id, run_id=run_id, checkpoints=checkpoints)

    @app.get("/link", dependencies=[Depends(requires_access_dag("GET")), Depends(known_dag)])
    def resolve_link(
        request: Request, dag_id: str, run_id: str, store: StoreDep, pipeline: str | None = None
    ) -> Response:
        """Where an operator extra link lands: the run's checkpoint of ``pipeline``.

        Redirects to the checkpoint's detail when the run registered exactly one
        checkpoint of that pipeline, else shows the run's checkpoints.
        """
        records = [
            r for r in store.checkpoints_of_run(dag_id, run_id) if pipeline is None or r.pipeline == pipeline
        ]
        base = request.scope.get("root_path", "").rstrip("/")
        if len(records) == 1:
            r = records[0]
            target = f"{base}/pipelines/{quote(r.pipeline)}/checkpoints/{quote(r.checkpoint_key)}"
        else:
            target = f"{base}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"
        return RedirectResponse(target, status_code=status.HTTP_303_SEE_OTHER)

    @app.get("/static/{name}")
    def static(name: str, user: GetUserDep) -> Response:
        # Only fixed-shape names from our own directory: no path can be smuggled in.
        if not _STATIC_NAME.fullmatch(name) or not (STATIC_DIR / name).is_file():
            raise HTTPException(status.HTTP_404_NOT_FOUND, "Not found")
        return Response(
            (STATIC_DIR / name).read_bytes(),
            media_type=_STATIC_TYPES[Path(name).suffix],
            headers={"Cache-Control": "private, max-age=300"},
        )

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        # Pages get a small HTML explanation (with a login link on 401); the API gets JSON.
        if request.url.path.startswith(f"{request.scope.get('root_path', '')}/api") or "text/html" not in (
            request.headers.get("accept", "")
        ):
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
        html = (
            templates()
            .get_template("error.html")
            .render(
                status_code=exc.status_code,
                detail=exc.detail,
                login=f"/auth/login?{urlencode({'next': str(request.url)})}"
                if exc.status_code == 401
                else None,
            )
        )
        return HTMLResponse(html, status_code=exc.status_code)

    return app


app = create_app()
