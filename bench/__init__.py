"""Studies of mpbroker, run from a checkout's root; not installed.

Each is ``python -m bench.NAME [--help]``: ``soak`` (slow consumers), ``memsoak`` (memory
under a flood), ``fixedcost`` (an idle broker's memory), ``unitcost`` (memory per connection,
subscription and waiting message), ``exportrate`` (export and ingest speed), ``replay``
(durable replay speed), ``ring``, ``store``, ``codec`` and ``compression`` (micro-benchmarks).
They start brokers and speak to them with :mod:`mpbroker.harness` and reuse the load
generator's pieces from :mod:`mpbroker.loadgen`; the load generator itself is
``mpbroker bench``.
"""
