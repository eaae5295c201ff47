"""The ``spark`` job runner: spark-submit through the Spark provider's ``SparkSubmitHook``.

Registered in :data:`airflow_provider_walsink.core.runners.RUNNERS`; it lives here, not in the
core, because it imports Airflow.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from airflow.providers.apache.spark.hooks.spark_submit import DEFAULT_SPARK_BINARY, SparkSubmitHook
from airflow.sdk import BaseHook

from airflow_provider_walsink.core.runners.base import JobRunner
from airflow_provider_walsink.core.spark.args import (
    AZURE_OPTION_ENV,
    GCS_OPTION_ENV,
    S3_OPTION_ENV,
    SECRET_OPTIONS,
)

#: Master used when the operator names no Spark connection.
DEFAULT_MASTER = "local[*]"
#: Spark settings applied under the default local master unless the user sets them:
#: keep the driver on loopback and skip the web UI (it binds every interface).
LOCAL_DEFAULT_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",  # progress bars garble the task log
    # Spark's INFO lines (over a hundred per job) bury the task's own phase lines; conf
    # {"spark.log.level": "INFO"} brings them back.
    "spark.log.level": "WARN",
}

#: The job's environment variables that carry no secret (the staging store's region, endpoint...):
#: every other one it is handed is a secret (staging credentials, a source's ``job_env``).
PLAIN_ENV = frozenset(
    name
    for table in (S3_OPTION_ENV, GCS_OPTION_ENV, AZURE_OPTION_ENV)
    for option, names in table.items()
    if option not in SECRET_OPTIONS
    for name in names
)

_EXIT_CODE = re.compile(r"Error code is: (-?\d+)")


def default_spark_binary() -> str:
    """``spark-submit`` beside this interpreter (a virtualenv's ``bin/``), else on ``PATH``."""
    candidate = os.path.join(os.path.dirname(sys.executable), DEFAULT_SPARK_BINARY)
    if os.access(candidate, os.X_OK):
        return candidate
    return shutil.which(DEFAULT_SPARK_BINARY) or DEFAULT_SPARK_BINARY


def describe_failure(exc: BaseException) -> str:
    """One line for the committer table's history: what failed, without the whole command line.

    The Spark hook's error starts with the full spark-submit command and ends
    with the tail of its log; the job's own exception is the last line of it.
    """
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    code = _EXIT_CODE.search(lines[0])
    if lines[0].startswith("Cannot execute:") and code:
        tail = next((ln for ln in reversed(lines[1:]) if "Error" in ln or "Exception" in ln), None)
        tail = tail or (lines[-1] if len(lines) > 1 else "no log output")
        return f"spark-submit exited with code {code.group(1)}: {tail}"[:1000]
    return lines[0][:1000]


class ExplicitMasterSparkSubmitHook(SparkSubmitHook):
    """A ``SparkSubmitHook`` whose master is given, not looked up in a connection.

    The provider's hook falls back to ``yarn`` when its connection is missing;
    walsink's default is chosen explicitly instead (``local[*]``), and nothing
    is looked up.
    """

    def __init__(self, *, master: str, **kwargs: Any) -> None:
        self._walsink_master = master
        super().__init__(**kwargs)

    def _resolve_connection(self) -> dict[str, Any]:
        return {
            "master": self._walsink_master,
            "queue": None,
            "deploy_mode": self._deploy_mode,
            "spark_binary": self.spark_binary or DEFAULT_SPARK_BINARY,
            "namespace": self._conf.get("spark.kubernetes.namespace"),
            "principal": self._principal,
            "keytab": self._keytab,
            "rest_scheme": "http",
            "rest_port": 6066,
            "rest_endpoint": None,
        }


class SparkSubmitRunner(JobRunner):
    """spark-submit in client mode: :meth:`submit` returns when the job has ended.

    ``spark_conn_id`` names a Spark connection (master, deploy mode...); ``None`` means
    ``master`` (default ``local[*]``), chosen explicitly: a named connection that does not
    exist is an error, never the provider's silent ``yarn``.
    """

    name: ClassVar[str] = "spark"
    task_options: ClassVar[frozenset[str]] = frozenset({"master", "spark_binary", "spark_submit_kwargs"})

    def __init__(
        self,
        *,
        job_name: str,
        spark_conn_id: str | None = None,
        master: str = DEFAULT_MASTER,
        conf: Mapping[str, Any] | None = None,
        env_vars: Mapping[str, str] | None = None,
        spark_binary: str | None = None,
        spark_submit_kwargs: Mapping[str, Any] | None = None,
        log: logging.Logger | logging.LoggerAdapter[Any] | None = None,
    ) -> None:
        self.job_name = job_name
        self.spark_conn_id = spark_conn_id
        self.master = master
        self.conf = dict(conf or {})
        self.env_vars = dict(env_vars or {})
        self.spark_binary = spark_binary
        self.spark_submit_kwargs = dict(spark_submit_kwargs or {})
        self.log = log or logging.getLogger(__name__)
        #: The provider's hook of the submitted job (``None`` before :meth:`submit`).
        self.hook: SparkSubmitHook | None = None

    def build_hook(self, arguments: Sequence[str], env: Mapping[str, str]) -> SparkSubmitHook:
        """The provider's hook, with the master chosen explicitly when no connection is named.

        ``env`` (the job's secrets) joins ``env_vars``: the environment of the spark-submit
        process, which a local or client-mode driver inherits. It is never on the command
        line; a master that would put it there (YARN and Kubernetes turn ``env_vars`` into
        ``--conf`` arguments) or cannot take it (standalone cluster mode) is refused.
        """
        kwargs: dict[str, Any] = dict(
            name=self.job_name,
            application_args=list(arguments),
            spark_binary=self.spark_binary,
            **self.spark_submit_kwargs,
        )
        secret_env = dict(env)
        if self.spark_conn_id is None:
            self.log.info(
                "No spark_conn_id: submitting to master %s (walsink's explicit default)", self.master
            )
            conf = {**LOCAL_DEFAULT_CONF, **self.conf} if self.master.startswith("local") else self.conf
            job_env = self._spark_env(secret_env)
            if self.master.startswith("local"):
                job_env.setdefault("PYSPARK_PYTHON", sys.executable)
                job_env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
            kwargs["spark_binary"] = self.spark_binary or default_spark_binary()
            hook: SparkSubmitHook = ExplicitMasterSparkSubmitHook(
                master=self.master, conf=conf, env_vars=job_env, **kwargs
            )
        else:
            # Fail on a missing connection here: the provider would fall back to yarn.
            BaseHook.get_connection(self.spark_conn_id)
            hook = SparkSubmitHook(
                conn_id=self.spark_conn_id,
                conf=self.conf,
                env_vars=self._spark_env(secret_env) or None,
                **kwargs,
            )
        self._check_credentials_stay_off_the_command_line(hook, secret_env)
        return hook

    def submit(self, application: str, arguments: Sequence[str], env: Mapping[str, str]) -> None:
        self.hook = self.build_hook(arguments, env)
        self.hook.submit(application)

    def wait(self) -> None:
        """Nothing left to wait for: spark-submit in client mode returned when the job ended."""

    def describe_failure(self, exc: BaseException) -> str:
        return describe_failure(exc)

    def cancel(self) -> None:
        if self.hook is not None:
            self.hook.on_kill()

    def _spark_env(self, secret_env: Mapping[str, str]) -> dict[str, str]:
        """``env_vars`` plus the job's secrets; the same variable set twice differently is an error."""
        job_env = dict(self.env_vars)
        clash = sorted(k for k, v in secret_env.items() if k in job_env and str(job_env[k]) != v)
        if clash:
            raise ValueError(
                f"env_vars sets {clash}, which the staging root's connection sets too: give the staging "
                "credentials in one place (the walsink connection's staging_conn_id)"
            )
        job_env.update(secret_env)
        return job_env

    def _check_credentials_stay_off_the_command_line(
        self, hook: SparkSubmitHook, secret_env: Mapping[str, str]
    ) -> None:
        secrets = sorted(k for k, v in secret_env.items() if v and k not in PLAIN_ENV)
        if not secrets:
            return
        master = hook._connection["master"]
        if hook._is_yarn or hook._is_kubernetes:
            raise ValueError(
                f"staging credentials cannot reach a job on master {master}: the Spark provider passes "
                f"env_vars to YARN and Kubernetes as --conf arguments, which would put {', '.join(secrets)} "
                "on the spark-submit command line. Let the cluster's own identity reach the bucket (instance "
                'profile, IRSA) and set the walsink connection extra "staging_conn_id": "" (the default '
                "credential chain)"
            )
        if hook._connection["deploy_mode"] == "cluster":
            raise ValueError(
                f"staging credentials cannot reach a job in cluster deploy mode on {master}: its driver does "
                "not inherit spark-submit's environment. Use client deploy mode, or the hosts' default "
                'credential chain (walsink connection extra "staging_conn_id": "")'
            )
