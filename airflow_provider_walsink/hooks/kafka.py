"""The Airflow face of the Kafka source: the ``kafka`` connection behind the source contract
(core: :class:`~airflow_provider_walsink.core.sources.kafka.KafkaOffsetSource`, which plans,
records, reads and commits the group).

The connection is the official ``apache-airflow-providers-apache-kafka`` type
(``kafka``): its extra is the librdkafka client configuration as JSON
(``bootstrap.servers``, ``security.protocol``, ``sasl.*``, ``ssl.*``...). It
reaches the Spark job as JSON in spark-submit's environment
(:data:`~airflow_provider_walsink.core.sources.kafka.CONFIG_ENV`), the way the S3
staging credentials do (``hooks/staging.py``): never on a command line, never
in a log line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_walsink.core.sources.kafka import (
    KafkaOffsetSource,
    KafkaSourceError,
    KafkaSourceSpec,
)

DEFAULT_KAFKA_CONN_ID = "kafka_default"
#: librdkafka settings whose values are callables: they cannot travel to the executors as JSON.
_CALLBACKS = ("error_cb", "throttle_cb", "stats_cb", "log_cb", "oauth_cb", "on_commit", "logger")


def kafka_client_config(conn_id: str) -> dict[str, Any]:
    """The client configuration of a ``kafka`` connection (its extra), checked for use by walsink."""
    from airflow.sdk import BaseHook

    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        raise KafkaSourceError(
            'a Kafka source needs confluent-kafka: pip install "airflow-provider-walsink[kafka]"'
        ) from None
    config = dict(BaseHook.get_connection(conn_id).extra_dejson)
    if not config.get("bootstrap.servers"):
        raise KafkaSourceError(
            f"Kafka connection {conn_id!r} has no bootstrap.servers in its extra (the client configuration "
            'as JSON, e.g. {"bootstrap.servers": "broker:9092", "security.protocol": "SASL_SSL", ...})'
        )
    callbacks = sorted(k for k in config if k in _CALLBACKS)
    if callbacks:
        raise KafkaSourceError(
            f"Kafka connection {conn_id!r} sets {callbacks}: callbacks cannot reach Spark's executors; "
            "give the executors a configuration without them"
        )
    return config


class KafkaConnectionSource(KafkaOffsetSource):
    """The Kafka source with its client settings from a ``kafka`` connection, read when first
    needed (a commit whose source names no consumer group never reads it)."""

    def __init__(
        self, spec: KafkaSourceSpec | Mapping[str, Any], conn_id: str = DEFAULT_KAFKA_CONN_ID
    ) -> None:
        super().__init__(spec)
        self.conn_id = conn_id

    @property
    def config(self) -> dict[str, Any]:
        if self._config is None:
            self._config = kafka_client_config(self.conn_id)
        return self._config
