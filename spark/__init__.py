"""Spark jobs over `mpbroker export` output (``pip install 'mpbroker[spark]'``, Java 17)."""
