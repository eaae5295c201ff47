"""Commit targets: publishers move a sealed attempt's committables into place, idempotently."""

from .base import Publisher, PublishResult
from .files import FilePublisher

__all__ = ["FilePublisher", "PublishResult", "Publisher"]
