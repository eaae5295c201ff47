"""A Kafka source for the write job: each checkpoint reads exactly ``[start, end)`` per partition.

Airflow-free (the write task plans with it, the PySpark job reads with it).
Offsets follow the **checkpoint**, never a consumer group (Flink's
``KafkaSource`` with its offsets in checkpoint state):

* a checkpoint's **start** is where the pipeline's last committed checkpoint
  ended (``job.start_offsets``, from the committer table); the first
  checkpoint starts at :attr:`KafkaSourceSpec.starting` (``earliest``,
  ``latest``, or explicit offsets per partition), resolved to concrete
  offsets once; a partition the start does not name (a new partition, a
  newly added topic) starts at its earliest offset;
* its **end** is each partition's high watermark, fixed **once** when the
  write task first plans the checkpoint and recorded on the checkpoint's row,
  so a retried write reads exactly the same records; a reprocess reads up to
  the end of the version it replaces (``job.until_offsets``);
* records the log no longer holds (retention deleted ``[start, low)``) are a
  :class:`RetentionGapError` naming topic, partition and range, unless the
  pipeline accepts data loss (:attr:`KafkaSourceSpec.accept_data_loss`): then
  the plan carries the :class:`Gap` and the write task records it on the
  checkpoint;
* offsets that went backwards (a start or recorded end beyond the log's end,
  a partition that vanished: the topic was deleted or recreated) are an
  :class:`OffsetsWentBackwardsError`; a topic the cluster does not know is a
  :class:`TopicNotFoundError`;
* each plan records the **topic id** of every topic it read (Kafka's topic UUID, where the
  cluster gives one): a topic deleted and recreated under the same name has a new id, and a plan
  whose id differs from the one the pipeline's last committed checkpoint read is a
  :class:`TopicRecreatedError`, even when the new topic already holds more records than were read;
* a consumer group (:attr:`KafkaSourceSpec.group_id`) belongs to the first pipeline that plans
  with it on its cluster (:func:`cluster_scope`); another pipeline naming it is refused.

Offsets travel as JSON: ``{"<topic>": {"<partition>": <offset>}}`` (Spark's
``startingOffsets`` shape), the next offset to read, so a checkpoint's end
offsets are the next one's start offsets.

In the job (a few lines; no Spark Kafka connector jar)::

    with CheckpointJob.from_argv(spark) as job:
        source = KafkaSource.from_job(job)            # the plan the write task fixed
        df = source.read(spark)                       # Spark's Kafka source columns
        job.stage(df.select(...), partition_by=["dt"])
        job.end_offsets = source.end_offsets

The executors read their ranges with ``confluent-kafka`` (``mapInArrow`` over
one row per split; a range longer than ``max_records_per_split`` is split, so
parallelism is not capped at the partition count). The client settings
(SASL/SSL secrets included) reach the job in spark-submit's environment
(:data:`CONFIG_ENV`), never its command line, and the executors inside the
tasks' closures, never a log line.

Consumer-group offsets are committed back only after the target commit, by
the commit task (:func:`commit_group_offsets`), for lag monitoring; walsink
never reads them back.

The package, one module per concern (each imports only those before it in this list):
``spec`` (the spec, offsets' JSON shape, errors), ``cluster`` (the cluster boundary),
``planning`` (a checkpoint's ranges), ``reading`` (the executors' reader, shipped by this
path), ``job`` (the job's face), ``aftercommit`` (the consumer-group commit), ``writeplan``
(the write task's plan, recorded once), ``source`` (:class:`KafkaOffsetSource`). Every name
is re-exported here: import from ``airflow_provider_walsink.core.sources.kafka``.
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_provider_walsink.core.sources.kafka.aftercommit import commit_group, commit_group_offsets
from airflow_provider_walsink.core.sources.kafka.cluster import (
    ConsumerMetadata,
    KafkaMetadata,
    consumer_config,
)
from airflow_provider_walsink.core.sources.kafka.job import KafkaSource, config_from_env
from airflow_provider_walsink.core.sources.kafka.planning import (
    OffsetPlan,
    cluster_scope,
    plan_offsets,
    plan_summary,
    split_ranges,
    topic_ids_of,
)
from airflow_provider_walsink.core.sources.kafka.reading import (
    SPARK_SCHEMA_DDL,
    arrow_schema,
    executor_reader,
    kafka_dataframe,
    read_range,
)
from airflow_provider_walsink.core.sources.kafka.source import KafkaOffsetSource
from airflow_provider_walsink.core.sources.kafka.spec import (
    CONFIG_ENV,
    PLAN_KEY,
    READER_OVERRIDES,
    STARTING,
    Gap,
    KafkaSourceError,
    KafkaSourceSpec,
    Offsets,
    OffsetsWentBackwardsError,
    RetentionGapError,
    TopicNotFoundError,
    TopicRecreatedError,
    normalize_offsets,
)
from airflow_provider_walsink.core.sources.kafka.writeplan import (
    OffsetPlanner,
    as_spec,
    check_before_recording,
    plan_attempt,
)

__all__: Sequence[str] = (
    "CONFIG_ENV",
    "ConsumerMetadata",
    "Gap",
    "KafkaMetadata",
    "KafkaOffsetSource",
    "KafkaSource",
    "KafkaSourceError",
    "KafkaSourceSpec",
    "OffsetPlan",
    "OffsetPlanner",
    "Offsets",
    "OffsetsWentBackwardsError",
    "PLAN_KEY",
    "READER_OVERRIDES",
    "RetentionGapError",
    "SPARK_SCHEMA_DDL",
    "STARTING",
    "TopicNotFoundError",
    "TopicRecreatedError",
    "arrow_schema",
    "as_spec",
    "check_before_recording",
    "cluster_scope",
    "commit_group",
    "commit_group_offsets",
    "config_from_env",
    "consumer_config",
    "executor_reader",
    "kafka_dataframe",
    "normalize_offsets",
    "plan_attempt",
    "plan_offsets",
    "plan_summary",
    "read_range",
    "split_ranges",
    "topic_ids_of",
)
