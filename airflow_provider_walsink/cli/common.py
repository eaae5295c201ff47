"""What every command shares: option checks (pipelines, states, durations, counts) and output
(tables, ages, sizes, JSON).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import IO, Any

from airflow_provider_walsink.cli.database import CliError


def _known_pipelines(store: Any, wanted: Sequence[str] | None) -> None:
    if not wanted:
        return
    unknown = [p for p in wanted if store.get_pipeline(p) is None]
    if unknown:
        known = [p["name"] for p in store.pipeline_page(limit=21)]  # a hint, not every pipeline
        listing = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "") if known else "none"
        raise CliError(f"unknown pipeline {', '.join(map(repr, unknown))} (known: {listing})")


def _states(names: Sequence[str] | None, option: str) -> list[str]:
    from airflow_provider_walsink.core.protocol.states import CheckpointState

    valid = [s.value for s in CheckpointState]
    out = []
    for name in names or ():
        value = name.strip().upper()
        if value not in valid:
            raise CliError(f"{option}: unknown state {name!r} (one of {', '.join(valid)})")
        if value == CheckpointState.SUPERSEDED.value:
            # Only a checkpoint's earlier versions are SUPERSEDED (walsink_checkpoint_version);
            # the checkpoint itself is COMMITTED with its new version, so the filter would match nothing.
            raise CliError(
                f"{option}: SUPERSEDED is the state of a reprocessed checkpoint's earlier versions, never of "
                "a checkpoint (it is COMMITTED with its new version); the UI's checkpoint page lists them"
            )
        out.append(value)
    return out


def _duration(text: str | None, option: str) -> timedelta | None:
    from airflow_provider_walsink.core.commit.gc import parse_duration

    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise CliError(f"{option}: {exc}") from None


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)


def _iso(ts: datetime | None) -> str | None:
    """Naive UTC (as stored) -> ``2026-01-01T00:00:00Z``."""
    return ts.replace(microsecond=0).isoformat() + "Z" if ts is not None else None


def _age(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s"


def _first_line(text: str | None, width: int = 80) -> str:
    return (text or "").strip().splitlines()[0][:width] if text and text.strip() else ""


def _table(out: IO[str], header: Sequence[str], rows: Sequence[Sequence[str]], noun: str) -> None:
    """``rows`` under ``header`` in left-aligned columns, then ``<n> <noun>s``."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for row in (header, *rows):
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip(), file=out)
    print(f"{len(rows)} {noun}{'s' if len(rows) != 1 else ''}", file=out)


def _json_default(value: Any) -> Any:
    # A datetime that reached the output unformatted still says its zone (stored naive UTC).
    if isinstance(value, datetime):
        return _iso(value) if value.tzinfo is None else value.isoformat()
    return str(value)


def _dump(out: IO[str], data: Any) -> None:
    json.dump(data, out, indent=2, default=_json_default)
    out.write("\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
