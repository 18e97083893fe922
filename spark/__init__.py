"""Spark jobs over `mpbroker export` output (in a checkout: ``pip install -e '.[spark]'``; Java 17)."""
