"""The checkpoint protocol: committables, manifests, states and staging paths.

Airflow-free and Spark-free, so it can be tested in milliseconds and used by
any writer or committer.
"""

from .checksum import file_checksum
from .errors import (
    CommittableError,
    InvalidIdentifierError,
    ManifestError,
    NotDurableError,
    PathEscapeError,
    WalsinkError,
)
from .identifiers import validate_identifier
from .manifest import (
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
from .staging import StagingLayout, confine
from .states import CheckpointState

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
    "StagingLayout",
    "WalsinkError",
    "build_manifest",
    "confine",
    "digest_of",
    "file_checksum",
    "parse_manifest",
    "read_manifest",
    "validate_identifier",
    "write_atomic",
    "write_manifest",
]

from .durability import DurabilityReport, check_attempt  # noqa: E402

__all__ += ["DurabilityReport", "check_attempt"]
