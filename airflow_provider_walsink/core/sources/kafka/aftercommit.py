"""After the commit: the pipeline's committed end offsets sent to its consumer group, for lag
tools only (walsink never reads them back).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow_provider_walsink.core.sources.kafka.cluster import ConsumerMetadata, consumer_config
from airflow_provider_walsink.core.sources.kafka.planning import cluster_scope
from airflow_provider_walsink.core.sources.kafka.spec import (
    KafkaSourceError,
    KafkaSourceSpec,
    normalize_offsets,
)

log = logging.getLogger(__package__)  # the package's logger, as before the split


def commit_group_offsets(
    config: Mapping[str, Any], group_id: str, offsets: Mapping[str, Any], *, timeout: float = 30.0
) -> list[tuple[str, int, int]]:
    """Commit ``offsets`` (a committed checkpoint's end offsets) to consumer group ``group_id``.

    Only for lag tools: walsink never reads them back. Synchronous; raises
    :class:`KafkaSourceError` naming the partitions the cluster refused. Safe to
    repeat (committing the same offsets again changes nothing).
    """
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    wanted = normalize_offsets(offsets, "end offsets")
    partitions = [TopicPartition(t, int(p), o) for t, parts in wanted.items() for p, o in parts.items()]
    if not partitions:
        return []
    consumer = Consumer(consumer_config(config, group_id=group_id))
    try:
        try:
            result = consumer.commit(offsets=partitions, asynchronous=False)
        except KafkaException as e:
            raise KafkaSourceError(f"committing offsets of group {group_id!r} failed: {e}") from None
        refused = [tp for tp in result or [] if tp.error is not None]
        if refused:
            raise KafkaSourceError(
                f"group {group_id!r}: the cluster refused offsets of "
                + ", ".join(f"{tp.topic}[{tp.partition}] ({tp.error})" for tp in refused)
            )
        return [(tp.topic, tp.partition, tp.offset) for tp in partitions]
    finally:
        consumer.close()


def commit_group(
    store: Any, pipeline: str, spec: KafkaSourceSpec, config: Mapping[str, Any]
) -> dict[str, Any] | None:
    """After the target commit: commit the pipeline's **last committed** end offsets to the group.

    Never ahead of the committer table (only COMMITTED end offsets are sent), and a re-run or
    the next commit sends the newest ones, so a crash between the target commit and this call
    is caught up. Returns the offsets sent (``None``: no group configured or nothing committed).

    The group must still belong to ``pipeline`` (claimed at its plan, :func:`cluster_scope`):
    one handed over to another pipeline since (``walsink reassign-group``) raises
    :class:`~airflow_provider_walsink.core.store.errors.ConsumerGroupMovedError` naming both,
    with nothing sent.
    """
    if not spec.group_id:
        return None
    with ConsumerMetadata(config) as meta:
        scope = cluster_scope(meta, config)
    # Read, check the group's owner and send under the pipeline's lock: a slow task that read
    # older offsets must not send them after a newer commit's task sent the newer ones (the group
    # would move back), nor after the group was handed over to another pipeline.
    with store.newest_committed_offsets_held(pipeline, consumer_group=(scope, spec.group_id)) as offsets:
        if not offsets:
            return None
        commit_group_offsets(config, spec.group_id, offsets)
    log.info("Kafka group %s now at the committed end offsets %s", spec.group_id, offsets)
    return offsets
