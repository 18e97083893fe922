"""STOMP over TLS (`stomp.tls_port`): the listener's `ssl.SSLContext`, made from the
stomp.tls_* files, and the handshake every connection to it completes before its first frame.

A file that cannot be used is a `ConfigError` naming its setting and the reason, never the
file's content: the broker refuses to start with it, in one line.
"""

from __future__ import annotations

import contextlib
import logging
import re
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpbroker.config import ConfigError, StompSettings
from mpbroker.logs import client_text, log_collapsed

if TYPE_CHECKING:
    # Imported where it is used: `mpbroker user add` and the other commands that import
    # this package need no trio (tens of ms at every start).
    import trio

__all__ = ["TlsHandshakes", "server_context", "subject_common_name"]

_CERT, _KEY, _CA = "stomp.tls_cert_file", "stomp.tls_key_file", "stomp.tls_ca_file"
# OpenSSL's messages end with where in CPython they were raised: noise in a log line.
_SOURCE_SUFFIX = re.compile(r"\s*\(_ssl\.c:\d+\)$")


class _PassphraseNeeded(Exception):
    """The key is encrypted (raised by the password callback)."""


def _no_passphrase() -> str:
    # Without a callback, OpenSSL asks for the passphrase on the terminal: a broker started
    # by hand would hang at a prompt, one under systemd would read its stdin.
    raise _PassphraseNeeded


def _ssl_reason(exc: BaseException) -> str:
    """OpenSSL's words for `exc`, without CPython's source position."""
    text = exc.args[1] if isinstance(exc, ssl.SSLError) and len(exc.args) > 1 else str(exc)
    return _SOURCE_SUFFIX.sub("", str(text)) or type(exc).__name__


def _read(key: str, path: str) -> bytes:
    """The file's bytes; ConfigError naming `key` if it cannot be read."""
    if not path:
        raise ConfigError(key, path, "required by stomp.tls_port (a PEM file)")
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(key, path, f"cannot read it: {exc.strerror or exc}") from None


def _load_certificates(context: ssl.SSLContext, key: str, path: str) -> None:
    """The certificates of the PEM file `path` into `context`'s trust store; ConfigError
    naming setting `key` unless OpenSSL reads at least one from it."""
    try:
        context.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise ConfigError(
            key, path, f"no PEM certificate could be read from it ({_ssl_reason(exc)})"
        ) from None
    if not context.cert_store_stats()["x509"]:
        raise ConfigError(key, path, "no certificate in it")


def server_context(stomp: StompSettings) -> ssl.SSLContext:
    """The TLS listener's server-side context: TLS 1.2 or later, the certificate chain of
    stomp.tls_cert_file with its key stomp.tls_key_file. With stomp.tls_ca_file, a client
    certificate is checked against those CAs: required with stomp.tls_require_client_cert,
    else checked only when a client presents one.

    ConfigError naming the setting for a file that cannot be read or used: missing or
    unreadable, not PEM, a key that does not match the certificate, a key encrypted with a
    passphrase (the broker has no way to be given one).
    """
    cert, key, ca = stomp.tls_cert_file, stomp.tls_key_file, stomp.tls_ca_file
    # Read first, so that a missing file is named (load_cert_chain would not say which).
    _read(_CERT, cert)
    _read(_KEY, key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # TLS 1.0 and 1.1 are deprecated (RFC 8996). PROTOCOL_TLS_SERVER's other defaults are
    # kept: no SSLv2/3, no compression (CRIME), the server's cipher order, OpenSSL's
    # default ciphers.
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # A client could ask for renegotiation (TLS 1.2) again and again: CPU for nothing.
    context.options |= ssl.OP_NO_RENEGOTIATION
    try:
        context.load_cert_chain(cert, key, password=_no_passphrase)
    except _PassphraseNeeded:
        raise ConfigError(
            _KEY,
            key,
            "the key is encrypted with a passphrase, and the broker cannot be given one: "
            "store it decrypted (openssl pkey -in KEY -out PLAIN.key), readable by the "
            "broker's user only",
        ) from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(
                _KEY, key, f"does not match the certificate of {_CERT} = {cert!r}"
            ) from None
        # OpenSSL says "PEM lib" for a bad certificate and for a bad key alike: a probe
        # tells which.
        _load_certificates(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), _CERT, cert)
        raise ConfigError(
            _KEY, key, f"no PEM private key could be read from it ({_ssl_reason(exc)})"
        ) from None
    if ca:
        _read(_CA, ca)
        _load_certificates(context, _CA, ca)
        context.verify_mode = (
            ssl.CERT_REQUIRED if stomp.tls_require_client_cert else ssl.CERT_OPTIONAL
        )
    elif stomp.tls_require_client_cert:
        # (The configuration's own check says so first; this is for other callers.)
        raise ConfigError(_CA, ca, "required by stomp.tls_require_client_cert = true")
    return context


