"""A multi-process, pipelined STOMP load generator for mpbroker.

``python -m bench`` (or ``mpbroker bench``) starts producer and consumer processes that write
and read many frames per system call, checks that every message arrived exactly once (in
order, for topics), and prints msgs/s sent, received and total. ``--baseline`` first runs the
same scenario against :mod:`bench.baseline`, a single-process STOMP forwarder on the same
codec, and quotes the broker's numbers as ratios of it: this 2-core machine is shared and
noisy, so absolute numbers mean little across invocations.

Modules: :mod:`bench.cli` (options; ``add_arguments`` and ``run_from_args`` also serve
``mpbroker bench``), :mod:`bench.scenario` (what a run does), :mod:`bench.runner` (one run:
processes, start line, clock, timeouts), :mod:`bench.control` (what the coordinator shares
with its processes), :mod:`bench.producer` and :mod:`bench.consumer` (the processes),
:mod:`bench.wire` (pre-encoded SEND frames, body layout), :mod:`bench.tally` (what
arrived; pure), :mod:`bench.report` (table and JSON), :mod:`bench.cpu` (CPU time from
/proc) and :mod:`bench.baseline` (the reference server). Servers are started and spoken to
with :mod:`mpbroker.harness`.
"""
