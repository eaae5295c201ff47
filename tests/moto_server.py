"""moto's S3 server as a process of its own on a free loopback port, its bucket created.

A process, not moto's in-process thread: a library call that holds the interpreter lock while it
waits on S3 (deltalake's ``alter.set_table_properties``, which walsink calls when it bounds a
Delta table's markers) would wait forever for a server that needs that lock to answer. Started
and stopped as the other emulators are (:func:`tests.gcs_server.emulator`: killed with the test
process however it ends).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def serve(bucket: str) -> Iterator[str]:
    """The endpoint of a ``moto_server`` with ``bucket`` created, until the block ends."""
    import boto3

    from tests.gcs_server import emulator, free_port, http_answers
    from tests.table_fixtures import ACCESS_KEY, REGION, SECRET_KEY

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"

    binary = Path(sys.executable).with_name("moto_server")
    with emulator(
        "moto_server",
        [str(binary), "-H", "127.0.0.1", "-p", str(port)],
        http_answers(f"{endpoint}/moto-api/data.json"),
        chatty=True,
    ):
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                     region_name=REGION).create_bucket(Bucket=bucket)  # fmt: skip
        yield endpoint
