"""``mpbroker bench``: a multi-process, pipelined STOMP load generator.

It starts producer and consumer processes that write and read many frames per system call,
checks that every message arrived exactly once (in order, for topics), and prints msgs/s sent,
received and total. ``--baseline`` first runs the same scenario against
:mod:`mpbroker.loadgen.baseline`, a single-process STOMP forwarder on the same codec, and
quotes the broker's numbers as ratios of it: this 2-core machine is shared and noisy, so
absolute numbers mean little across invocations.

Modules: :mod:`~mpbroker.loadgen.cli` (the options and the run they describe),
:mod:`~mpbroker.loadgen.scenario` (what a run does), :mod:`~mpbroker.loadgen.runner` (one
run: processes, start line, clock, timeouts), :mod:`~mpbroker.loadgen.control` (what the
coordinator shares with its processes), :mod:`~mpbroker.loadgen.producer` and
:mod:`~mpbroker.loadgen.consumer` (the processes), :mod:`~mpbroker.loadgen.wire`
(pre-encoded SEND frames, body layout), :mod:`~mpbroker.loadgen.tally` (what arrived; pure),
:mod:`~mpbroker.loadgen.report` (table and JSON), :mod:`~mpbroker.loadgen.cpu` (CPU time from
/proc) and :mod:`~mpbroker.loadgen.baseline` (the reference server, ``python -m
mpbroker.loadgen.baseline``). Servers are started and spoken to with :mod:`mpbroker.harness`.

The selector study (``--filters``, ``--filter-targets``; Henjes et al., ITC 2007):
:mod:`~mpbroker.loadgen.filterbench` (options, the grid, the targets, the report),
:mod:`~mpbroker.loadgen.filters` (selectors, message properties, who selects what, the
check; pure), :mod:`~mpbroker.loadgen.model` (the least-squares fit; pure),
:mod:`~mpbroker.loadgen.filterrun` (one point) and :mod:`~mpbroker.loadgen.filterproc` (its
producer and subscriber processes).
"""
