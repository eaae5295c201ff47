"""The job's face: one checkpoint's Kafka input as the PySpark job sees it (:class:`KafkaSource`)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_walsink.core.sources.kafka.cluster import ConsumerMetadata, KafkaMetadata
from airflow_provider_walsink.core.sources.kafka.planning import OffsetPlan, plan_offsets
from airflow_provider_walsink.core.sources.kafka.reading import kafka_dataframe
from airflow_provider_walsink.core.sources.kafka.spec import (
    CONFIG_ENV,
    PLAN_KEY,
    KafkaSourceError,
    KafkaSourceSpec,
    Offsets,
    normalize_offsets,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def config_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The client settings the write task put in the job's environment (:data:`CONFIG_ENV`)."""
    environ = os.environ if environ is None else environ
    text = environ.get(CONFIG_ENV)
    if not text:
        raise KafkaSourceError(
            f"no Kafka client settings: the write task passes them in {CONFIG_ENV} when it is given "
            "source={'kind': 'kafka', ...}; outside walsink_pipeline pass config= to KafkaSource"
        )
    try:
        config = json.loads(text)
    except ValueError:
        raise KafkaSourceError(f"{CONFIG_ENV} is not JSON") from None  # never echo: it holds secrets
    if not isinstance(config, dict):
        raise KafkaSourceError(f"{CONFIG_ENV} must be a JSON object")
    return config


class KafkaSource:
    """One checkpoint's Kafka input, as the job sees it.

    :param config: librdkafka client settings (``bootstrap.servers``, SASL/SSL...).
    :param spec: what is read (:class:`KafkaSourceSpec`).
    :param plan: the checkpoint's ranges (:func:`plan_offsets`).
    """

    def __init__(self, config: Mapping[str, Any], spec: KafkaSourceSpec, plan: OffsetPlan) -> None:
        self.config = dict(config)
        self.spec = spec
        self.plan = plan

    @classmethod
    def from_job(
        cls,
        job: Any,
        *,
        config: Mapping[str, Any] | None = None,
        spec: KafkaSourceSpec | None = None,
        meta: KafkaMetadata | None = None,
    ) -> KafkaSource:
        """The source of a :class:`~airflow_provider_walsink.core.spark.job.CheckpointJob`.

        Under a write task given ``source={"kind": "kafka", ...}`` the plan it fixed and recorded travels in
        the protocol arguments (``extra["kafka"]``) and the client settings in the
        environment: nothing is planned here, so every attempt reads the same records.
        Otherwise (a job run by hand) ``spec`` is required and the job plans from
        ``job.start_offsets`` / ``job.until_offsets`` itself; its end is then not fixed
        across attempts.
        """
        config = dict(config) if config is not None else config_from_env()
        carried = (getattr(job.protocol, "extra", None) or {}).get(PLAN_KEY)
        if carried:
            planned_spec = KafkaSourceSpec.from_dict(carried["spec"])
            plan = OffsetPlan.from_dict(carried["plan"])
            if plan.start != normalize_offsets(job.start_offsets or plan.start):
                raise KafkaSourceError(
                    f"the write task's plan starts at {plan.start}, the attempt at {job.start_offsets}"
                )
            return cls(config, spec or planned_spec, plan)
        if spec is None:
            raise KafkaSourceError(
                "this job was not given a plan by the write task (source={'kind': 'kafka', ...}): "
                "pass spec= to plan here"
            )
        if meta is None:
            with ConsumerMetadata(config) as real:
                plan = plan_offsets(real, spec, start=job.start_offsets, end=job.until_offsets)
        else:
            plan = plan_offsets(meta, spec, start=job.start_offsets, end=job.until_offsets)
        return cls(config, spec, plan)

    @property
    def start_offsets(self) -> Offsets:
        return self.plan.start

    @property
    def end_offsets(self) -> Offsets:
        """What the job sets as ``job.end_offsets``: the next checkpoint starts here."""
        return self.plan.end

    def read(self, spark: SparkSession) -> DataFrame:
        """The checkpoint's records, read by the executors (:func:`kafka_dataframe`)."""
        return kafka_dataframe(
            spark,
            self.config,
            self.plan,
            max_records_per_split=self.spec.max_records_per_split,
            timeout=self.spec.read_timeout,
        )
