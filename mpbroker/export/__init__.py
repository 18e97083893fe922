"""Export the stores' persistent messages as Parquet files (`mpbroker export`).

- :func:`export`: every message of the stores in a data directory (sealed, archived and a
  snapshot of the active segments, read-only while the broker runs) not exported yet, one
  Parquet file per source segment; update files with the outcomes found since of rows
  exported as pending; and the manifest that makes the next run incremental. Memory is
  bounded (`max_memory`), whatever the size of the stores.
- The schema (:data:`COLUMNS`, :data:`SCHEMA_VERSION`) and :func:`build_row` are pure; so is
  the manifest logic (:class:`Manifest`, :func:`after_seq`).

pyarrow is imported only when a file is read or written: the broker runs without it
(``pip install -e '.[spark]'`` in a checkout brings it).

Example::

    summary = export(Path("/var/lib/mpbroker"), Path("/srv/export"), Options(body=False))
    print("\\n".join(summary.lines()))
"""

from ._errors import ExportError
from ._manifest import MANIFEST_NAME, FileEntry, Manifest, Options, SegmentEntry, after_seq
from ._parquet import INSTALL_HINT
from ._run import DEFAULT_MAX_MEMORY, ExportSummary, Progress, export
from ._schema import (
    COLUMNS,
    PENDING,
    ROW_OUTCOMES,
    SCHEMA_VERSION,
    SETTLED_UNKNOWN,
    UPDATE_COLUMNS,
    Column,
    SourceMessage,
    build_row,
    kind_of,
    parse_since,
)

__all__ = [
    "COLUMNS",
    "DEFAULT_MAX_MEMORY",
    "INSTALL_HINT",
    "MANIFEST_NAME",
    "PENDING",
    "ROW_OUTCOMES",
    "SCHEMA_VERSION",
    "SETTLED_UNKNOWN",
    "UPDATE_COLUMNS",
    "Column",
    "ExportError",
    "ExportSummary",
    "FileEntry",
    "Manifest",
    "Options",
    "Progress",
    "SegmentEntry",
    "SourceMessage",
    "after_seq",
    "build_row",
    "export",
    "kind_of",
    "parse_since",
]
