"""The server side of one STOMP connection, as sans-IO logic the gateway shell drives.

* `GatewaySession`: frames and pipeline answers in, bytes and records out
  (`take_output()`), with one state (`SessionState`) whose transitions are a table
  (`_state`).
* `Admission`, `Pacer`: whether a SEND may go now, must wait for room (flow control, a large
  message while memory is short) or must wait its turn (rate-based flow, MemWatch
  throttling). Pure decisions; the shell does the waiting.
"""

from ._admission import MEMORY_PACE, Admission, Pace, Pacer, flow_controlled
from ._session import GatewaySession, SessionError, SessionOutput, TransactionBudget
from ._state import Event, SessionState, SessionStateError

__all__ = [
    "MEMORY_PACE",
    "Admission",
    "Event",
    "GatewaySession",
    "Pace",
    "Pacer",
    "SessionError",
    "SessionOutput",
    "SessionState",
    "SessionStateError",
    "TransactionBudget",
    "flow_controlled",
]
