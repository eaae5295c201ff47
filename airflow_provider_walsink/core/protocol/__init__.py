"""The checkpoint protocol: committables, manifests, states, identifiers and errors.

Airflow-free and Spark-free, so it can be tested in milliseconds and used by
any writer or committer.
"""

from airflow_provider_walsink.core.protocol.checksum import file_checksum
from airflow_provider_walsink.core.protocol.errors import (
    CommittableError,
    InvalidIdentifierError,
    ManifestError,
    NotDurableError,
    PathEscapeError,
    WalsinkError,
)
from airflow_provider_walsink.core.protocol.identifiers import validate_identifier
from airflow_provider_walsink.core.protocol.manifest import (
    MANIFEST_NAME,
    SCHEMA_VERSION,
    Committable,
    Manifest,
    build_manifest,
    digest_of,
    parse_manifest,
    read_manifest,
    write_atomic,
    write_manifest,
)
from airflow_provider_walsink.core.protocol.states import CheckpointState

__all__ = [
    "MANIFEST_NAME",
    "SCHEMA_VERSION",
    "CheckpointState",
    "Committable",
    "CommittableError",
    "InvalidIdentifierError",
    "Manifest",
    "ManifestError",
    "NotDurableError",
    "PathEscapeError",
    "WalsinkError",
    "build_manifest",
    "digest_of",
    "file_checksum",
    "parse_manifest",
    "read_manifest",
    "validate_identifier",
    "write_atomic",
    "write_manifest",
]
