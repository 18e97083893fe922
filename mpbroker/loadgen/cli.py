"""Options of ``mpbroker bench``, and the run they describe.

Example: 1 producer -> 1 consumer, 200000 100-byte queue messages, first against the
baseline server, then against a broker the bench starts and stops itself::

    mpbroker bench --count 200000 --baseline

The selector study (``--filters``, ``--filter-targets``) is
:mod:`mpbroker.loadgen.filterbench`.

Exit status: 0 when every run delivered every message exactly once with no ERROR frame,
1 otherwise, 2 for invalid options.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field, replace

from mpbroker.harness import BrokerProcess, ServerError, ServerProcess

from .cpu import listening_server_pid
from .filterbench import add_filter_arguments, run_filters
from .report import RunResult, format_json, format_table
from .runner import run_scenario
from .scenario import ACK_MODES, Scenario, check_counts
from .wire import BODY_HEADER_BYTES

__all__ = ["add_arguments", "run_from_args", "scenario_from_args"]

_DEFAULTS = Scenario()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``mpbroker bench`` to ``parser``."""
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="server address (default %(default)s)")
    server.add_argument(
        "--port",
        type=int,
        help="port of a running server; without it the bench starts a broker on a free port"
        " (with a temporary data directory) and stops it afterwards",
    )
    server.add_argument(
        "--server-pid",
        type=int,
        metavar="PID",
        help="with --port: the server process whose CPU (with its children's) is reported per"
        " message (default: the process listening on --port, or for mpbroker its supervisor,"
        " when this user may see it)",
    )
    server.add_argument(
        "--gateways", type=int, metavar="N", help="gateway processes of the broker it starts"
    )
    server.add_argument(
        "--baseline",
        action="store_true",
        help="first run the same scenario against the single-process baseline server"
        " (python -m mpbroker.loadgen.baseline) and report the ratios",
    )

    load = parser.add_argument_group("load")
    load.add_argument(
        "--producers",
        type=int,
        default=_DEFAULTS.producers,
        metavar="N",
        help="producer processes (default %(default)s)",
    )
    load.add_argument(
        "--consumers",
        type=int,
        default=_DEFAULTS.consumers,
        metavar="N",
        help="consumer processes, each with one subscription (default %(default)s)",
    )
    load.add_argument(
        "--destination",
        default=_DEFAULTS.destination,
        help="/queue/NAME, or /topic/NAME for fan-out: every consumer gets every message"
        " (default %(default)s)",
    )
    load.add_argument(
        "--size",
        type=int,
        default=_DEFAULTS.size_bytes,
        metavar="BYTES",
        help=f"message body size, at least {BODY_HEADER_BYTES} (default %(default)s)",
    )
    load.add_argument(
        "--count",
        type=int,
        default=_DEFAULTS.count,
        metavar="N",
        help="messages per producer (default %(default)s)",
    )
    load.add_argument("--persistent", action="store_true", help="send with persistent:true")
    load.add_argument(
        "--ack",
        choices=ACK_MODES,
        default=_DEFAULTS.ack,
        help="consumer ack mode (default %(default)s)",
    )
    load.add_argument(
        "--prefetch",
        type=int,
        default=_DEFAULTS.prefetch,
        metavar="N",
        help="window of unacknowledged deliveries, sent as activemq.prefetchSize and"
        " prefetch-count (RabbitMQ's) (default %(default)s)",
    )
    load.add_argument(
        "--ack-every",
        type=int,
        metavar="N",
        help="client modes: acknowledge every N messages"
        f" (default {_DEFAULTS.ack_every}, at most half the prefetch)",
    )

    flow = parser.add_argument_group("producer flow")
    flow.add_argument(
        "--receipt-every",
        type=int,
        default=_DEFAULTS.receipt_every,
        metavar="N",
        help="ask for a RECEIPT every N messages (default %(default)s)",
    )
    flow.add_argument(
        "--max-in-flight",
        type=int,
        default=_DEFAULTS.max_in_flight,
        metavar="N",
        help="most outstanding receipts per producer (default %(default)s)",
    )
    flow.add_argument(
        "--max-backlog",
        type=int,
        default=_DEFAULTS.max_backlog,
        metavar="N",
        help="producers pause while this many messages ahead of the consumers"
        " (default %(default)s)",
    )

    output = parser.add_argument_group("measurement and output")
    output.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run N times against each server, alternating; ratios use medians (default 1)",
    )
    output.add_argument(
        "--timeout",
        type=float,
        default=_DEFAULTS.stall_timeout_s,
        metavar="S",
        help="abort when nothing arrives for S seconds (default %(default)g)",
    )
    output.add_argument(
        "--json", action="store_true", help="print one JSON line instead of the table"
    )
    add_filter_arguments(parser)


# The selector study's options, and their defaults: given without --filters or
# --filter-targets they would do nothing, so they are refused.
_FILTER_ONLY = (
    ("--filter-subscribers", "filter_subscribers"),
    ("--filter-kinds", "filter_kinds"),
    ("--filter-components", "filter_components"),
    ("--replication", "replication"),
    ("--filter-connections", "filter_connections"),
    ("--filter-seconds", "filter_seconds"),
)


