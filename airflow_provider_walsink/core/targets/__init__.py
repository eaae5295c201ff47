"""Commit targets: publishers move a sealed attempt's committables into place, idempotently."""

from airflow_provider_walsink.core.targets.base import Publisher, PublishResult
from airflow_provider_walsink.core.targets.files import FilePublisher

__all__ = ["FilePublisher", "PublishResult", "Publisher"]
