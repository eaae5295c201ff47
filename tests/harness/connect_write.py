"""The harness's write job through Spark Connect: ``python -m tests.harness.connect_write
<spark_connect conn id> <job file> <job arguments...>``.

Runs the job file as a Spark Connect client in this process, through ``SparkConnectRunner``
as the write task does (the connection from ``AIRFLOW_CONN_<ID>``). This process is the job's
driver program: a crash point inside ``CheckpointJob.seal`` SIGKILLs it, as a worker dying
mid-job would, while the server goes on.
"""

from __future__ import annotations

import sys

from airflow_provider_walsink.hooks.spark_connect_runner import SparkConnectRunner


def main() -> None:
    conn_id, application, *arguments = sys.argv[1:]
    SparkConnectRunner(job_name="walsink-harness", spark_conn_id=conn_id).submit(application, arguments, {})


if __name__ == "__main__":
    main()
