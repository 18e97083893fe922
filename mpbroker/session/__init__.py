"""The server side of one STOMP connection, as sans-IO logic the gateway shell drives.

* `GatewaySession`: frames and pipeline answers in, bytes and records out
  (`take_output()`), with one state (`SessionState`) whose transitions are a table
  (`_state`).
* `Admission`, `Pacer`: whether a SEND may go now, must wait for room (flow control, a large
  message while memory is short) or must wait its turn (rate-based flow, MemWatch
  throttling). Pure decisions; the shell does the waiting.
* `TransactionBudget`: the open transactions of a gateway's connections within
  `[transactions]`'s limits, and which ones `reduce_strategy` or `timeout_ms` discards
  (`_transactions`); shared by the gateway's sessions, which say so to their clients.
"""

from ._admission import MEMORY_PACE, Admission, Pace, Pacer, flow_controlled
from ._session import GatewaySession, SessionError, SessionOutput
from ._state import Event, SessionState, SessionStateError
from ._transactions import (
    Discarded,
    OpenTransaction,
    ReduceStrategy,
    TransactionBudget,
    TransactionDiscarded,
    pick_victims,
)

__all__ = [
    "MEMORY_PACE",
    "Admission",
    "Discarded",
    "Event",
    "GatewaySession",
    "OpenTransaction",
    "Pace",
    "Pacer",
    "ReduceStrategy",
    "SessionError",
    "SessionOutput",
    "SessionState",
    "SessionStateError",
    "TransactionBudget",
    "TransactionDiscarded",
    "flow_controlled",
    "pick_victims",
]
