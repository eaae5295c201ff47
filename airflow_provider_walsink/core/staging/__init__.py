"""Staging: where a write phase puts its committables, and how the protocol reads them back.

Airflow-free. A checkpoint's attempt lives under ``<staging_root>/<pipeline>/<checkpoint>/<attempt>/``.
"""

from airflow_provider_walsink.core.staging.durability import DurabilityReport, check_attempt
from airflow_provider_walsink.core.staging.layout import StagingLayout, confine

__all__ = ["DurabilityReport", "StagingLayout", "check_attempt", "confine"]
