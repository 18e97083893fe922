"""One local Spark session per test module (a JVM start costs seconds)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

# py4j leaves its gateway sockets to the garbage collector (ResourceWarning); the fixture
# collects them before the module ends, so a module using it marks itself with this filter.
PY4J_SOCKETS = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning"
)


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = (
        SparkSession.builder.master("local[2]")
        .appName("mpbroker-ingest-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
        gc.collect()
