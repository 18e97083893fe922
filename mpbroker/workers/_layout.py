"""Names of every shared segment of one broker instance, and the worker specification.

The supervisor creates every segment named here; workers attach to them. Both sides
derive the names from the same `Layout`, so there is one place that knows them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mpbroker.config import Config
from mpbroker.routing import Topology
from mpbroker.shm import segment_name

__all__ = [
    "Layout",
    "WorkerSpec",
    "durable_registry",
    "reloaded_config",
    "store_directory",
    "temp_directory",
]


@dataclass(frozen=True, slots=True)
class Layout:
    instance: str
    gateways: int
    topology: Topology
    replayers: int = 1

    @property
    def control(self) -> str:
        return segment_name(self.instance, "control")

    @property
    def addresses(self) -> str:
        """The gateways' connections per client address (`AddressCounts`)."""
        return segment_name(self.instance, "addresses")

    def to_pipeline(self, gateway: int, pipeline: int) -> str:
        """Ring written by a gateway, read by a pipeline."""
        return segment_name(self.instance, f"g{gateway}-p{pipeline}")

    def to_gateway(self, pipeline: int, gateway: int) -> str:
        """Ring written by a pipeline, read by a gateway."""
        return segment_name(self.instance, f"p{pipeline}-g{gateway}")

    def gateway_bell(self, gateway: int) -> str:
        return segment_name(self.instance, f"bell-g{gateway}")

    def pipeline_bell(self, pipeline: int) -> str:
        return segment_name(self.instance, f"bell-p{pipeline}")

    def to_replay(self, pipeline: int) -> str:
        """Ring written by a pubsub pipeline (replay requests), read by its replay worker."""
        return segment_name(self.instance, f"p{pipeline}-r")

    def from_replay(self, pipeline: int) -> str:
        """Ring written by a replay worker (replayed batches), read by a pubsub pipeline."""
        return segment_name(self.instance, f"r-p{pipeline}")

    def replay_bell(self, replayer: int) -> str:
        return segment_name(self.instance, f"bell-r{replayer}")

    def replayer_of(self, pipeline: int) -> int:
        """The replay worker serving a pubsub pipeline's durable subscriptions."""
        _, local = self.topology.role(pipeline)
        return local % self.replayers

    def served_by(self, replayer: int) -> list[int]:
        """The pubsub pipelines a replay worker serves."""
        topology = self.topology
        return [
            p for p in range(topology.p2p, topology.pipelines) if self.replayer_of(p) == replayer
        ]

    def stats(self, slot: int) -> str:
        """Stats block of the worker in control-block slot `slot` (read by the admin API)."""
        return segment_name(self.instance, f"stats-{slot}")

    @property
    def workers(self) -> int:
        return self.gateways + self.topology.pipelines + self.replayers

    def gateway_slot(self, gateway: int) -> int:
        return gateway

    def pipeline_slot(self, pipeline: int) -> int:
        return self.gateways + pipeline

    def replay_slot(self, replayer: int) -> int:
        return self.gateways + self.topology.pipelines + replayer

    def slot(self, role: str, index: int) -> int:
        """The control-block slot of a worker."""
        if role == "gateway":
            return self.gateway_slot(index)
        if role == "replay":
            return self.replay_slot(index)
        return self.pipeline_slot(index)


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything a worker process needs to start (pickled into the spawned process)."""

    role: str  # "gateway" | "p2p" | "pubsub" | "replay"
    index: int  # gateway or replay worker index, or pipeline index (p2p first, then pubsub)
    incarnation: int
    layout: Layout
    config: Config
    port: int
    # The STOMP over TLS port the supervisor reserved (-1: no TLS listener).
    tls_port: int = -1
    # The STOMP over WebSocket ports, plain and over TLS (-1: none).
    ws_port: int = -1
    wss_port: int = -1

    @property
    def title(self) -> str:
        """Process title and log role, e.g. 'gateway 0', 'p2p 0', 'pubsub 0', 'replay 0'."""
        if self.role in ("gateway", "replay"):
            return f"{self.role} {self.index}"
        kind, local = self.layout.topology.role(self.index)
        return f"{kind} {local}"

    @property
    def slot(self) -> int:
        return self.layout.slot(self.role, self.index)


def store_directory(config: Config, role: str, pipeline: int) -> Path:
    """A pipeline's message store: <data_dir>/p2p-<i> or <data_dir>/pubsub-<i>."""
    return Path(config.broker.data_dir) / f"{role}-{pipeline}"


def temp_directory(config: Config, role: str, pipeline: int) -> Path:
    """A pipeline's temp store (paged non-persistent bodies): <data_dir>/<role>-<i>-temp."""
    return Path(config.broker.data_dir) / f"{role}-{pipeline}-temp"


def durable_registry(config: Config, pipeline: int) -> Path:
    """A pubsub pipeline's durable subscriptions and what each still has to receive."""
    return Path(config.broker.data_dir) / f"pubsub-{pipeline}-durable.db"


def reloaded_config(config: Config, instance: str) -> Path:
    """Where the supervisor leaves the settings it reloaded on SIGHUP for its workers."""
    return Path(config.broker.data_dir) / f".reloaded-config-{instance}.pickle"
