"""JMS 1.1 message selectors (§3.8.1), compatible with ActiveMQ's and Artemis'. Pure logic.

docs/selectors.md is the language's reference for users.

* `compile_selector(text) -> Selector`: parses and compiles once; ``selector.matches(message)``
  is True when the selector is TRUE for the message (SQL's three-valued logic: FALSE and
  UNKNOWN both leave it out).
* `parse_selector(text)`: the AST alone (frozen nodes, `mpbroker.selector._ast`).
* `SelectorError`: a selector that does not parse, with the column of the problem.
* `SelectorIndex`: many subscriptions' selectors, indexed on one equality (or IN, or IS NULL)
  of each, so that the subscriptions a message does not concern cost it nothing.

Identifiers read the message's STOMP headers as text (missing: NULL), except the JMS header
fields JMSMessageID, JMSPriority, JMSTimestamp, JMSType, JMSCorrelationID, JMSDeliveryMode
and JMSExpiration (`_values`). Nothing here does I/O.
"""

from ._compile import Selector, compile_selector
from ._errors import SelectorError
from ._index import SelectorIndex
from ._parser import parse_selector

__all__ = ["Selector", "SelectorError", "SelectorIndex", "compile_selector", "parse_selector"]