def subject_common_name(certificate: dict[str, Any] | None) -> str | None:
    """The subject's common name (CN) of a certificate as `SSLSocket.getpeercert()` gives
    it; None without one."""
    for rdn in (certificate or {}).get("subject", ()):
        for name, value in rdn:
            if name == "commonName":
                return str(value)
    return None


async def _send_alert(stream: trio.SSLStream[trio.SocketStream]) -> None:
    """Send the alert OpenSSL made when the handshake failed, which trio leaves unsent: it
    tells the client why ("certificate required", "protocol version") where it would see
    only the connection closed. Best effort: through trio's private buffer, if it has one."""
    import trio

    outgoing = getattr(stream, "_outgoing", None)
    alert = outgoing.read() if isinstance(outgoing, ssl.MemoryBIO) else b""
    if alert:
        with (
            trio.move_on_after(1),
            contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
        ):
            await stream.transport_stream.send_all(alert)


class TlsHandshakes:
    """The TLS handshakes of one gateway's listener.

    Each runs in its connection's own task, so a slow one holds up no other connection,
    and must complete within `timeout_s` of the accept: a client that connects and says
    nothing is dropped then. (The gateway counts a connection as connecting from its
    accept, so `broker.max_connections_connecting` bounds the handshakes too: the gateway
    may close one to make room for a newer connection, by cancelling `complete`, which
    then leaves the stream to it.) A failed handshake is logged (collapsed per address)
    and ends only its connection.
    """

    def __init__(self, timeout_s: float, logger: logging.Logger) -> None:
        self.timeout_s = timeout_s
        self.log = logger

    async def complete(self, stream: trio.SSLStream[trio.SocketStream], peer: str) -> bool:
        """Run the handshake of a new connection from `peer` (HOST:PORT). True when it
        completed: the stream is the connection's now. False when it did not: it is closed."""
        import trio

        kind, level, failure = "TLS handshake failed", logging.WARNING, ""
        try:
            with trio.move_on_after(self.timeout_s) as scope:
                await stream.do_handshake()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            # The SSLError (or the socket's OSError) is its cause.
            failure = _ssl_reason(exc.__cause__ or exc)
            await _send_alert(stream)
        except Exception as exc:
            # One connection's failure must never take the gateway down.
            failure = f"{type(exc).__name__}: {exc}"
        if not failure and scope.cancelled_caught:
            kind, level = "TLS handshake not completed", logging.INFO
            failure = f"none within {self.timeout_s * 1000:.0f} ms (stomp.connect_timeout_ms)"
        if failure:
            log_collapsed(
                self.log, level, kind, peer, "%s from %s: %s", kind, peer, client_text(failure)
            )
            await trio.aclose_forcefully(stream)
            return False
        if self.log.isEnabledFor(logging.DEBUG):
            # Not a login: who a certificate names is not (yet) who the connection is.
            name = subject_common_name(stream.getpeercert())
            self.log.debug(
                "TLS from %s: %s, %s, client certificate %s",
                peer,
                stream.version(),
                (stream.cipher() or ("?",))[0],
                "none" if name is None else f"CN={client_text(name)}",
            )
        return True
