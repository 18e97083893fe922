"""Transaction memory of one gateway: what its connections' open transactions hold, the
limits on it, and which transactions go when they are exceeded. Pure: no clocks, no I/O.

One `TransactionBudget` is shared by every session of a gateway process (the shell makes it
and hands it to each `GatewaySession`). It bounds the message bytes held in open
transactions twice:

* per connection (`transactions.max_uncommitted_bytes_per_connection`; -1, the default,
  means up to the gateway's total): a SEND that would take its connection past it is
  refused. No other connection's transaction is discarded for it, since nothing another
  connection gives up could make room under this limit;
* per gateway (`transactions.max_uncommitted_bytes`): a SEND that would take the gateway
  past it makes room by discarding other connections' open transactions, picked by
  `transactions.reduce_strategy` (`pick_victims`; the iBus transaction manager's
  ``txmemsizereducestategy``), then goes in. With `none` it is refused instead.

A transaction open longer than `transactions.timeout_ms` is discarded the same way
(`TransactionBudget.expire`, fed a clock by the sessions' frames and the shell's loop).

The sender's own connection is never a victim, whatever the strategy (`all` included).
The reduction exists to make room for the SEND in hand: discarding the transaction it
belongs to would throw away what the room was made for, and discarding another transaction
of its connection would close that connection too (a victim gets an ERROR, which closes).
What one connection may take from the others is bounded by its per-connection limit, which
is what that limit is for. So with any strategy but `none`, a SEND within its connection's
limit always goes in (the per-connection limit is at most the total, so discarding every
other connection's transactions always makes room); one beyond it is refused, as is one
larger than the limit itself, which could never fit.

A victim is told through the sessions, not here: the budget removes the victim's open
transactions at once (their bytes are free for the SEND in hand) and keeps a `Discarded`
for its connection. The victim's session takes it (`take_discarded`) before it handles its
next frame, so a COMMIT can never deliver a discarded transaction, and the shell, which
asks `take_to_tell` after every read and every turn of its loop, has idle victims take
theirs and write their ERROR. The ERROR closes the connection, as every STOMP ERROR does:
so all open transactions of a victim's connection are discarded together, and a pick
frees all of its connection's bytes.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mpbroker.errors import LimitReached, Refusal

if TYPE_CHECKING:
    from mpbroker.config import TransactionSettings

__all__ = [
    "Discarded",
    "OpenTransaction",
    "ReduceStrategy",
    "TransactionBudget",
    "TransactionDiscarded",
    "pick_victims",
]


class ReduceStrategy(enum.Enum):
    """`transactions.reduce_strategy`: which open transactions are discarded when a SEND
    would take the gateway's total past `max_uncommitted_bytes` (iBus's MAXBYTES,
    MAXMESSAGES, OLDESTTX, YOUNGESTTX, ALL, NONE)."""

    #: The transaction holding the most bytes, then the next, until the SEND fits.
    MAX_BYTES = "max_bytes"
    #: The transaction holding the most messages (then the most bytes), one at a time.
    MAX_MESSAGES = "max_messages"
    #: The transaction begun first on this gateway, one at a time.
    OLDEST_TX = "oldest_tx"
    #: The transaction begun last on this gateway, one at a time.
    YOUNGEST_TX = "youngest_tx"
    #: Every open transaction of every other connection of the gateway, at once.
    ALL = "all"
    #: Nothing: the SEND that does not fit is refused.
    NONE = "none"


class TransactionDiscarded(Refusal):
    """An open transaction the broker rolled back to keep within a limit: ``ResourceAllocation:
    transactions <limit> <value> reached: transaction '<name>' <what happened>``, e.g.
    ``... max_uncommitted_bytes 2097152 reached: transaction 'tx1' discarded by
    reduce_strategy max_bytes``."""

    def __init__(self, transaction: str, limit: str, value: int, cause: str, detail: str) -> None:
        self.transaction = transaction
        self.limit = limit
        self.value = value
        super().__init__(
            f"ResourceAllocation: transactions {limit} {value} reached: "
            f"transaction {transaction!r} {cause}",
            detail,
        )


@dataclass(eq=False, slots=True)
class OpenTransaction:
    """One open transaction as the budget counts it."""

    conn: int
    name: str
    #: When BEGIN came (epoch ms, as the session was told): for `transactions.timeout_ms`.
    opened_ms: int
    #: BEGIN order on this gateway: what oldest and youngest mean (a clock may step back).
    seq: int
    held_bytes: int = 0
    #: SENDs held (ACKs hold no bytes and are not counted).
    messages: int = 0


@dataclass(frozen=True, slots=True)
class Discarded:
    """What the budget did to one connection: its open transactions are gone, and this is
    the ERROR its session owes the client."""

    #: The transaction picked (or timed out), named in the ERROR.
    transaction: str
    #: The connection's other open transactions, discarded with it (its connection closes).
    others: tuple[str, ...]
    error: TransactionDiscarded


# How each strategy ranks the candidates, first picked first. Ties go to the older.
_RANKS = {
    ReduceStrategy.MAX_BYTES: lambda t: (-t.held_bytes, t.seq),
    ReduceStrategy.MAX_MESSAGES: lambda t: (-t.messages, -t.held_bytes, t.seq),
    ReduceStrategy.OLDEST_TX: lambda t: t.seq,
    ReduceStrategy.YOUNGEST_TX: lambda t: -t.seq,
}


def pick_victims(
    strategy: ReduceStrategy, candidates: Iterable[OpenTransaction], need: int
) -> list[OpenTransaction] | None:
    """The transactions `strategy` discards to free at least `need` bytes, one per victim
    connection, in the order picked; None when it discards nothing (`none`, or every
    candidate together holds less than `need`).

    A pick closes its connection, so it frees every candidate of that connection, and that
    connection is not picked again. Strategies other than `all` pick one transaction at a
    time until enough is free, passing over transactions that hold no bytes (discarding
    one would free nothing). `all` picks every candidate's connection, naming each
    connection's oldest transaction.
    """
    if strategy is ReduceStrategy.NONE:
        return None
    by_conn: dict[int, list[OpenTransaction]] = {}
    conn_bytes: dict[int, int] = {}
    for tx in candidates:
        by_conn.setdefault(tx.conn, []).append(tx)
        conn_bytes[tx.conn] = conn_bytes.get(tx.conn, 0) + tx.held_bytes
    if sum(conn_bytes.values()) < need:
        return None
    if strategy is ReduceStrategy.ALL:
        firsts = [min(txs, key=lambda t: t.seq) for txs in by_conn.values()]
        return sorted(firsts, key=lambda t: t.seq)
    ranked = sorted(
        (tx for txs in by_conn.values() for tx in txs if tx.held_bytes), key=_RANKS[strategy]
    )
    picked: list[OpenTransaction] = []
    freed = 0
    gone: set[int] = set()
    for tx in ranked:
        if tx.conn in gone:
            continue
        picked.append(tx)
        gone.add(tx.conn)
        freed += conn_bytes[tx.conn]
        if freed >= need:
            return picked
    raise AssertionError("unreachable: the candidates hold enough bytes")  # pragma: no cover


class TransactionBudget:
    """The open transactions of every connection of one gateway, within
    `transactions.max_uncommitted_bytes` (the gateway's total) and
    `max_uncommitted_bytes_per_connection`; see the module's text.

    The sessions report what their transactions do (`begin`, `hold`, `end`,
    `end_connection`); a SEND that does not fit is refused with `LimitReached`, and
    transactions discarded to make room (or for `timeout_ms`: `expire`) wait for their
    sessions as `Discarded` (`take_discarded`), whose connections the shell learns from
    `take_to_tell`.
    """

    def __init__(
        self,
        limit: int,
        *,
        per_connection: int = -1,
        strategy: ReduceStrategy = ReduceStrategy.MAX_BYTES,
        timeout_ms: int = 0,
    ) -> None:
        if limit < 1 or per_connection == 0 or per_connection > limit:
            raise ValueError(
                f"transaction budget {limit}, per connection {per_connection}: the total must "
                "be >= 1, per connection -1 or from 1 to the total"
            )
        self.limit = limit
        # Set explicitly, it is named in refusals; -1 means "the total" (which is named).
        self.per_connection_set = per_connection > 0
        self.per_connection = per_connection if per_connection > 0 else limit
        self.strategy = strategy
        self.timeout_ms = timeout_ms
        self.used = 0
        # Open transactions in BEGIN order: the first is the oldest (`expire` stops early).
        self._open: dict[tuple[int, str], OpenTransaction] = {}
        self._conn_bytes: dict[int, int] = {}
        self._seq = itertools.count()
        self._discarded: dict[int, Discarded] = {}
        self._to_tell: list[int] = []
        # Since the gateway started: transactions rolled back for room (a reduction) and
        # for their age (`timeout_ms`), each with its connection's others (the admin API).
        self.discarded_for_room = 0
        self.discarded_for_age = 0

    @classmethod
    def from_settings(cls, settings: TransactionSettings) -> TransactionBudget:
        """The budget `[transactions]` describes, for one gateway."""
        return cls(
            settings.max_uncommitted_bytes,
            per_connection=settings.max_uncommitted_bytes_per_connection,
            strategy=ReduceStrategy(settings.reduce_strategy),
            timeout_ms=settings.timeout_ms,
        )

    # -- what the sessions report --------------------------------------------------------

    def begin(self, conn: int, name: str, now_ms: int) -> None:
        """Connection `conn` opened transaction `name` (BEGIN) at `now_ms`."""
        self._open[(conn, name)] = OpenTransaction(conn, name, now_ms, next(self._seq))

    def hold(self, conn: int, name: str, size: int) -> None:
        """A SEND of `size` bytes goes into `conn`'s open transaction `name`.

        `LimitReached` when it cannot: past the connection's limit, or past the gateway's
        total with strategy `none`. Otherwise it is counted, after discarding what the
        strategy picks among the other connections' transactions to make room.
        """
        tx = self._open[(conn, name)]
        held = self._conn_bytes.get(conn, 0)
        if held + size > self.per_connection:
            setting = (
                "max_uncommitted_bytes_per_connection"
                if self.per_connection_set
                else "max_uncommitted_bytes"
            )
            raise LimitReached(
                "transactions",
                setting,
                self.per_connection,
                f"transaction {name!r} would take this connection's open transactions to "
                f"{held + size} bytes. The message was not accepted; nothing was discarded "
                "for it (no other connection's transaction could make room under this "
                "limit). Commit sooner or in smaller transactions.",
            )
        need = self.used + size - self.limit
        if need > 0:
            others = [t for t in self._open.values() if t.conn != conn]
            victims = pick_victims(self.strategy, others, need)
            if victims is None:
                raise LimitReached(
                    "transactions",
                    "max_uncommitted_bytes",
                    self.limit,
                    f"transaction {name!r} would take this gateway's open transactions to "
                    f"{self.used + size} bytes (reduce_strategy {self.strategy.value}). The "
                    "message was not accepted.",
                )
            for victim in victims:
                self.discarded_for_room += self._discard_connection(victim, self._reduced(victim))
        self.used += size
        self._conn_bytes[conn] = held + size
        tx.held_bytes += size
        tx.messages += 1

    def end(self, conn: int, name: str) -> None:
        """`conn`'s transaction `name` was committed or aborted: its bytes are free."""
        tx = self._open.pop((conn, name), None)
        if tx is not None:
            self._release(tx)

    def end_connection(self, conn: int) -> None:
        """Connection `conn` is gone or has dropped every open transaction: its bytes are
        free, and nothing it was owed is kept. Idempotent."""
        for tx in [t for t in self._open.values() if t.conn == conn]:
            del self._open[(conn, tx.name)]
            self._release(tx)
        self._discarded.pop(conn, None)

    def expire(self, now_ms: int) -> None:
        """Discard the transactions open longer than `transactions.timeout_ms` at `now_ms`
        (each with its connection's others, as for a reduction)."""
        if self.timeout_ms <= 0 or not self._open:
            return
        # BEGIN order is (clock steps aside) age order: stop at the first young enough.
        due: list[OpenTransaction] = []
        for tx in self._open.values():
            if now_ms - tx.opened_ms <= self.timeout_ms:
                break
            due.append(tx)
        for tx in due:
            if (tx.conn, tx.name) in self._open:  # not gone with an older one of its conn
                self.discarded_for_age += self._discard_connection(tx, self._timed_out(tx, now_ms))

    # -- what the sessions and the shell take --------------------------------------------

    def take_discarded(self, conn: int) -> Discarded | None:
        """What was discarded of `conn`'s transactions and not yet taken (once)."""
        return self._discarded.pop(conn, None)

    def take_to_tell(self) -> list[int]:
        """The connections that had transactions discarded since the last call: the shell
        has their sessions take it (`GatewaySession.check_transactions`)."""
        if not self._to_tell:
            return []
        conns, self._to_tell = self._to_tell, []
        return conns

    def held_by(self, conn: int) -> int:
        """Bytes held in `conn`'s open transactions."""
        return self._conn_bytes.get(conn, 0)

    def open_transactions(self) -> list[OpenTransaction]:
        """Every open transaction of the gateway, in BEGIN order."""
        return list(self._open.values())

    # -- helpers -------------------------------------------------------------------------

    def _release(self, tx: OpenTransaction) -> None:
        self.used -= tx.held_bytes
        left = self._conn_bytes.get(tx.conn, 0) - tx.held_bytes
        if left > 0:
            self._conn_bytes[tx.conn] = left
        else:
            self._conn_bytes.pop(tx.conn, None)

    def _discard_connection(self, picked: OpenTransaction, error: TransactionDiscarded) -> int:
        """Roll back every open transaction of `picked`'s connection; returns how many."""
        others = tuple(
            t.name for t in self._open.values() if t.conn == picked.conn and t is not picked
        )
        self.end_connection(picked.conn)
        self._discarded[picked.conn] = Discarded(picked.name, others, error)
        self._to_tell.append(picked.conn)
        return 1 + len(others)

    def _reduced(self, tx: OpenTransaction) -> TransactionDiscarded:
        strategy = self.strategy.value
        return TransactionDiscarded(
            tx.name,
            "max_uncommitted_bytes",
            self.limit,
            f"discarded by reduce_strategy {strategy}",
            f"Transaction {tx.name!r} held {tx.held_bytes} bytes in {tx.messages} messages "
            "when another connection on this gateway needed room; reduce_strategy "
            f"{strategy} picked it. It was rolled back: nothing of it is delivered. "
            f"{self._others_text(tx)}Commit sooner or in smaller transactions, or raise "
            "transactions.max_uncommitted_bytes.",
        )

    def _timed_out(self, tx: OpenTransaction, now_ms: int) -> TransactionDiscarded:
        age = now_ms - tx.opened_ms
        return TransactionDiscarded(
            tx.name,
            "timeout_ms",
            self.timeout_ms,
            f"rolled back after {age} ms open",
            f"Transaction {tx.name!r} was open for {age} ms, holding {tx.held_bytes} bytes "
            f"in {tx.messages} messages. It was rolled back: nothing of it is delivered. "
            f"{self._others_text(tx)}Commit within transactions.timeout_ms.",
        )

    def _others_text(self, picked: OpenTransaction) -> str:
        others = [
            repr(t.name) for t in self._open.values() if t.conn == picked.conn and t is not picked
        ]
        if not others:
            return ""
        return (
            f"This connection's other open transactions ({', '.join(others)}) were rolled "
            "back with it. "
        )
