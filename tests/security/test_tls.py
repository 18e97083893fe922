"""The TLS listener's context from the stomp.tls_* files, each bad file refused naming its
setting, and the handshake a gateway runs for each connection (in memory, on trio).

`make_pki` also makes the certificates of the end-to-end tests (tests/e2e/test_tls.py)."""

from __future__ import annotations

import datetime
import ipaddress
import logging
import ssl
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import trio
import trio.testing
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mpbroker import logs
from mpbroker.config import ConfigError, StompSettings
from mpbroker.security import TlsHandshakes, server_context, subject_common_name

PASSPHRASE = b"open sesame"


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate for 127.0.0.1 (an IP SAN) and a client certificate (CN
    alice) signed by it, a client certificate of another CA, and their keys (PEM files)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path
    #: The server's key, encrypted with PASSPHRASE.
    encrypted_key: Path

    def stomp(self, **changes: object) -> StompSettings:
        """StompSettings of a TLS listener with these files (and `changes`)."""
        settings = StompSettings(
            tls_port=0, tls_cert_file=str(self.server_cert), tls_key_file=str(self.server_key)
        )
        return replace(settings, **changes)

    def client_context(self, *, certificate: bool = False) -> ssl.SSLContext:
        """A client's context that trusts the CA (with alice's certificate if asked)."""
        context = ssl.create_default_context(cafile=str(self.ca))
        if certificate:
            context.load_cert_chain(self.client_cert, self.client_key)
        return context


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey, passphrase: bytes = b"") -> Path:
    encryption: serialization.KeySerializationEncryption = serialization.NoEncryption()
    if passphrase:
        encryption = serialization.BestAvailableEncryption(passphrase)
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    path.chmod(0o600)
    return path


def _write_cert(path: Path, certificate: x509.Certificate) -> Path:
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return path