def _filter_option_given(args: argparse.Namespace) -> str:
    """The first selector-study option given a value of its own, or ''."""
    defaults = argparse.ArgumentParser()
    add_filter_arguments(defaults)
    default = defaults.parse_args([])
    for option, dest in _FILTER_ONLY:
        if getattr(args, dest) != getattr(default, dest):
            return option
    return ""


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    """The :class:`Scenario` the options describe; ``ValueError`` says which one is wrong."""
    check_counts({"--producers": args.producers, "--consumers": args.consumers}, args)
    if not args.destination.startswith(("/queue/", "/topic/")):
        raise ValueError(
            f"--destination must be /queue/NAME or /topic/NAME, got {args.destination!r}"
        )
    if args.size < BODY_HEADER_BYTES:
        raise ValueError(
            f"--size must be at least {BODY_HEADER_BYTES} bytes (the body carries a run token,"
            f" the producer and the sequence number), got {args.size}"
        )
    if args.timeout <= 0:
        raise ValueError(f"--timeout must be positive, got {args.timeout}")
    if args.gateways is not None and args.port is not None:
        raise ValueError("--gateways applies to a broker the bench starts, not with --port")
    if args.server_pid is not None and args.port is None:
        raise ValueError("--server-pid applies with --port (a broker the bench starts is known)")
    # A consumer that waits for more messages than its window holds before acknowledging
    # would stall until its idle flush; half the window keeps deliveries flowing.
    if args.ack_every is None:
        ack_every = max(1, min(_DEFAULTS.ack_every, args.prefetch // 2))
    elif not 1 <= args.ack_every <= args.prefetch:
        raise ValueError(
            f"--ack-every must be between 1 and --prefetch ({args.prefetch}), got {args.ack_every}"
        )
    else:
        ack_every = args.ack_every
    return Scenario(
        producers=args.producers,
        consumers=args.consumers,
        destination=args.destination,
        size_bytes=args.size,
        count=args.count,
        persistent=args.persistent,
        ack=args.ack,
        prefetch=args.prefetch,
        receipt_every=args.receipt_every,
        max_in_flight=args.max_in_flight,
        max_backlog=args.max_backlog,
        ack_every=ack_every,
        stall_timeout_s=args.timeout,
    )


def _say(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


@dataclass(eq=False)
class _Target:
    """A server runs go to: one the bench started (``process``), or one given by --port."""

    name: str
    host: str
    port: int
    process: ServerProcess | None = None
    runs: list[RunResult] = field(default_factory=list)
    # Whose CPU the report counts: the process the bench started, or the one of --port.
    pid: int | None = None


def _start(process: ServerProcess) -> _Target:
    process.start()
    _say(f"{process.name} (pid {process.pid}) ready on {process.host}:{process.port}")
    return _Target(process.name, process.host, process.port, process, pid=process.pid)


def _stop(target: _Target) -> str:
    """Stop a server the bench started; returns what went wrong, or ''."""
    if target.process is None:
        return ""
    try:
        target.process.stop_checked()
    except ServerError as exc:
        return str(exc)
    return ""


def run_from_args(args: argparse.Namespace) -> int:
    """Run what the options say, print the report; returns the exit status."""
    if args.filters or args.filter_targets:
        return run_filters(args)
    if option := _filter_option_given(args):
        _say(f"{option} applies with --filters or --filter-targets")
        return 2
    try:
        scenario = scenario_from_args(args)
    except ValueError as exc:
        _say(str(exc))
        return 2
    targets: list[_Target] = []
    failure = ""
    try:
        # Servers start once and serve every repetition: a broker takes a second or more to
        # start, and the runs alternate between servers so that a burst of someone else's
        # load on this shared machine hits both sides alike.
        if args.baseline:
            targets.append(_start(ServerProcess.baseline(args.host)))
        if args.port is None:
            targets.append(_start(BrokerProcess(gateways=args.gateways, admin=False)))
        else:
            pid = args.server_pid or listening_server_pid(args.port)
            if pid is None:
                _say(f"no process found listening on port {args.port}: server CPU unknown")
            targets.append(_Target(f"{args.host}:{args.port}", args.host, args.port, pid=pid))
        for repetition in range(args.repeat):
            for target in targets:
                of = f" ({repetition + 1}/{args.repeat})" if args.repeat > 1 else ""
                _say(f"running {scenario.label} against {target.name}{of}")
                result = run_scenario(
                    scenario, target.host, target.port, server=target.name, server_pid=target.pid
                )
                target.runs.append(result)
    except ServerError as exc:
        failure = str(exc)
    finally:
        for target in targets:
            problem = _stop(target)
            if problem and target.runs:
                last = target.runs[-1]
                target.runs[-1] = replace(last, errors=(*last.errors, problem))
            elif problem:
                failure = failure or problem
    runs = [run for target in targets for run in target.runs]
    # Report in the order the runs happened.
    runs.sort(key=lambda run: run.started)
    if failure:
        _say(failure)
    if runs:
        print(format_json(runs) if args.json else format_table(runs), flush=True)
    return 0 if runs and not failure and all(run.ok for run in runs) else 1
