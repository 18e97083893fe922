"""One point of the filter study against one server: its processes, its clock, its check."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .filterproc import (
    FilterConsumerResult,
    FilterPoint,
    filter_consumer_main,
    filter_producer_main,
)
from .filters import FilterCheck, FilterTally, check
from .runner import ProcessRun
from .scenario import Scenario

__all__ = ["FilterRunResult", "run_point"]


@dataclass(frozen=True, slots=True)
class FilterRunResult:
    """What one point measured."""

    point: FilterPoint
    sent: int
    check: FilterCheck
    #: Seconds from the first send to the last delivery.
    elapsed_s: float
    #: Longest time a connection took to register its subscriptions.
    subscribe_s: float = 0.0
    errors: tuple[str, ...] = ()
    aborted: str = ""
    #: CPU seconds of the server (and its children) while messages flowed; None if unknown.
    server_cpu_s: float | None = None
    #: CPU seconds of the producer and subscriber processes while messages flowed.
    client_cpu_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.check.ok and not self.errors and not self.aborted

    @property
    def message_rate(self) -> float:
        """Messages published and fully delivered per second: the paper's throughput."""
        return self.sent / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def delivery_rate(self) -> float:
        return self.check.received / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def server_us_per_message(self) -> float | None:
        """Server CPU microseconds per message published (None if unknown)."""
        if self.server_cpu_s is None or not self.sent:
            return None
        return self.server_cpu_s / self.sent * 1e6

    @property
    def client_us_per_message(self) -> float:
        return self.client_cpu_s / self.sent * 1e6 if self.sent else 0.0

    def as_dict(self) -> dict[str, Any]:
        plan = self.point.plan
        us = self.server_us_per_message
        return {
            "destination": self.point.destination,
            "kind": plan.kind,
            "n": plan.subscribers,
            "m": plan.filter_components,
            "r": plan.replication,
            "keys": plan.keys,
            "connections": self.point.connections,
            "sent": self.sent,
            "expected": self.check.expected,
            "received": self.check.received,
            "missing": self.check.missing,
            "duplicated": self.check.duplicated,
            "unexpected": self.check.unexpected,
            "reordered": self.check.reordered,
            "elapsed_s": round(self.elapsed_s, 4),
            "messages_per_s": round(self.message_rate, 1),
            "deliveries_per_s": round(self.delivery_rate, 1),
            "server_cpu_s": None if self.server_cpu_s is None else round(self.server_cpu_s, 3),
            "server_us_per_message": None if us is None else round(us, 2),
            "client_us_per_message": round(self.client_us_per_message, 2),
            "subscribe_s": round(self.subscribe_s, 3),
            "ok": self.ok,
            "errors": list(self.errors),
            "aborted": self.aborted,
        }


def run_point(
    point: FilterPoint, host: str, port: int, *, server: str, server_pid: int | None = None
) -> FilterRunResult:
    """Run ``point`` against the STOMP server at ``host:port``; never raises for a failure
    of the run itself (the result says what went wrong)."""
    return _FilterRun(point, host, port, server, server_pid).run()


class _FilterRun(ProcessRun[FilterRunResult]):
    def __init__(
        self, point: FilterPoint, host: str, port: int, server: str, server_pid: int | None
    ) -> None:
        # The base class needs the process counts, the count and the stall timeout.
        scenario = Scenario(
            producers=1,
            consumers=point.connections,
            destination=point.destination,
            count=point.count,
            stall_timeout_s=point.stall_timeout_s,
        )
        super().__init__(scenario, host, port, server, server_pid)
        self.point = point

    def _entry(self, role: str, index: int) -> tuple[Callable[..., None], tuple[Any, ...]]:
        target = filter_consumer_main if role == "consumer" else filter_producer_main
        return target, (index, self.point, self.host, self.port, self.token, self.control)

    def _expected(self) -> int | None:
        # Known once the producer says how many it sent (the time budget may stop it early).
        result = self.producer_results.get(0)
        if result is None:
            return None
        return self.point.plan.expected_deliveries(result.sent, topic=self.point.topic)

    def _result(self, aborted: str) -> FilterRunResult:
        point = self.point
        errors = self._process_errors(aborted)
        results = [r for r in self.consumer_results.values() if isinstance(r, FilterConsumerResult)]
        tallies: list[FilterTally] = [r.filter_tally for r in results if r.filter_tally]
        if len(tallies) < point.connections and not aborted:
            errors.append(f"{point.connections - len(tallies)} connections did not report")
        producer = self.producer_results.get(0)
        sent = producer.sent if producer is not None else sum(self.control.sent)
        result = check(tallies, point.plan, topic=point.topic, sent=sent)
        first_send = producer.first_send if producer is not None else 0.0
        last_receive = max((r.last_receive for r in results), default=0.0)
        client_cpu = sum(r.cpu_s for r in results) + (producer.cpu_s if producer else 0.0)
        return FilterRunResult(
            point=point,
            sent=sent,
            check=result,
            elapsed_s=last_receive - first_send if last_receive and first_send else 0.0,
            subscribe_s=max((r.subscribe_s for r in results), default=0.0),
            errors=tuple(errors),
            aborted=aborted,
            server_cpu_s=self.server_cpu_s,
            client_cpu_s=client_cpu,
        )
