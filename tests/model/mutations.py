"""The mutation check: does CI's model checker catch the bugs it claims to?

``python -m tests.model.mutations [--list] [--only NAME[,NAME...]] [--tests PYTEST_ARGS] [--timeout S]``

Each mutation below is one known bug, planted as an exact text replacement in
one package file (the old text must be found exactly once: a refactor that
removes it makes this script fail loudly, never pass silently). For each, the
repository is copied to a temporary directory (the package, the tests and the
project files; nothing of ``.git``, ``.venv`` or ``var``), the mutation is
applied there, and CI's run of the checker (``tests/test_model_checker.py``,
the whole file, as ``scripts/test.sh`` runs it) runs against the copy, which is
first on ``PYTHONPATH``. It runs in two parts, stopping at the first failure
(``-x``): the pinned schedules, the Kafka source's tests and the fixed schedule whose
writes run through Spark Connect (``-k "found_schedule or kafka or spark_connect"``, a
few minutes), then the rest of the file (the random schedules of every combination,
minutes). A failure
means the checker caught the bug; the time it took is printed.

``--tests "tests/test_x.py -k y"``: for the mutations the checker missed, run
that pytest selection too (is it caught by the rest of CI?), besides the
mutation's own ``also`` selection (the test known to catch it). The score is the
share the checker alone caught; the exit status is non-zero below
:data:`REQUIRED` (80 %), or when a mutation no longer applies.

``--baseline``: run the same selection on the unmutated copy first (it must pass:
otherwise every mutation would look caught).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "airflow_provider_walsink"
CHECKER = "tests/test_model_checker.py"
REQUIRED = 0.80
#: The checker's tests run first (seconds each): the pinned schedules, the Kafka source's and the
#: Spark Connect schedule (its ``cancel_write`` steps pin the cancel of a write job).
FIRST = "found_schedule or kafka or spark_connect"


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # under the package
    old: str
    new: str
    what: str
    #: The pytest selection of the rest of CI that catches it where the checker does not (run by
    #: this script when the checker misses it, as ``--tests`` is).
    also: str = ""
    #: Further replacements of the same slip, ``(path, old, new)`` each (one change over two places).
    more: tuple[tuple[str, str, str], ...] = ()

    def parts(self) -> list[tuple[str, str, str]]:
        return [(self.path, self.old, self.new), *self.more]


M = Mutation
MUTATIONS: list[Mutation] = [
    # ---------------------------------------------------------------- the kinds of the issue
    M(
        "iceberg-append-reprocess-after-compaction",
        "core/targets/iceberg/retract.py",
        'if mode == "append" or recorded is None:\n                check_retractable(',
        "if recorded is None:\n                check_retractable(",
        "an Iceberg append reprocess retracts the old version without checking its files are still "
        "live (a compaction moved its rows): the old rows stay beside the new version",
    ),
    M(
        "reconcile-records-the-retried-end-offsets",
        "core/commit/tablefence.py",
        "fields.update(start_offsets=_dump(other.start_offsets), end_offsets=_dump(other.end_offsets))",
        "fields.update(start_offsets=_dump(other.start_offsets), end_offsets=_dump(manifest.end_offsets))",
        "a reconcile (table fencing) records the end offsets of the manifest being retried, not those "
        "of the attempt the table holds",
    ),
    M(
        "cleanup-without-its-fence",
        "core/commit/aftercommit.py",
        "publisher.finish(manifest, staging, fence=committed_fence(store, manifest))",
        "publisher.finish(manifest, staging, fence=lambda: None)",
        "the post-commit clean-up runs without its fence (a paused clean-up deletes a re-run's "
        "attempt after retention trimmed the row)",
    ),
    M(
        "durability-ignores-sizes",
        "core/staging/durability.py",
        "        if st.st_size != c.size:\n",
        "        if False:\n",
        "the durability check ignores sizes (a truncated or extended staged file is durable)",
    ),
    M(
        "second-seal-overwrites",
        "core/staging/object_store.py",
        "            if os.path.lexists(path):\n                return self._same_seal(location, digest)\n",
        "            if os.path.lexists(path):\n                os.unlink(path)  # a crashed seal's leftover\n",
        "a second seal of the same attempt (zombie or speculative driver) takes the manifest it finds for a "
        "crashed seal's leftover and replaces it: it overwrites the sealed manifest",
    ),
    M(
        "gcs-seal-overwrites",
        "core/staging/gcs.py",
        'blob.upload_from_string(data, content_type="application/json", if_generation_match=0)',
        'blob.upload_from_string(data, content_type="application/json")',
        "the GCS seal uploads without ifGenerationMatch=0: a second seal of the same attempt overwrites "
        "the sealed manifest",
    ),
    M(
        "adls-seal-overwrites",
        "core/staging/adls.py",
        "                data, overwrite=False, content_settings=",
        "                data, overwrite=True, content_settings=",
        "the ADLS seal's Put Blob overwrites (no If-None-Match: *): a second seal of the same attempt "
        "overwrites the sealed manifest",
    ),
    M(
        "group-offsets-before-the-commit",
        "core/commit/aftercommit.py",
        "    done = commit()\n    extra = dict(follow() or {}) if follow is not None else {}\n",
        "    extra = dict(follow() or {}) if follow is not None else {}\n    done = commit()\n",
        "the commit task sends the consumer group's offsets before the target commit",
    ),
    # ---------------------------------------------------------------- more of the protocol
    M(
        "lease-fence-never-asks",
        "core/commit/lease.py",
        "        if not force and started - self._confirmed < trusted:\n            return\n",
        "        return\n",
        "a lease-fenced publish never confirms its lease before a side effect (a zombie publishes)",
    ),
    M(
        "mark-committed-ignores-the-epoch",
        "core/store/leases.py",
        'if row["state"] != S.COMMITTING.value or row["lease_epoch"] != lease.epoch:\n'
        '                raise self._lease_lost(conn, lease, "mark COMMITTED")',
        'if row["state"] != S.COMMITTING.value:\n'
        '                raise self._lease_lost(conn, lease, "mark COMMITTED")',
        "COMMITTED is recorded without the compare-and-set on the lease epoch",
    ),
    M(
        "takeover-ignores-the-lease-expiry",
        "core/store/leases.py",
        '                if row["lease_expires_at"] is not None and row["lease_expires_at"] > now:\n',
        "                if False:\n",
        "a live lease is taken over (two committers of one checkpoint at once)",
        also="tests/test_store.py -k test_lease_is_exclusive_until_it_expires_then_taken_over",
    ),
    M(
        "manifest-digest-not-compared",
        "core/protocol/manifest.py",
        "    if expected_digest is not None and digest_of(data) != expected_digest:\n",
        "    if False:\n",
        "a manifest read does not compare its digest with the sealed one",
    ),
    M(
        "checksum-not-compared",
        "core/staging/durability.py",
        "            actual = file_checksum(path, algorithm_of(c.checksum))\n            if actual != c.checksum:\n",
        "            actual = file_checksum(path, algorithm_of(c.checksum))\n            if False:\n",
        "the durability check (and the commit's verify_checksums) never compares checksums",
    ),
    M(
        "append-order-not-checked",
        "core/store/lifecycle.py",
        "        if earlier is not None:\n            raise OrderingError(",
        "        if False:\n            raise OrderingError(",
        "an append checkpoint commits before an earlier uncommitted one (invariant 5)",
        also="tests/test_store.py -k test_abort_unblocks_later_append_checkpoints_until_a_new_attempt_starts",
    ),
    M(
        "gc-deletes-a-sealed-attempt",
        "core/commit/gc.py",
        "keep = {(record.attempt, record.attempt_id), (record.sealed_attempt, record.sealed_attempt_id)}",
        "keep = {(record.attempt + 1, record.attempt_id)}",
        "GC deletes the sealed attempt of an uncommitted checkpoint",
    ),
    M(
        "commit-does-not-reverify-staged-bytes",
        "core/commit/checksums.py",
        "    if changed.durable:\n        return\n",
        "    return\n",
        "the commit's verify_checksums never refuses: bytes changed after the durability check are published",
    ),
    M(
        "gc-collects-table-staging",
        "core/commit/gc.py",
        "            if keeps_staged:\n",
        "            if False:\n",
        "GC collects the staging of a table target, whose committed files the table references in place",
    ),
    M(
        "iceberg-overwrite-order-not-checked",
        "core/targets/iceberg/publisher.py",
        "            self._check_order(view, manifest)\n            if footers is None:",
        "            if footers is None:",
        "an Iceberg overwrite lets an older checkpoint replace a newer one's partition (invariant 10)",
    ),
    M(
        "delta-append-reprocess-after-compaction",
        "core/targets/delta/actions.py",
        'if self.mode == "append" or recorded is None:\n                check_retractable(',
        "if recorded is None:\n                check_retractable(",
        "a Delta append reprocess retracts the old version without checking its files are still live",
    ),
    M(
        "table-marker-ignored",
        "core/targets/_tables.py",
        "    if marker is not None and marker.attempt_id == manifest.attempt_id:\n        return True\n",
        "",
        "a table target does not see its own attempt in the table's marker: a retry publishes again",
    ),
    M(
        "abort-tombstone-ignored",
        "core/targets/_tables.py",
        "    if manifest.attempt_id in aborted:\n        raise AbortedInTableError(",
        "    if False:\n        raise AbortedInTableError(",
        "a table target publishes an attempt its abort's tombstone names",
    ),
    M(
        "files-overwrite-order-not-checked",
        "core/targets/files/publisher.py",
        '        """Invariant 10 (:func:`.base.check_partition_order`), on the partition\'s marker file."""\n',
        '        """Invariant 10 (:func:`.base.check_partition_order`), on the partition\'s marker file."""\n'
        "        return\n",
        "a files overwrite lets an older checkpoint replace a newer one's partition (invariant 10)",
    ),
    M(
        "iceberg-unknown-outcome-cleaned-up",
        "core/targets/iceberg/publisher.py",
        "                # It may have landed: delete nothing, retract nothing; the next load decides.\n"
        "                pending[str(unknown.snapshot_id)] = result\n",
        "                for location in locations:  # cleaned up as a failed commit: the staged files deleted\n"
        "                    table.io.delete(location)\n"
        "                pending[str(unknown.snapshot_id)] = result\n",
        "an Iceberg commit whose outcome the catalog did not report (it applied it, then answered 5xx) is "
        "cleaned up as a failed one: the attempt's staged files, which the new snapshot references, deleted",
    ),
    M(
        "iceberg-unknown-outcome-committed-again",
        "core/targets/iceberg/publisher.py",
        "            if decide(marker, manifest, ctx, self.mode, aborted):\n                return self._landed(",
        "            if not pending and decide(marker, manifest, ctx, self.mode, aborted):\n"
        "                return self._landed(",
        "an Iceberg commit whose outcome the catalog did not report is treated as not landed: the retry "
        "ignores the table's marker and commits the attempt again (its files added twice)",
    ),
    M(
        "abort-cleanup-unfenced",
        "core/commit/abort.py",
        "        if now.lease_epoch != self.epoch:\n            raise LeaseLostError(",
        "        if False:\n            raise LeaseLostError(",
        "an abort's clean-up goes on after the checkpoint moved on (a new run's attempt)",
        also="tests/test_abort_fence.py",
    ),
    # ---------------------------------------------------------------- people and Airflow (issue 49, people.py)
    M(
        "partition-key-keeps-plus",
        "core/protocol/partition_keys.py",
        '_KEPT = re.compile(r"[A-Za-z0-9_.\\-]")',
        '_KEPT = re.compile(r"[A-Za-z0-9_.\\-+]")',
        "the partition key's checkpoint encoding keeps '+', its own escape character, as it is: "
        "'a+3Db' and 'a=b' name one checkpoint",
    ),
    M(
        "partition-key-folds-case",
        "core/protocol/partition_keys.py",
        "        for ch in partition_key\n    )\n    key = PARTITION_KEY_PREFIX + escaped",
        "        for ch in partition_key.casefold()\n    )\n    key = PARTITION_KEY_PREFIX + escaped",
        "the partition key's checkpoint encoding folds case (keys compared as people type them): "
        "'München' and 'münchen' name one checkpoint",
    ),
    M(
        "partition-dir-keeps-percent",
        "core/protocol/partitions.py",
        """frozenset("\\"#%'*/:=?\\\\\\x7f{[]^")""",
        """frozenset("\\"#'*/:=?\\\\\\x7f{[]^")""",
        "the Hive directory escape leaves '%' as it is: partition key 'a%3Db' is written into "
        "'a=b''s partition (dt=a%3Db), and reads back as 'a=b'",
    ),
    M(
        "approval-not-of-the-shown-attempt",
        "core/store/verdicts.py",
        """            if row["sealed_attempt_id"] != attempt_id:
                raise StaleAttemptError(
                    f"the approval of attempt""",
        """            if False:
                raise StaleAttemptError(
                    f"the approval of attempt""",
        "a person's approval is recorded on whatever attempt is REJECTED now, not only the one "
        "shown: an attempt written and rejected meanwhile is published on the older one's approval",
    ),
    M(
        "approval-abort-not-of-the-shown-attempt",
        "core/store/abort_transitions.py",
        """        if attempt_id is not None and now != (attempt_id, attempt_id):""",
        """        if False:""",
        "a person's Abort ends whatever attempt the checkpoint has now, not only the one shown: an "
        "attempt written meanwhile (its own audit pending or passed) is aborted (the bug issue 49 found)",
    ),
    M(
        "deadline-claim-held-by-any-holder",
        "core/store/deadlines.py",
        """            return holder is not None and holder["claimed_by"] == claimant[:255]""",
        """            return holder is not None""",
        "a deadline claim that fails on the key reads the holder and takes any holder for its own "
        "(meant for a retry whose first insert committed): a second run of the callback notifies again",
    ),
    M(
        "deadline-notice-keyed-by-claimant",
        "core/store/migrations/versions/0014_deadline_notice.py",
        """sa.PrimaryKeyConstraint("pipeline", "deadline", name=""",
        """sa.PrimaryKeyConstraint("pipeline", "deadline", "claimed_by", name=""",
        "the deadline notice's primary key includes the claimant: every run of the callback inserts "
        "its own claim and notifies",
    ),
    # ---------------------------------------------------------------- issue 49, part B (storage_ops.py)
    M(
        "late-seal-after-abort",
        "core/store/lifecycle.py",
        'if row["attempt"] != attempt or row["state"] != S.WRITING.value:',
        'if row["attempt"] != attempt or row["state"] not in (S.WRITING.value, S.ABORTED.value):',
        "a write that finishes after its checkpoint was aborted still records its seal (so that its staging "
        "is tracked): the aborted attempt becomes SEALED, then durable and committable",
        more=(
            (
                "core/protocol/states.py",
                "    S.ABORTED: frozenset({S.WRITING}),",
                "    S.ABORTED: frozenset({S.WRITING, S.SEALED}),",
            ),
        ),  # fmt: skip
    ),
    M(
        "s3-seal-reads-then-writes",
        "core/staging/object_store.py",
        "            client.put_object(\n"
        '                Bucket=bucket, Key=key, Body=data, ContentType="application/json", IfNoneMatch="*"\n'
        "            )\n",
        '            if client.list_objects_v2(Bucket=bucket, Prefix=key).get("KeyCount"):\n'
        "                return self._same_seal(location, digest)\n"
        '            client.put_object(Bucket=bucket, Key=key, Body=data, ContentType="application/json")\n',
        "the S3 seal looks for a manifest, then puts its own (two requests, no If-None-Match): two seals of "
        "one attempt in flight at once both write, the last one replacing the manifest the other recorded",
    ),
    M(
        "checksum-skips-resized-files",
        "core/commit/checksums.py",
        "checked=report.checked, wrong_size=report.wrong_size, wrong_checksum=report.wrong_checksum",
        "checked=report.checked, wrong_checksum=report.wrong_checksum",
        "the commit's verify_checksums counts checksum mismatches only: a committable whose size changed too "
        "(its checksum is never computed) passes, and the target publishes the changed bytes",
    ),
    M(
        "files-swap-not-resumable",
        "core/targets/files/publisher.py",
        "                marker = self._live_marker(partition)\n"
        '                if marker is not None and marker.get("attempt_id") == manifest.attempt_id:\n'
        "                    continue\n",
        "                marker = self._live_marker(partition)\n",
        "a files overwrite's swap loop swaps every partition, also one its interrupted try swapped in already: "
        "a publish resumed after a pause (or a retry) swaps the live partition out for an empty one",
    ),
    # ---------------------------------------------------------------- issue 49: cancel while writing
    M(
        "connect-cancel-interrupts-nothing",
        "hooks/spark_connect_runner.py",
        "        self._cancelled = True\n        try:\n            interrupted = session.interruptAll()\n",
        "        self._cancelled = True\n        try:\n            interrupted = session.interruptTag(self.job_name)\n",
        "the Spark Connect runner's cancel interrupts the operations tagged with the job's name, not the tag "
        "its operations carry: nothing; the job of an aborted or fenced attempt runs on, holding the cluster",
    ),
    # ---------------------------------------------------------------- issue 45: bounded table metadata
    M(
        "archived-marker-read-as-absent",
        "core/targets/archive.py",
        "        if state.first == 0:\n            return None  # nothing archived before the batch\n",
        "        if state.first >= 0:\n            return None  # nothing archived before the batch\n",
        "a marker archived out of an Iceberg table (past the batch the table carries) reads as absent instead "
        "of being looked up in the committer database: a re-run of an old checkpoint publishes it again",
        also="tests/test_table_archive.py",
    ),
    M(
        "delta-expired-marker-read-as-absent",
        "core/targets/delta/markers.py",
        "        if pipeline is None or self.archive_state(pipeline).count == 0:\n            return None\n",
        "        if pipeline is None or self.archive_state(pipeline).count >= 0:\n            return None\n",
        "a marker walsink expired out of a Delta table reads as absent instead of being looked up in the "
        "committer database: a re-run of an old checkpoint publishes it again, and the clean-up deletes "
        "files older table versions reference",
        also="tests/test_table_archive.py",
    ),
]


