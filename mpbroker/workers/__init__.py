"""The broker's processes: supervisor, gateway and pipeline workers (thin I/O shells)."""
