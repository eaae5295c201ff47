"""Every benchmark of bench/README.md, one after another, in one run: ``python -m bench.all``.

Each benchmark runs in a process of its own (``python -m bench.<module> ...``) with the
arguments its README figures were measured with, its output (the tables with their
baselines, each measured in that same process) appended to one Markdown file under the
machine's table, with the wall time of each. Run it on a quiet machine: it takes about an hour
at ``--profile readme``; ``--profile smoke`` runs every benchmark at its smallest size (minutes;
a check that they all still run, its figures mean nothing).

    .venv/bin/python -m bench.all --markdown /tmp/bench-all.md   # about an hour
    .venv/bin/python -m bench.all --profile smoke --only group,tables
    .venv/bin/python -m bench.all --list
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine

#: name -> (module, arguments at the README's sizes, arguments at the smallest size).
BENCHMARKS: dict[str, tuple[str, list[str], list[str]]] = {
    "run": ("bench.run", ["--size", "medium"], ["--size", "smoke"]),
    "tables": ("bench.bench_tables", [], ["--files", "10", "--history", "10", "--repeats", "1", "--samples", "2"]),
    "history": ("bench.bench_history", [], ["--sizes", "10,20", "--samples", "1", "--checkpoint-samples", "0"]),
    "group": ("bench.bench_group", [], ["--checkpoints", "20", "--tasks", "4"]),
    "rest_catalog": ("bench.bench_rest_catalog", [], ["--files", "10", "--repeats", "1"]),
    "together": (
        "bench.bench_group",
        ["--together", "16,32,64", "--poll", "0.25", "--repeats", "3"],
        ["--together", "4", "--poll", "0.25", "--repeats", "1"],
    ),
    "backfill": (
        "bench.bench_backfill",
        ["--days", "30", "--max-active-runs", "4", "--start-from-trigger"],
        ["--days", "2", "--max-active-runs", "2"],
    ),
    "large": ("bench.bench_large", ["--files", "10000,100000"], ["--files", "100,1000"]),
    "api": ("bench.bench_api", ["--rows", "10000000"], ["--rows", "10000", "--pipelines", "100", "--requests", "5"]),
    "sql": ("bench.bench_sql", [], ["--rows", "10000", "--repeats", "1"]),
    "s3_stage": ("bench.bench_s3_stage", [], ["--rows", "10000", "--repeats", "1"]),
    "kafka_read": ("bench.bench_kafka_read", [], ["--records", "10000", "--repeats", "1"]),
    "stage_writer": ("bench.bench_stage_writer", [], ["--rows", "10000", "--repeats", "1"]),
    "triggerer": (
        "bench.bench_triggerer",
        ["--n", "100,500,1000", "--staging", "local,s3"],
        ["--n", "5", "--staging", "local,s3", "--window", "10"],
    ),
}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", choices=("readme", "smoke"), default="readme")
    parser.add_argument(
        "--only", default=",".join(BENCHMARKS), help=f"comma-separated subset of {','.join(BENCHMARKS)}"
    )
    parser.add_argument(
        "--markdown",
        default=str(Path(tempfile.gettempdir()) / "walsink-bench-all.md"),
        help="where the tables go (default: walsink-bench-all.md in the system temp dir)",
    )
    parser.add_argument("--list", action="store_true", help="print the commands and exit")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    commands = {}
    for name in chosen:
        module, readme, smoke = BENCHMARKS[name]
        commands[name] = [sys.executable, "-m", module, *(readme if args.profile == "readme" else smoke)]
    if args.list:
        for name, cmd in commands.items():
            print(f"{name}: {' '.join(cmd[1:])}")
        return 0
    out = Path(args.markdown)
    out.write_text(f"# bench.all ({args.profile})\n\n{machine(str(out.resolve().parent)).render()}\n")
    failed = []
    began = time.monotonic()
    for name, cmd in commands.items():
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        started = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        took = time.monotonic() - started
        print(done.stdout, flush=True)
        status = "ok" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
        if done.returncode != 0:
            failed.append(name)
            print(done.stderr[-3000:], file=sys.stderr, flush=True)
        with out.open("a") as f:
            f.write(f"\n## {name}: `{' '.join(cmd[1:])}`, {took:.0f} s, {status}\n\n{done.stdout}\n")
    total = time.monotonic() - began
    summary = f"\n{len(commands) - len(failed)} of {len(commands)} benchmarks ran in {total / 60:.1f} min"
    summary += f"; failed: {', '.join(failed)}" if failed else ""
    print(summary + f"; tables in {out}")
    with out.open("a") as f:
        f.write(summary + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
