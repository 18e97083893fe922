"""The counters of a worker's control-block slot, by role: the worker writes them, the
supervisor (systemd's STATUS line, the admin API), the gateways (the connection limit)
and the other pipelines (the destination limit) read them."""

from __future__ import annotations

from typing import Final

__all__ = [
    "GATEWAY_CONNECTED",
    "GATEWAY_CONNECTIONS",
    "GATEWAY_FRAMES_IN",
    "PIPELINE_DELIVERED",
    "PIPELINE_DESTINATIONS",
    "PIPELINE_RECEIVED",
    "REPLAY_BATCHES",
    "REPLAY_MESSAGES",
]

GATEWAY_CONNECTIONS: Final = 0
GATEWAY_FRAMES_IN: Final = 1
# Of its connections, those that have completed CONNECT (the others are still connecting:
# each gateway keeps its own list of those, `Gateway.arrivals`).
GATEWAY_CONNECTED: Final = 2

# Totals since the pipeline started (each incarnation counts from 0).
PIPELINE_RECEIVED: Final = 0
PIPELINE_DELIVERED: Final = 1
# The destinations it holds now (broker.max_destinations adds up every pipeline's).
PIPELINE_DESTINATIONS: Final = 2

REPLAY_BATCHES: Final = 0
REPLAY_MESSAGES: Final = 1
