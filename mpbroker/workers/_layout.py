"""Names of every shared segment of one broker instance, and the worker specification.

The supervisor creates every segment named here; workers attach to them. Both sides
derive the names from the same `Layout`, so there is one place that knows them.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpbroker.config import Config
from mpbroker.routing import Topology
from mpbroker.shm import segment_name

__all__ = ["Layout", "WorkerSpec"]


@dataclass(frozen=True, slots=True)
class Layout:
    instance: str
    gateways: int
    topology: Topology

    @property
    def control(self) -> str:
        return segment_name(self.instance, "control")

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

    @property
    def workers(self) -> int:
        return self.gateways + self.topology.pipelines

    def gateway_slot(self, gateway: int) -> int:
        return gateway

    def pipeline_slot(self, pipeline: int) -> int:
        return self.gateways + pipeline


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything a worker process needs to start (pickled into the spawned process)."""

    role: str  # "gateway" | "p2p" | "pubsub"
    index: int  # gateway index, or pipeline index (p2p first, then pubsub)
    incarnation: int
    layout: Layout
    config: Config
    port: int

    @property
    def title(self) -> str:
        """Process title and log role, e.g. 'gateway 0', 'p2p 0', 'pubsub 0'."""
        if self.role == "gateway":
            return f"gateway {self.index}"
        kind, local = self.layout.topology.role(self.index)
        return f"{kind} {local}"

    @property
    def slot(self) -> int:
        if self.role == "gateway":
            return self.layout.gateway_slot(self.index)
        return self.layout.pipeline_slot(self.index)