def _sign(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    usage: x509.ObjectIdentifier | None = None,
    ip: str | None = None,
) -> x509.Certificate:
    """A certificate for `key`, signed by `issuer` (None: by itself)."""
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if ip is not None:
        san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))])
        builder = builder.add_extension(san, critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(directory: Path) -> Pki:
    """Every file of a `Pki`, made in `directory` (P-256 keys: fast to make and to use)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, other_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca = _sign("mpbroker test CA", ca_key, None, ca=True)
    other = _sign("another CA", other_key, None, ca=True)
    server_key, client_key, stranger_key = (ec.generate_private_key(ec.SECP256R1()) for _ in "abc")
    server = _sign(
        "127.0.0.1",
        server_key,
        (ca.subject, ca_key),
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        ip="127.0.0.1",
    )
    client = _sign("alice", client_key, (ca.subject, ca_key), usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    stranger = _sign(
        "mallory", stranger_key, (other.subject, other_key), usage=ExtendedKeyUsageOID.CLIENT_AUTH
    )
    return Pki(
        ca=_write_cert(directory / "ca.pem", ca),
        server_cert=_write_cert(directory / "server.pem", server),
        server_key=_write_key(directory / "server.key", server_key),
        client_cert=_write_cert(directory / "client.pem", client),
        client_key=_write_key(directory / "client.key", client_key),
        stranger_cert=_write_cert(directory / "stranger.pem", stranger),
        stranger_key=_write_key(directory / "stranger.key", stranger_key),
        encrypted_key=_write_key(directory / "encrypted.key", server_key, PASSPHRASE),
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def refusal(stomp: StompSettings) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        server_context(stomp)
    return caught.value


# -- the context ------------------------------------------------------------------------


def test_the_context_is_a_server_one_of_tls_1_2_at_least(pki: Pki) -> None:
    context = server_context(pki.stomp())
    assert context.protocol is ssl.PROTOCOL_TLS_SERVER
    assert context.minimum_version is ssl.TLSVersion.TLSv1_2
    assert context.options & ssl.OP_NO_RENEGOTIATION
    assert context.options & ssl.OP_NO_COMPRESSION
    # No CA file: client certificates are not asked for.
    assert context.verify_mode is ssl.CERT_NONE
    assert context.cert_store_stats()["x509"] == 0  # not the system's CAs either


def test_a_ca_file_checks_client_certificates_when_given_or_always_when_required(
    pki: Pki,
) -> None:
    optional = server_context(pki.stomp(tls_ca_file=str(pki.ca)))
    assert optional.verify_mode is ssl.CERT_OPTIONAL
    assert optional.cert_store_stats()["x509"] == 1  # that CA, and only it
    required = server_context(pki.stomp(tls_ca_file=str(pki.ca), tls_require_client_cert=True))
    assert required.verify_mode is ssl.CERT_REQUIRED


def test_a_missing_or_unreadable_file_names_its_setting(pki: Pki, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pem")
    error = refusal(pki.stomp(tls_cert_file=missing))
    assert str(error) == (
        f"config: stomp.tls_cert_file = {missing!r}: cannot read it: No such file or directory"
    )
    assert refusal(pki.stomp(tls_key_file=missing)).key == "stomp.tls_key_file"
    assert refusal(pki.stomp(tls_ca_file=missing)).key == "stomp.tls_ca_file"
    error = refusal(pki.stomp(tls_key_file=str(tmp_path)))
    assert (error.key, error.allowed) == ("stomp.tls_key_file", "cannot read it: Is a directory")
    assert refusal(pki.stomp(tls_key_file="")).key == "stomp.tls_key_file"


def test_a_key_that_does_not_match_the_certificate_is_refused(pki: Pki) -> None:
    error = refusal(pki.stomp(tls_key_file=str(pki.client_key)))
    assert error.key == "stomp.tls_key_file"
    assert error.allowed == (
        f"does not match the certificate of stomp.tls_cert_file = {str(pki.server_cert)!r}"
    )


def test_files_of_the_wrong_kind_name_the_setting_and_never_their_content(pki: Pki) -> None:
    # A key where the certificate should be, a certificate where the key should be.
    cert_error = refusal(pki.stomp(tls_cert_file=str(pki.server_key)))
    assert cert_error.key == "stomp.tls_cert_file"
    assert cert_error.allowed.startswith("no PEM certificate could be read from it")
    key_error = refusal(pki.stomp(tls_key_file=str(pki.server_cert)))
    assert key_error.key == "stomp.tls_key_file"
    assert key_error.allowed.startswith("no PEM private key could be read from it")
    ca_error = refusal(pki.stomp(tls_ca_file=str(pki.server_key)))
    assert ca_error.key == "stomp.tls_ca_file"
    assert ca_error.allowed.startswith("no PEM certificate could be read from it")
    secret = pki.server_key.read_text().splitlines()[1]
    for error in (cert_error, key_error, ca_error):
        assert "\n" not in str(error)
        assert secret not in str(error) and "_ssl.c" not in str(error)


def test_an_encrypted_key_is_refused_without_asking_for_its_passphrase(pki: Pki) -> None:
    # OpenSSL would read the passphrase from the terminal; pytest's stdin is not one, and
    # the refusal says what to do instead.
    error = refusal(pki.stomp(tls_key_file=str(pki.encrypted_key)))
    assert error.key == "stomp.tls_key_file"
    assert "encrypted with a passphrase" in error.allowed
    assert PASSPHRASE.decode() not in str(error)


def test_a_required_client_certificate_needs_a_ca_file(pki: Pki) -> None:
    error = refusal(pki.stomp(tls_require_client_cert=True))
    assert (error.key, error.value) == ("stomp.tls_ca_file", "")


def test_the_common_name_of_a_certificate() -> None:
    certificate = {
        "subject": ((("organizationName", "ACME"),), (("commonName", "alice"),)),
        "issuer": ((("commonName", "CA"),),),
    }
    assert subject_common_name(certificate) == "alice"
    assert subject_common_name({"subject": ((("organizationName", "ACME"),),)}) is None
    assert subject_common_name({}) is None
    assert subject_common_name(None) is None


# -- the handshake ----------------------------------------------------------------------

_log = logging.getLogger("tests.security.tls")


@pytest.fixture
def logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> pytest.LogCaptureFixture:
    """The log, with the handshakes' lines from INFO up. The failures are collapsed per
    kind, whatever the address: a collapser of its own, so that another test's failure
    does not hide this one's line."""
    monkeypatch.setattr(logs, "_collapser", logs.Collapser())
    caplog.set_level(logging.INFO, logger=_log.name)
    return caplog


def records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The handshakes' log records (not other loggers': summaries of lines other tests
    logged, collapsed, may come at any time)."""
    return [r for r in caplog.records if r.name == _log.name]


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in records(caplog)]


def _pair(pki: Pki, context: ssl.SSLContext) -> tuple[trio.SSLStream, trio.SSLStream]:
    """A server-side TLS stream of the broker's context and a client's, in memory."""
    server_end, client_end = trio.testing.memory_stream_pair()
    server = trio.SSLStream(server_end, server_context(pki.stomp()), server_side=True)
    client = trio.SSLStream(client_end, context, server_hostname="127.0.0.1")
    return server, client


async def test_a_handshake_completes_and_the_stream_carries_data(pki: Pki) -> None:
    handshakes = TlsHandshakes(5.0, _log)
    server, client = _pair(pki, pki.client_context())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.do_handshake)
        assert await handshakes.complete(server, "10.0.0.1:1")
    await client.send_all(b"CONNECT\n\n\0")
    assert await server.receive_some() == b"CONNECT\n\n\0"


async def test_a_silent_client_is_dropped_at_the_deadline(
    pki: Pki, autojump_clock: trio.testing.MockClock, logged: pytest.LogCaptureFixture
) -> None:
    handshakes = TlsHandshakes(2.0, _log)
    server, _client = _pair(pki, pki.client_context())
    start = trio.current_time()
    assert not await handshakes.complete(server, "10.0.0.2:1")
    assert trio.current_time() - start == pytest.approx(2.0)
    assert lines(logged) == [
        "TLS handshake not completed from 10.0.0.2:1: none within 2000 ms "
        "(stomp.connect_timeout_ms)"
    ]
    with pytest.raises(trio.ClosedResourceError):
        await server.receive_some()  # closed


async def test_a_failed_handshake_is_logged_and_ends_its_connection(
    pki: Pki, logged: pytest.LogCaptureFixture
) -> None:
    handshakes = TlsHandshakes(5.0, _log)
    # A client certificate of another CA: the server refuses it.
    context = pki.client_context()
    context.load_cert_chain(pki.stranger_cert, pki.stranger_key)
    server_end, client_end = trio.testing.memory_stream_pair()
    required = pki.stomp(tls_ca_file=str(pki.ca), tls_require_client_cert=True)
    server = trio.SSLStream(server_end, server_context(required), server_side=True)
    client = trio.SSLStream(client_end, context, server_hostname="127.0.0.1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.do_handshake)
        assert not await handshakes.complete(server, "10.0.0.3:1")
    [line] = lines(logged)
    assert line.startswith("TLS handshake failed from 10.0.0.3:1: [SSL: ")
    assert "_ssl.c" not in line
    assert [r.levelno for r in records(logged)] == [logging.WARNING]
    with pytest.raises(trio.ClosedResourceError):
        await server.receive_some()  # closed


async def test_plain_bytes_fail_the_handshake(pki: Pki, logged: pytest.LogCaptureFixture) -> None:
    handshakes = TlsHandshakes(5.0, _log)
    server_end, client_end = trio.testing.memory_stream_pair()
    server = trio.SSLStream(server_end, server_context(pki.stomp()), server_side=True)
    await client_end.send_all(b"CONNECT\naccept-version:1.2\n\n\0")
    assert not await handshakes.complete(server, "10.0.0.4:1")
    [line] = lines(logged)
    assert line.startswith("TLS handshake failed from 10.0.0.4:1: [SSL: ")
