"""Which modules a wheel compiles with mypyc, and whether this process runs them compiled.

The hot modules carry every message: the STOMP codec, the gateway's session, the engines,
the rings, flow accounting and the pipeline workers' loop. setup.py compiles them when a
wheel is built (docs/benchmarks.md, "Compiled modules"); everywhere else, and wherever a
build could not compile them, the same modules run as pure Python. Nothing here imports
anything of the package: setup.py reads this file before the package can be imported.
"""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

__all__ = ["HOT_MODULES", "compiled_modules", "describe"]

#: Compiled together as one mypyc group (setup.py). Each must stay within what mypyc
#: compiles: no table of methods in a class body (call them in a chain of tests), no
#: subclass of a builtin type (an Enum), and no class of another module may derive from
#: one of their classes. Compiled classes check argument types when called (a TypeError
#: where pure Python would have gone on) and take no weak references.
HOT_MODULES: tuple[str, ...] = (
    "mpbroker.stomp._frame",
    "mpbroker.stomp._escape",
    "mpbroker.stomp._parser",
    "mpbroker.stomp._encoder",
    "mpbroker.session._admission",
    "mpbroker.session._transactions",
    "mpbroker.session._session",
    "mpbroker.engine._common",
    "mpbroker.engine._pending",
    "mpbroker.engine._queue",
    "mpbroker.engine._topic",
    "mpbroker.engine._totals",
    "mpbroker.shm._ring",
    "mpbroker.shm._doorbell",
    "mpbroker.shm._control",
    "mpbroker.flow._limits",
    "mpbroker.flow._watermark",
    "mpbroker.flow._gate",
    "mpbroker.pipeline._base",
    "mpbroker.pipeline._p2p",
    "mpbroker.pipeline._pubsub",
    "mpbroker.workers._outlet",
    "mpbroker.workers._gateway_loops",
    "mpbroker.workers.pipeline",
)


def compiled_modules() -> list[str]:
    """The hot modules this installation has compiled: those an import finds as extension
    modules (Python's path finder tries those before a module's source), told from the
    files, so that asking imports none of them (the supervisor runs none)."""
    root = Path(__file__).resolve().parent.parent
    found = []
    for name in HOT_MODULES:
        stem = root.joinpath(*name.split("."))
        if any(
            stem.with_name(stem.name + suffix).exists()
            for suffix in importlib.machinery.EXTENSION_SUFFIXES
        ):
            found.append(name)
    return found


def describe() -> str:
    """One line for logs and --version: compiled or pure Python."""
    compiled = len(compiled_modules())
    if compiled == len(HOT_MODULES):
        return f"hot modules compiled with mypyc ({compiled})"
    if compiled:
        return f"{compiled} of {len(HOT_MODULES)} hot modules compiled with mypyc"
    return "pure Python (hot modules not compiled)"
