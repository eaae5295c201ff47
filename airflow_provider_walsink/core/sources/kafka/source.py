"""The Kafka source's contract (:class:`KafkaOffsetSource`): plan, read, after the commit."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_provider_walsink.core.faults import crashpoint
from airflow_provider_walsink.core.sources.base import Source
from airflow_provider_walsink.core.sources.kafka.aftercommit import commit_group
from airflow_provider_walsink.core.sources.kafka.job import KafkaSource, config_from_env
from airflow_provider_walsink.core.sources.kafka.planning import cluster_scope
from airflow_provider_walsink.core.sources.kafka.spec import CONFIG_ENV, KafkaSourceSpec
from airflow_provider_walsink.core.sources.kafka.writeplan import (
    OffsetPlanner,
    as_spec,
    check_before_recording,
    plan_attempt,
)

if TYPE_CHECKING:
    from airflow_provider_walsink.core.store.store import Actor, CheckpointRecord


class KafkaOffsetSource(Source):
    """The Kafka source's contract (:class:`~airflow_provider_walsink.core.sources.base.Source`).

    * plan: the ranges ``[start, high watermark)`` per partition, asked of the cluster once
      per write task (:class:`OffsetPlanner`'s memo: the plan checked before anything is
      recorded is the plan recorded); recorded on the checkpoint's row by the first attempt of
      a version, reused (re-checked against the log, never re-planned) by every retry;
    * read: :class:`KafkaSource` from the plan in the job's protocol arguments;
    * after the commit: the consumer group's offsets follow the committer table.

    :param spec: what is read (:class:`KafkaSourceSpec` or its dict).
    :param config: the librdkafka client settings.
    """

    name: ClassVar[str] = "kafka"
    plans_input: ClassVar[bool] = True

    def __init__(
        self, spec: KafkaSourceSpec | Mapping[str, Any], config: Mapping[str, Any] | None = None
    ) -> None:
        self._spec = spec
        self._config = None if config is None else dict(config)
        self._planner: OffsetPlanner | None = None

    @property
    def config(self) -> dict[str, Any]:
        if self._config is None:
            self._config = config_from_env()
        return self._config

    @property
    def spec(self) -> KafkaSourceSpec:
        return as_spec(self._spec)

    def plan(
        self,
        store: Any,
        pipeline: str,
        checkpoint: CheckpointRecord | None,
        offsets: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None] | None,
    ) -> None:
        config, spec = self.config, self.spec
        planner = self._planner = OffsetPlanner(config)
        try:
            for topic in spec.topics:
                planner.meta.partitions(topic)
            if offsets is not None:
                check_before_recording(
                    store,
                    pipeline,
                    checkpoint,
                    spec,
                    planner,
                    start_offsets=offsets[0],
                    until_offsets=offsets[1],
                )
            if spec.group_id:
                # After every other check (a refused plan claims nothing), before the checkpoint
                # is registered: a pipeline refused the group leaves nothing recorded.
                store.claim_consumer_group(cluster_scope(planner.meta, config), spec.group_id, pipeline)
        finally:
            planner.close()  # the memo stays: the plan recorded later is the one checked here

    def record(
        self,
        store: Any,
        checkpoint: CheckpointRecord,
        *,
        start_offsets: Mapping[str, Any] | None,
        until_offsets: Mapping[str, Any] | None,
        actor: Actor,
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        return plan_attempt(
            store,
            checkpoint,
            self.spec,
            self.config,
            start_offsets=start_offsets,
            until_offsets=until_offsets,
            actor=actor,
            planner=self._planner,
        )

    def job_env(self) -> dict[str, str]:
        """The client settings (secrets included) as JSON in :data:`CONFIG_ENV`."""
        return {CONFIG_ENV: json.dumps(dict(self.config), sort_keys=True)}

    def read(self, job: Any) -> KafkaSource:
        return KafkaSource.from_job(job, config=self._config)

    def after_commit(self, store: Any, pipeline: str) -> dict[str, Any] | None:
        """The group follows the committer table: only after COMMITTED (Flink's
        ``notifyCheckpointComplete``), with the newest committed end offsets."""
        spec = self.spec
        if not spec.group_id:
            return None
        crashpoint("commit.before_group_offsets")
        return {"kafka_group_offsets": commit_group(store, pipeline, spec, self.config)}
