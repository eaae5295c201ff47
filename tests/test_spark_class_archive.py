"""The test session's Spark drivers start from the class archive (``tests/jvm_class_archive.py``):
the shared session's JVM maps it. If it did not (a class path that no longer matches, a JDK that
refuses it), every driver of the suite would load Spark's classes one by one again, silently."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest


def test_the_shared_sessions_jvm_maps_the_class_archive(spark):
    if not os.environ.get("WALSINK_TEST_SPARK_OPTS_OURS"):
        pytest.skip("SPARK_SUBMIT_OPTS was set by the caller: the session adds no class archive")
    opts = os.environ["SPARK_SUBMIT_OPTS"]
    archive = re.search(r"-XX:SharedArchiveFile=(\S+)", opts)
    assert archive, f"no class archive in SPARK_SUBMIT_OPTS: {opts!r}"
    jvm = spark.sparkContext._gateway.proc.pid
    maps = Path(f"/proc/{jvm}/maps").read_text()
    assert archive.group(1) in maps
