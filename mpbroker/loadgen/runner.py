"""One run of a scenario against one server: processes, the start line, the clock, timeouts.

Consumers connect and subscribe (with a receipt) first; then producers connect; then one
event starts every producer at once. The coordinator watches the shared progress counters:
when every expected delivery arrived it tells consumers to stop, and when nothing arrived
for ``stall_timeout_s`` it aborts the run with a message that says how far it got. Every
process it started is gone when :func:`run_scenario` returns, whatever happened.

:class:`ProcessRun` is that machinery; a run of a :class:`Scenario` and a point of the
selector study (:mod:`mpbroker.loadgen.filterrun`) say what their processes run, how many
deliveries are due and what the result is.
"""

from __future__ import annotations

import multiprocessing
import queue
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any, Generic, TypeVar

from .consumer import consumer_main
from .control import (
    STARTUP_TIMEOUT_S,
    ConsumerResult,
    Control,
    ProducerResult,
    Ready,
    WorkerMessage,
)
from .cpu import tree_cpu_by_process, tree_memory_bytes
from .producer import producer_main
from .report import RunResult
from .scenario import Scenario
from .tally import Tally, check

__all__ = ["ProcessRun", "run_scenario"]

ResultT = TypeVar("ResultT")

# How often the coordinator looks at the progress counters.
_POLL_S = 0.02
# After the stop: time for consumers to acknowledge, disconnect and send their tallies.
_FINISH_TIMEOUT_S = 15.0
# A process that does not exit this long after it reported is terminated.
_JOIN_TIMEOUT_S = 5.0


class _Abort(Exception):
    """Ends the run early; the message says why (and goes into the report)."""


def run_scenario(
    scenario: Scenario, host: str, port: int, *, server: str, server_pid: int | None = None
) -> RunResult:
    """Run ``scenario`` against the STOMP server at ``host:port``; never raises for a
    failure of the run itself (the result says what went wrong)."""
    return _Run(scenario, host, port, server, server_pid).run()