def apply(mutation: Mutation, root: Path) -> None:
    """Plant ``mutation`` in the copy at ``root``; raises if an old text is not there exactly once."""
    for where, old, new in mutation.parts():
        path = root / PACKAGE / where
        text = path.read_text()
        n = text.count(old)
        if n != 1:
            raise SystemExit(
                f"mutation {mutation.name}: its old text is in {PACKAGE}/{where} {n} times, not once "
                "(the code changed: update the mutation)"
            )
        path.write_text(text.replace(old, new))


def copy_repo(dest: Path) -> None:
    ignore = shutil.ignore_patterns(
        ".git", ".venv", "var", "__pycache__", ".pytest_cache", ".ruff_cache", "*.pyc"
    )
    for item in ROOT.iterdir():
        if item.name in (".git", ".venv", "var"):
            continue
        if item.is_dir():
            shutil.copytree(item, dest / item.name, ignore=ignore, symlinks=True)
        else:
            shutil.copy2(item, dest / item.name)


def pytest(root: Path, args: list[str], timeout: float, log: Path) -> tuple[bool, float, str]:
    """Run pytest in the copy; (passed, seconds, the failing tests' ids or the reason)."""
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", "-rf",
           "--durations=0", *args]  # fmt: skip
    started = time.monotonic()
    with log.open("a") as out:
        out.write(f"\n$ {shlex.join(cmd)}\n")
        out.flush()
        try:
            done = subprocess.run(
                cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return False, time.monotonic() - started, f"timeout after {timeout:.0f}s"
    seconds = time.monotonic() - started
    if done.returncode == 0 or done.returncode == 5:  # 5: nothing selected
        return True, seconds, ""
    failed = [line.split(" ", 2)[1] for line in log.read_text().splitlines() if line.startswith("FAILED ")]
    return False, seconds, (failed[-1] if failed else f"pytest exit {done.returncode}")


def run_one(mutation: Mutation | None, args: argparse.Namespace, logs: Path) -> dict[str, object]:
    name = mutation.name if mutation else "baseline"
    log = logs / f"{name}.log"
    log.write_text("")
    with tempfile.TemporaryDirectory(prefix=f"mut-{name}-") as tmp:
        root = Path(tmp)
        copy_repo(root)
        if mutation is not None:
            apply(mutation, root)
        seconds = 0.0
        caught_by = ""
        for part in (["-k", FIRST], ["-k", f"not ({FIRST})"]):
            passed, took, why = pytest(root, [CHECKER, *part], args.timeout, log)
            seconds += took
            if not passed:
                caught_by = why
                break
        other = ""
        other_seconds = 0.0
        selection = " ".join(x for x in (mutation.also if mutation else "", args.tests) if x)
        if not caught_by and selection and mutation is not None:
            passed, other_seconds, why = pytest(root, shlex.split(selection), args.timeout, log)
            other = "" if passed else why
    return {"name": name, "checker": bool(caught_by), "by": caught_by, "seconds": seconds,
            "other": other, "other_seconds": other_seconds, "log": str(log)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.model.mutations", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--list", action="store_true", help="list the mutations and check that each still applies")
    p.add_argument("--only", default="", help="comma-separated mutation names")
    p.add_argument("--tests", default="", help="a pytest selection run for each mutation the checker missed")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per pytest run")
    p.add_argument("--baseline", action="store_true", help="first run the selection on the unmutated copy")
    p.add_argument("--logs", default=None, help="directory for the pytest logs (default: a temporary one)")
    args = p.parse_args(argv)
    chosen = MUTATIONS
    if args.only:
        wanted = args.only.split(",")
        unknown = set(wanted) - {m.name for m in MUTATIONS}
        if unknown:
            p.error(f"unknown mutation(s): {', '.join(sorted(unknown))}")
        chosen = [m for m in MUTATIONS if m.name in wanted]
    for m in chosen:  # every mutation must still apply, before anything runs
        for where, old, _new in m.parts():
            found = (ROOT / PACKAGE / where).read_text().count(old)
            if found != 1:
                print(f"mutation {m.name}: old text found {found} times in {where}", file=sys.stderr)
                return 2
    if args.list:
        for m in chosen:
            print(f"{m.name:45s} {m.path:32s} {m.what}")
        return 0
    logs = Path(args.logs or tempfile.mkdtemp(prefix="walsink-mutations-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"logs: {logs}", flush=True)
    if args.baseline:
        base = run_one(None, args, logs)
        print(f"baseline: {'FAILS' if base['checker'] else 'passes'} ({base['seconds']:.0f}s) {base['by']}")
        if base["checker"]:
            return 3
    results = []
    for m in chosen:
        r = run_one(m, args, logs)
        results.append(r)
        verdict = "caught" if r["checker"] else ("caught by --tests" if r["other"] else "MISSED")
        print(f"{m.name:45s} {verdict:18s} {r['seconds']:6.0f}s  {r['by'] or r['other']}", flush=True)
    caught = sum(1 for r in results if r["checker"])
    print()
    print("| mutation | caught by the checker | seconds | by |\n|---|---|---|---|")
    for r in results:
        by = r["by"] or (
            f"(not the checker) {r['other']} in {r['other_seconds']:.0f}s" if r["other"] else "-"
        )
        print(f"| {r['name']} | {'yes' if r['checker'] else 'no'} | {r['seconds']:.0f} | {by} |")
    score = caught / len(results) if results else 1.0
    print(f"\nchecker score: {caught}/{len(results)} = {score:.0%} (required {REQUIRED:.0%})")
    return 0 if score >= REQUIRED else 1


if __name__ == "__main__":
    sys.exit(main())