class ProcessRun(ABC, Generic[ResultT]):
    """The processes of one run and their start, watch and end; subclasses say what the
    processes run (:meth:`_entry`), how many deliveries are due (:meth:`_expected`) and
    what the result is (:meth:`_result`). ``scenario`` gives the number of producer and
    consumer processes, the stall timeout and the count."""

    def __init__(
        self, scenario: Scenario, host: str, port: int, server: str, server_pid: int | None
    ) -> None:
        self.scenario = scenario
        self.host = host
        self.port = port
        self.server = server
        self.server_pid = server_pid
        self.ctx = multiprocessing.get_context("spawn")
        self.control = Control.create(self.ctx, scenario.producers, scenario.consumers)
        # Tags this run's message bodies, so leftovers of an earlier run are not counted.
        self.token = secrets.token_hex(4).encode()
        self.processes: list[BaseProcess] = []
        self.ready: set[tuple[str, int]] = set()
        self.producer_results: dict[int, ProducerResult] = {}
        self.consumer_results: dict[int, ConsumerResult] = {}
        self.server_cpu_start: dict[str, float] | None = None
        self.server_cpu_s: float | None = None
        # Per process of the server, the CPU seconds of those that ran all the run through.
        self.server_cpu_by_process: dict[str, float] = {}
        self.server_memory_bytes: int | None = None
        self.started = time.monotonic()

    @abstractmethod
    def _entry(self, role: str, index: int) -> tuple[Callable[..., None], tuple[Any, ...]]:
        """What process ``index`` of ``role`` runs: its function and arguments."""

    @abstractmethod
    def _expected(self) -> int | None:
        """Deliveries due in all (None: not known yet)."""

    @abstractmethod
    def _result(self, aborted: str) -> ResultT:
        """The result, from what the processes reported (``aborted``: why it ended early)."""

    def run(self) -> ResultT:
        aborted = ""
        try:
            try:
                self._start_consumers()
                self._start_producers()
                self.server_cpu_start = self._server_cpu()
                self.control.start.set()
                self._watch()
                end = self._server_cpu()
                start = self.server_cpu_start
                if end is not None and start is not None:
                    self.server_cpu_s = sum(end.values()) - sum(start.values())
                    self.server_cpu_by_process = {
                        name: seconds - start[name]
                        for name, seconds in end.items()
                        if name in start
                    }
                # Once every delivery arrived, before the clients go: what the server
                # holds for the load it just carried.
                if self.server_pid is not None:
                    self.server_memory_bytes = tree_memory_bytes(self.server_pid)
            except _Abort as exc:
                aborted = str(exc)
            self.control.stop.set()
            self._collect_results()
        finally:
            self._end_processes()
        return self._result(aborted)

    # -- phases ----------------------------------------------------------------------------

    def _spawn(self, role: str, index: int) -> None:
        target, args = self._entry(role, index)
        process = self.ctx.Process(
            target=target,
            args=args,
            name=f"bench-{role}-{index}",
            daemon=True,
        )
        process.start()
        self.processes.append(process)

    def _start_consumers(self) -> None:
        for index in range(self.scenario.consumers):
            self._spawn("consumer", index)
        self._wait_ready("consumer", self.scenario.consumers)

    def _start_producers(self) -> None:
        for index in range(self.scenario.producers):
            self._spawn("producer", index)
        self._wait_ready("producer", self.scenario.producers)

    def _wait_ready(self, role: str, count: int) -> None:
        timeout = max(self.scenario.stall_timeout_s, STARTUP_TIMEOUT_S)
        deadline = time.monotonic() + timeout
        while sum(1 for r, _ in self.ready if r == role) < count:
            if time.monotonic() > deadline:
                raise _Abort(f"{role}s were not connected within {timeout:g} s")
            self._take_messages(_POLL_S)
            self._check_failures()

    def _watch(self) -> None:
        """Until every delivery arrived; raises _Abort on a stall or a failed process."""
        scenario = self.scenario
        received = self.control.received
        stall = scenario.stall_timeout_s
        last_total = -1
        last_progress = time.monotonic()
        while True:
            self._take_messages(_POLL_S)
            self._check_failures()
            total = sum(received)
            now = time.monotonic()
            if total != last_total:
                last_total = total
                last_progress = now
            expected = self._expected()
            if (
                expected is not None
                and total >= expected
                and len(self.producer_results) == scenario.producers
            ):
                return
            if now - last_progress > stall:
                due = "?" if expected is None else str(expected)
                raise _Abort(
                    f"no message received for {stall:g} s: {total} of {due} deliveries"
                    f" arrived, {sum(self.control.sent)} of"
                    f" {scenario.producers * scenario.count} messages were sent"
                )

    def _collect_results(self) -> None:
        deadline = time.monotonic() + _FINISH_TIMEOUT_S
        wanted = self.scenario.producers + self.scenario.consumers
        while len(self.producer_results) + len(self.consumer_results) < wanted:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._take_messages(min(left, _POLL_S))
            if self._all_exited():
                # Whatever is still in the queue was flushed before the processes exited.
                self._take_messages(0.2)
                return

    def _end_processes(self) -> None:
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                process.terminate()
                process.join(_JOIN_TIMEOUT_S)
            if process.is_alive():
                process.kill()
                process.join()
        self.control.results.close()
        self.control.results.join_thread()

    # -- helpers ---------------------------------------------------------------------------

    def _server_cpu(self) -> dict[str, float] | None:
        return None if self.server_pid is None else tree_cpu_by_process(self.server_pid)

    def _take_messages(self, timeout_s: float) -> None:
        """Handle what processes reported, waiting up to ``timeout_s`` for the first."""
        results = self.control.results
        try:
            message: WorkerMessage = results.get(timeout=timeout_s)
            while True:
                self._handle(message)
                message = results.get_nowait()
        except queue.Empty:
            pass

    def _handle(self, message: WorkerMessage) -> None:
        if isinstance(message, Ready):
            self.ready.add((message.role, message.index))
        elif isinstance(message, ProducerResult):
            self.producer_results[message.index] = message
        else:
            self.consumer_results[message.index] = message

    def _check_failures(self) -> None:
        for role, results in (
            ("producer", self.producer_results),
            ("consumer", self.consumer_results),
        ):
            for index, result in results.items():
                if result.error:
                    raise _Abort(f"{role} {index} failed (see its error)")
        reported = {f"bench-producer-{i}" for i in self.producer_results} | {
            f"bench-consumer-{i}" for i in self.consumer_results
        }
        for process in self.processes:
            if process.exitcode is not None and process.name not in reported:
                # It may have reported just before exiting; look once more.
                self._take_messages(0.2)
                if process.exitcode != 0 or not self._reported(process.name):
                    raise _Abort(f"{process.name} died with exit status {process.exitcode}")

    def _reported(self, name: str) -> bool:
        role, index = name.removeprefix("bench-").rsplit("-", 1)
        results: dict[int, ProducerResult] | dict[int, ConsumerResult] = (
            self.producer_results if role == "producer" else self.consumer_results
        )
        return int(index) in results

    def _all_exited(self) -> bool:
        return all(process.exitcode is not None for process in self.processes)

    def _process_errors(self, aborted: str) -> list[str]:
        """Errors the processes reported, and processes that did not report."""
        errors: list[str] = []
        for p_result in self.producer_results.values():
            if p_result.error:
                errors.append(f"producer {p_result.index}: {p_result.error}")
        for c_result in self.consumer_results.values():
            if c_result.error:
                errors.append(f"consumer {c_result.index}: {c_result.error}")
        for index in range(self.scenario.producers):
            if index not in self.producer_results and not aborted:
                errors.append(f"producer {index} did not report")
        return errors


class _Run(ProcessRun[RunResult]):
    """A run of a :class:`Scenario`: its producers and consumers, every message checked."""

    def _entry(self, role: str, index: int) -> tuple[Callable[..., None], tuple[Any, ...]]:
        target = consumer_main if role == "consumer" else producer_main
        return target, (index, self.scenario, self.host, self.port, self.token, self.control)

    def _expected(self) -> int | None:
        return self.scenario.expected_deliveries

    def _result(self, aborted: str) -> RunResult:
        scenario = self.scenario
        errors = self._process_errors(aborted)
        tallies: list[Tally] = [
            r.tally for r in self.consumer_results.values() if r.tally is not None
        ]
        if len(tallies) < scenario.consumers and not aborted:
            errors.append(f"{scenario.consumers - len(tallies)} consumers did not report")
        result = check(
            tallies,
            topic=scenario.is_topic,
            producers=scenario.producers,
            consumers=scenario.consumers,
            count=scenario.count,
        )
        starts = [r.first_send for r in self.producer_results.values() if r.first_send]
        first_send = min(starts) if starts else 0.0
        dones = [r.done for r in self.producer_results.values() if r.done]
        last_receive = max((r.last_receive for r in self.consumer_results.values()), default=0.0)
        return RunResult(
            server=self.server,
            server_pid=self.server_pid,
            started=self.started,
            scenario=scenario,
            sent=sum(self.control.sent),
            check=result,
            send_s=max(dones) - first_send if dones and first_send else 0.0,
            elapsed_s=last_receive - first_send if last_receive and first_send else 0.0,
            errors=tuple(errors),
            aborted=aborted,
            producer_cpu_s=sum(r.cpu_s for r in self.producer_results.values()),
            consumer_cpu_s=sum(r.cpu_s for r in self.consumer_results.values()),
            server_cpu_s=self.server_cpu_s,
            server_memory_bytes=self.server_memory_bytes,
            server_cpu_by_process=self.server_cpu_by_process,
            consumer_reads=sum(r.reads for r in self.consumer_results.values()),
        )
