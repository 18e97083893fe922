"""The `mpbroker` command line: each subcommand is one library call with clean errors."""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpbroker import __version__, native
from mpbroker.config import (
    ACL_PERMISSIONS,
    LOG_FORMATS,
    LOG_LEVELS,
    Config,
    ConfigError,
    iter_settings,
    load_config,
    parse_size,
    replace_settings,
)

if TYPE_CHECKING:
    from mpbroker.host import UsableCpus
    from mpbroker.memory import WorkerCounts

__all__ = ["build_parser", "main"]


def _apply_overrides(config: Config, args: argparse.Namespace) -> Config:
    changes: dict[str, Any] = {}
    for name in ("host", "port", "data_dir", "gateways", "log_level", "log_format"):
        value = getattr(args, name, None)
        if value is not None:
            changes[name] = value
    if changes:
        config = replace_settings(config, "broker", **changes)
    admin_port = getattr(args, "admin_port", None)
    if admin_port is not None:
        config = replace_settings(config, "admin", port=admin_port)
    return config


def _fit_workers(config: Config) -> tuple[WorkerCounts, UsableCpus]:
    """Every worker count of `config` resolved: 0 = one per usable CPU (as many as fit),
    and the p2p and pubsub counts the data dir was made with (ConfigError for others)."""
    from mpbroker.host import usable_cpus
    from mpbroker.memory import fit_workers
    from mpbroker.routing import Topology
    from mpbroker.workers.datadir import read_partitions

    record = read_partitions(Path(config.broker.data_dir))
    pinned = None
    if record is not None:
        pinned = (record.p2p_workers, record.pubsub_workers)
        broker = config.broker
        record.check(
            Topology(
                broker.p2p_workers or record.p2p_workers,
                broker.pubsub_workers or record.pubsub_workers,
                config.queues.dead_letter_prefix,
            )
        )
    cpus = usable_cpus()
    return fit_workers(config, cpus.count, pinned), cpus


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the broker in the foreground until SIGTERM or Ctrl-C.

    A config whose theoretical maximum (see `mpbroker config show`) exceeds
    memory.max_memory is refused before anything starts (exit code 2), and so is a data
    dir the broker cannot use. Under systemd (Type=notify) it says when it is ready,
    reloading and stopping, and feeds the watchdog while it is healthy.

    Example: mpbroker serve --port 61613 --data-dir /var/lib/mpbroker
    """
    from setproctitle import setproctitle

    from mpbroker.host import open_files_needed, raise_open_files
    from mpbroker.logs import setup_logging
    from mpbroker.memory import require_fits
    from mpbroker.workers.datadir import check_data_dir
    from mpbroker.workers.supervisor import serve

    config = _apply_overrides(load_config(args.config), args)
    # A data dir that is there must be usable before its partitions are read from it.
    check_data_dir(Path(config.broker.data_dir), create=False)
    counts, cpus = _fit_workers(config)
    config = counts.config
    # Refused before anything starts, the data dir included (the supervisor checks again,
    # for other callers).
    require_fits(config)
    _check_exposure(config)
    if config.stomp.tls_port >= 0 or config.stomp.wss_port >= 0:
        from mpbroker.security import server_context

        # The TLS listeners' files load (ConfigError naming the setting otherwise).
        server_context(config.stomp)
    check_data_dir(Path(config.broker.data_dir))
    setproctitle("mpbroker: supervisor")
    setup_logging("supervisor", config.broker.log_level, config.broker.log_format)
    log = logging.getLogger("mpbroker.supervisor")
    for note in counts.notes:
        log.warning("%s", note)
    log.debug("%s", cpus.why())
    # Before the fork server starts: every worker inherits it.
    files = raise_open_files(open_files_needed(config.broker.max_connections))
    if files is not None:
        log.warning("%s", files)
    # SIGHUP reads the same file again, with the same command-line overrides. Worker counts
    # are not reloaded: a 0 in the file stands for the count running now.
    running = config
    reload_source = (
        (lambda: _same_counts(_apply_overrides(load_config(args.config), args), running))
        if args.config
        else None
    )
    return serve(config, reload_source)


def _same_counts(config: Config, running: Config) -> Config:
    """`config` with each worker count of 0 replaced by `running`'s."""
    broker, now = config.broker, running.broker
    config = replace_settings(
        config,
        "broker",
        gateways=broker.gateways or now.gateways,
        p2p_workers=broker.p2p_workers or now.p2p_workers,
        pubsub_workers=broker.pubsub_workers or now.pubsub_workers,
    )
    return replace_settings(
        config, "replay", workers=config.replay.workers or running.replay.workers
    )


def _check_exposure(config: Config) -> None:
    """Who may connect must be decided before the broker listens beyond this machine: a
    users file, or anonymous connections allowed on purpose. And a users file must be
    good (UsersFileError otherwise)."""
    from mpbroker.security import is_loopback, load_users

    security = config.security
    if security.users_file:
        load_users(Path(security.users_file))
    elif not is_loopback(config.broker.host) and security.allow_anonymous != "true":
        raise ConfigError(
            "security.allow_anonymous",
            security.allow_anonymous,
            f"the broker would listen on {config.broker.host}, beyond this machine, with no "
            "security.users_file: anyone could connect. Set security.users_file (mpbroker "
            "user add), or allow_anonymous = true to let anyone in on purpose",
        )


def cmd_config_show(args: argparse.Namespace) -> int:
    """Print the effective settings and the memory budget.

    Every setting with its effective value and what it means, as TOML; then, as TOML
    comments, every module's budget, the theoretical maximum, the fixed cost and the
    headroom against memory.max_memory, and how many workers of each kind and why. It
    takes serve's options: each overrides its setting, so that it shows what `mpbroker
    serve` would run with the same options.

    Example: mpbroker config show --config broker.toml
    """
    from mpbroker.memory import plan, render_plan

    requested = _apply_overrides(load_config(args.config), args)
    counts, cpus = _fit_workers(requested)
    config = counts.config
    effective = {count.setting: count for count in counts.counts}
    section = ""
    for key, value, doc in iter_settings(config):
        head, _, name = key.partition(".")
        if head != section:
            print(f"{'' if not section else chr(10)}[{head}]")
            section = head
        # A JSON string is a valid TOML basic string: quotes and backslashes escaped.
        rendered = json.dumps(value) if isinstance(value, str | bool) else str(value)
        if key in effective:
            # The count as asked for (0 stays 0): the effective ones follow the budget.
            rendered = str(getattr(getattr(requested, head), name))
        print(f"{name} = {rendered}  # {doc}")
    for quota in config.quotas:
        print(f"\n[quotas.{json.dumps(quota.name)}]")
        print(f"max_messages = {quota.max_messages}")
        print(f"max_bytes = {quota.max_bytes}")
        print(f"shared = {json.dumps(quota.shared)}")
        print(f"policy = {json.dumps(quota.policy)}")
    for table in config.destinations:
        print(f"\n[destinations.{json.dumps(table.pattern)}]")
        for name, value in table.items():
            shown = json.dumps(value) if isinstance(value, str | bool) else value
            print(f"{name} = {shown}  # overrides the default for matching destinations")
    for entry in config.acl:
        print("\n[[security.acl]]")
        print(f"destination = {json.dumps(entry.destination)}")
        for permission in ACL_PERMISSIONS:
            print(f"{permission} = {json.dumps(list(getattr(entry, permission)))}")
    print()
    for line in render_plan(plan(config)):
        print(f"# {line}")
    # Machine-dependent like the budget (which counts these workers), so after it.
    print(f"# Workers: {cpus.why()}")
    for count in counts.counts:
        print(f"#   {count.setting}: {count.value} ({count.why})")
    return 0


# The wizard's inputs: (option name, prompt, parser of the answer).
_WIZARD_INPUTS: tuple[tuple[str, str, Callable[[str], Any]], ...] = (
    ("memory", "memory for the broker (e.g. 256MB)", parse_size),
    ("topics", "estimated number of topics", int),
    ("queues", "estimated number of queues", int),
    ("largest_topic_message", "largest topic message (e.g. 64KiB)", parse_size),
    ("largest_queue_message", "largest queue message (e.g. 64KiB)", parse_size),
    ("rate", "average message rate, messages/s", float),
    ("connections", "client connections", int),
    ("threads", "maximum threads/worker processes", int),
)


def _wizard_values(args: argparse.Namespace) -> dict[str, Any] | None:
    """Every input, from its flag or (on a terminal) asked for; None after an error."""
    values = {name: getattr(args, name) for name, _, _ in _WIZARD_INPUTS}
    missing = [name for name, value in values.items() if value is None]
    if missing and not sys.stdin.isatty():
        flags = ", ".join("--" + name.replace("_", "-") for name in missing)
        print(
            f"mpbroker: config wizard: missing {flags} (stdin is not a terminal)", file=sys.stderr
        )
        return None
    for name, prompt, parse in _WIZARD_INPUTS:
        while values[name] is None:
            try:
                values[name] = parse(input(f"{prompt}: ").strip())
            except ValueError as exc:
                print(f"  {exc}", file=sys.stderr)
            except EOFError:
                return None
    return values


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_config_wizard(args: argparse.Namespace) -> int:
    """Derive a config from the memory and the expected load.

    Writes the module budgets it derives as TOML, each setting with the reason for its
    value, and prints the reasons. Asks for the inputs not given as flags when stdin is a
    terminal. Writes to --out (never over an existing file without --force) or to stdout.
    Exit code 2 for inputs that cannot fit, naming the input and by how much.

    Example: mpbroker config wizard --memory 256MB --topics 10 --queues 10 --largest-topic-message 64KiB --largest-queue-message 64KiB --rate 50 --connections 20 --threads 500 --out broker.toml
    """
    from mpbroker.host import usable_cpus
    from mpbroker.memory import WizardError, WizardInputs, derive

    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and not args.force:
        print(f"mpbroker: config wizard: {out} exists (--force overwrites it)", file=sys.stderr)
        return 2
    if args.cpus is not None and args.cpus < 1:
        print(f"mpbroker: config wizard: --cpus {args.cpus}: must be at least 1", file=sys.stderr)
        return 2
    values = _wizard_values(args)
    if values is None:
        return 2
    inputs = WizardInputs(
        memory_bytes=values["memory"],
        topics=values["topics"],
        queues=values["queues"],
        largest_topic_message_bytes=values["largest_topic_message"],
        largest_queue_message_bytes=values["largest_queue_message"],
        rate_per_s=values["rate"],
        connections=values["connections"],
        threads=values["threads"],
        cpus=args.cpus or usable_cpus().count,
    )
    try:
        result = derive(inputs)
    except WizardError as exc:
        # What was given cannot fit: asking again cannot help (as every refusal, 2).
        print(f"mpbroker: config {exc}", file=sys.stderr)
        return 2
    text = result.toml()
    if out is None:
        sys.stdout.write(text)
        return 0
    try:
        out.write_text(text)
    except OSError as exc:
        print(
            f"mpbroker: config wizard: cannot write --out {out}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2
    for choice in result.choices:
        print(f"{choice.key} = {json.dumps(choice.value)}: {choice.why}")
    for line in result.summary():
        print(line)
    print(f"written to {out}")
    return 0


def cmd_config_estimate(args: argparse.Namespace) -> int:
    """Estimate the memory a load needs, against memory.max_memory.

    How much memory N connections, S sessions (subscriptions), M waiting messages of B
    bytes and D destinations need: Qpid's formula with our measured costs. The broker's
    processes are counted as serve would start them with the same --config, --data-dir and
    --gateways.

    Example: mpbroker config estimate --connections 100 --sessions 200 --messages 100000 --message-bytes 1KiB --destinations 500
    """
    from mpbroker.memory import estimate

    config = _fit_workers(_apply_overrides(load_config(args.config), args))[0].config
    try:
        result = estimate(
            config,
            args.connections,
            args.sessions,
            args.messages,
            args.message_bytes,
            args.destinations,
        )
    except ValueError as exc:
        print(f"mpbroker: config estimate: {exc}", file=sys.stderr)
        return 2
    for line in result.lines():
        print(line)
    return 0


# `mpbroker admin` exit codes: 2 when the broker refused (401, 403) or no password could be
# had, which asking again cannot fix (as the broker's EXIT_REFUSED); 1 when it did not
# answer, or answered with another error.
_ADMIN_REFUSED = 2
_ADMIN_FAILED = 1
_PASSWORD_VARIABLE = "MPBROKER_PASSWORD"


class _AdminFailure(Exception):
    """`mpbroker admin` cannot show its page: the line that says why, the exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _admin_password(args: argparse.Namespace) -> str:
    """The password of --user: the first line of --password-file, else $MPBROKER_PASSWORD,
    else asked on a terminal. Never an option's value: every user of the machine sees a
    command line (ps)."""
    if args.password_file:
        try:
            with open(args.password_file, encoding="utf-8") as file:
                password = file.readline().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise _AdminFailure(
                f"mpbroker: admin: cannot read --password-file {args.password_file}: {why}",
                _ADMIN_REFUSED,
            ) from None
        if not password:
            raise _AdminFailure(
                f"mpbroker: admin: --password-file {args.password_file}: its first line is empty",
                _ADMIN_REFUSED,
            )
        return password
    if _PASSWORD_VARIABLE in os.environ:
        return os.environ[_PASSWORD_VARIABLE]
    if sys.stdin.isatty():
        import getpass

        return getpass.getpass(f"password for {args.user}: ")
    raise _AdminFailure(
        f"mpbroker: admin: --user {args.user} needs a password: set {_PASSWORD_VARIABLE}, "
        "give --password-file FILE, or run on a terminal to be asked",
        _ADMIN_REFUSED,
    )


def _admin_error(url: str, code: int, body: bytes, user: str | None) -> str:
    """The one line that says what the admin API answered instead of a page (its JSON
    `error`, made safe for a terminal: the answer is the server's text)."""
    from mpbroker.logs import client_text

    try:
        error = client_text(str(json.loads(body)["error"]))
    except (ValueError, KeyError, TypeError):  # not our JSON: another server on the port
        error = "(no reason given)"
    line = f"mpbroker: admin API at {url}: HTTP {code}: {error}"
    if code == 401 and user is None:
        line += f" (give --user NAME, the password in ${_PASSWORD_VARIABLE})"
    return line


def _url_host(host: str) -> str:
    """`host` (an address a server listens on) as a client reaches it, in a URL: a wildcard
    address as loopback, an IPv6 address in brackets."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"[{host}]" if ":" in host else host


def _admin_base(args: argparse.Namespace) -> tuple[str, str]:
    """The admin API's address, `http://HOST:PORT`, and what to add to a failure to reach
    it: where the address came from.

    --port (with --host) wins. Without it, the port the broker of --data-dir (default:
    `serve`'s) recorded in its mpbroker-ports.json, and its address unless --host; without
    a record, the default port. _AdminFailure when the record says the broker is gone, or
    serves no admin API."""
    from mpbroker.workers.datadir import PORTS_FILE, DataDirError, read_ports

    host = args.host or "127.0.0.1"
    if args.port is not None:
        return f"http://{_url_host(host)}:{args.port}", ""
    defaults = Config()
    data_dir = Path(args.data_dir or defaults.broker.data_dir)
    path = data_dir / PORTS_FILE
    default = f"http://{_url_host(host)}:{defaults.admin.port}"
    try:
        record = read_ports(data_dir)
    except DataDirError as exc:
        return default, f" (the default port: {exc}; give --port P)"
    if record is None:
        return default, (
            f" (the default port: no running broker recorded its ports in {path}; give "
            "--port P, or --data-dir DIR of the broker)"
        )
    if not record.running():
        raise _AdminFailure(
            f"mpbroker: admin: the broker of data dir {data_dir} is not running: {path} is "
            f"from pid {record.pid}, which is gone (give --port P for a broker elsewhere)",
            _ADMIN_FAILED,
        )
    if record.admin_port is None:
        raise _AdminFailure(
            f"mpbroker: admin: the broker of data dir {data_dir} (pid {record.pid}) serves no "
            "admin API (it was started with admin.port = -1)",
            _ADMIN_FAILED,
        )
    if args.host is None:
        host = record.admin_host or host
    return (
        f"http://{_url_host(host)}:{record.admin_port}",
        f" (the port the broker with pid {record.pid} recorded in {path})",
    )


def _admin_get(args: argparse.Namespace, url: str, source: str) -> bytes:
    """The page at `url`, with the credentials of --user if given; _AdminFailure else.
    `source`: where its address came from, said when nothing answers there."""
    import urllib.error
    import urllib.request

    from mpbroker.admin.access import authorization

    request = urllib.request.Request(url)
    if args.user is not None:
        # Sent at once, not after a 401: one request, and one check of the password.
        try:
            request.add_header("Authorization", authorization(args.user, _admin_password(args)))
        except ValueError as exc:
            raise _AdminFailure(
                f"mpbroker: admin: cannot send the credentials: {exc}", _ADMIN_REFUSED
            ) from None
    elif args.password_file:
        raise _AdminFailure("mpbroker: admin: --password-file needs --user NAME", _ADMIN_REFUSED)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            data: bytes = response.read()
            return data
    except urllib.error.HTTPError as exc:
        try:
            body = exc.read()
        except OSError:
            body = b""
        code = _ADMIN_REFUSED if exc.code in (401, 403) else _ADMIN_FAILED
        raise _AdminFailure(_admin_error(url, exc.code, body, args.user), code) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise _AdminFailure(
            f"mpbroker: cannot reach the admin API at {url}: {reason}{source}", _ADMIN_FAILED
        ) from None


def _show_admin_page(args: argparse.Namespace, path: str, render: Callable[[bytes], str]) -> int:
    """Print an admin page: as JSON (--json) or as the tables `render` makes of it."""
    import msgspec

    try:
        base, source = _admin_base(args)
        url = base + path
        data = _admin_get(args, url, source)
    except _AdminFailure as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    try:
        text = msgspec.json.format(data, indent=2).decode() if args.json else render(data)
    except msgspec.DecodeError as exc:
        print(f"mpbroker: {url} is not an mpbroker admin page: {exc}", file=sys.stderr)
        return 1
    print(text)
    return 0


def cmd_admin_status(args: argparse.Namespace) -> int:
    """Show the workers, their state and what each holds.

    Example: mpbroker admin status --data-dir /var/lib/mpbroker

    A broker with a users file wants a user in group admin: --user NAME, the password
    from --password-file FILE, else $MPBROKER_PASSWORD, else asked on a terminal.
    """
    from mpbroker.admin import StatusView, decode
    from mpbroker.admin.text import render_status

    return _show_admin_page(args, "/status", lambda data: render_status(decode(data, StatusView)))


def cmd_admin_flow(args: argparse.Namespace) -> int:
    """Show flow control now.

    Every destination's counts and watermarks, the stopped producers and how long they have
    waited, every consumer's window and whether it is ready.

    Example: mpbroker admin flow --port 8161

    A broker with a users file wants a user in group admin: --user NAME, the password
    from --password-file FILE, else $MPBROKER_PASSWORD, else asked on a terminal.
    """
    from mpbroker.admin import FlowView, decode
    from mpbroker.admin.text import render_flow

    return _show_admin_page(args, "/flow", lambda data: render_flow(decode(data, FlowView)))


def cmd_bench(args: argparse.Namespace) -> int:
    """Load-test a running broker (or one it starts) and report msgs/s.

    Producer and consumer processes pipeline frames; every message must arrive exactly once
    (in order, for topics). --baseline first runs the same load against a single-process
    STOMP forwarder on the same codec and reports the broker's numbers as ratios of it.
    Exit code 1 when a run did not check out, 2 for invalid options.

    Example: mpbroker bench --producers 1 --consumers 1 --count 200000 --size 100
    """
    from mpbroker.loadgen.cli import run_from_args

    return run_from_args(args)


def cmd_export(args: argparse.Namespace) -> int:
    """Write the stores' persistent messages as Parquet files, incrementally.

    Reads the stores in --data-dir read-only (the broker may be running): sealed and
    archived segments once each, the active segments as a snapshot; a manifest in --out
    makes the next run export only what is new, and the outcomes found since of rows it
    exported as pending. Its memory stays under --max-memory, whatever the size of the stores.
    Needs pyarrow (in a checkout: pip install -e '.[export]').
    Exit code 2 for a data directory with no store, a damaged, foreign or missing file in
    --out, or another export running into --out.

    Example: mpbroker export --data-dir /var/lib/mpbroker --out /srv/export --destination '/queue/*'
    """
    from mpbroker.export import ExportError, Options, Progress, export, parse_since

    try:
        since = None if args.since is None else parse_since(args.since)
    except ValueError as exc:
        print(f"mpbroker: export: {exc}", file=sys.stderr)
        return 2
    try:
        max_memory = parse_size(args.max_memory)
    except ValueError as exc:
        print(f"mpbroker: export: --max-memory {args.max_memory!r}: {exc}", file=sys.stderr)
        return 2
    options = Options(destination=args.destination, since_ms=since, body=not args.no_body)
    progress = Progress(sys.stderr)
    try:
        summary = export(
            Path(args.data_dir), Path(args.out), options, progress, max_memory=max_memory
        )
    except ExportError as exc:
        progress.done()
        print(f"mpbroker: {exc}", file=sys.stderr)
        return 2
    progress.done()
    for line in summary.lines():
        print(line)
    return 0


def _users_file(args: argparse.Namespace) -> Path:
    """--users-file, else security.users_file of --config; ConfigError without either."""
    if args.users_file:
        return Path(args.users_file)
    configured = load_config(args.config).security.users_file
    if not configured:
        raise ConfigError(
            "security.users_file",
            "",
            "no users file: give --users-file FILE, or --config with security.users_file set",
        )
    return Path(configured)


def _read_password(name: str) -> str | None:
    """The new password: asked twice on a terminal, else one line of stdin."""
    import getpass

    if sys.stdin.isatty():
        first = getpass.getpass(f"password for {name}: ")
        if getpass.getpass("again: ") != first:
            print("mpbroker: user add: the passwords differ", file=sys.stderr)
            return None
        password = first
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        print("mpbroker: user add: an empty password is not allowed", file=sys.stderr)
        return None
    return password


def cmd_user_add(args: argparse.Namespace) -> int:
    """Add a user to the users file.

    The file is made owner-only if missing. The password is asked twice on a terminal, or
    read as one line from stdin; --group gives the user's groups. The broker reads the file
    at start and on SIGHUP.

    Example: mpbroker user add alice --group producers --config /etc/mpbroker/mpbroker.toml
    """
    from mpbroker.security import User, check_name, hash_password, load_users, save_users

    path = _users_file(args)
    try:
        check_name(args.name)
        groups = tuple(check_name(g, "group") for g in args.group or ())
    except ValueError as exc:
        print(f"mpbroker: user add: {exc}", file=sys.stderr)
        return 2
    users = load_users(path) if path.exists() else {}
    if args.name in users and not args.replace:
        print(
            f"mpbroker: user add: {args.name!r} is in {path} already (--replace changes its "
            "password and groups)",
            file=sys.stderr,
        )
        return 2
    password = _read_password(args.name)
    if password is None:
        return 2
    users[args.name] = User(args.name, hash_password(password), groups)
    save_users(path, users)
    print(f"{'replaced' if args.replace else 'added'} {args.name} in {path}")
    return 0


def cmd_user_remove(args: argparse.Namespace) -> int:
    """Remove a user from the users file.

    Example: mpbroker user remove alice --users-file /etc/mpbroker/users
    """
    from mpbroker.security import load_users, save_users

    path = _users_file(args)
    users = load_users(path)
    if users.pop(args.name, None) is None:
        print(f"mpbroker: user remove: no user {args.name!r} in {path}", file=sys.stderr)
        return 2
    save_users(path, users)
    print(f"removed {args.name} from {path}")
    return 0


def cmd_user_list(args: argparse.Namespace) -> int:
    """List the users of the users file and their groups.

    Example: mpbroker user list --users-file /etc/mpbroker/users
    """
    from mpbroker.security import load_users

    for user in sorted(load_users(_users_file(args)).values(), key=lambda u: u.name):
        print(f"{user.name}\t{','.join(user.groups) or '-'}")
    return 0


# `serve`'s options (by dest): `config show` takes them all (it shows what serve would run
# with them), `config estimate` those that change its answer (the processes it counts).
_SERVE_OPTIONS = (
    "config",
    "host",
    "port",
    "data_dir",
    "gateways",
    "log_level",
    "log_format",
    "admin_port",
)
_ESTIMATE_OPTIONS = ("config", "data_dir", "gateways")


def _add_broker_options(
    parser: argparse.ArgumentParser, only: Sequence[str] = _SERVE_OPTIONS
) -> None:
    if "config" in only:
        parser.add_argument("--config", metavar="FILE", help="TOML configuration file")
    if "host" in only:
        parser.add_argument("--host", help="listen address (default 127.0.0.1)")
    if "port" in only:
        parser.add_argument(
            "--port", type=int, help="STOMP port (default 61613; 0 = any free port)"
        )
    if "data_dir" in only:
        parser.add_argument(
            "--data-dir",
            dest="data_dir",
            metavar="DIR",
            help=f"data directory (default {Config().broker.data_dir})",
        )
    if "gateways" in only:
        parser.add_argument(
            "--gateways", type=int, metavar="N", help="gateway processes (0 = one per CPU)"
        )
    if "log_level" in only:
        parser.add_argument("--log-level", dest="log_level", choices=LOG_LEVELS, help="log level")
    if "log_format" in only:
        parser.add_argument(
            "--log-format",
            dest="log_format",
            choices=LOG_FORMATS,
            help="text (with times) or journal (<N> priorities, for journald); auto = journal "
            "when stderr is the journal ($JOURNAL_STREAM)",
        )
    if "admin_port" in only:
        parser.add_argument(
            "--admin-port",
            dest="admin_port",
            type=int,
            metavar="P",
            help="admin API port (default 8161; 0 = any free port, -1 = off)",
        )


def _chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the command `args` chose (`mpbroker config show`'s, say)."""
    while True:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                name = getattr(args, action.dest, None)
                if name in action.choices:
                    parser = action.choices[name]
                    break
        else:
            return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """`parser.parse_args(argv)`, but with what no command knows refused by the command's
    own parser, with its usage: argparse leaves the unknown arguments of `mpbroker serve
    --prot 0` to the top-level parser, whose usage does not say what serve takes."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        _chosen(parser, args).error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mpbroker",
        description="A JMS-style STOMP 1.2 message broker that scales by processes.",
    )
    parser.add_argument(
        "--version", action="version", version=f"mpbroker {__version__}, {native.describe()}"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    from mpbroker.workers.datadir import PORTS_FILE

    default_data_dir = Config().broker.data_dir

    def add_command(parent: Any, name: str, doc: str) -> argparse.ArgumentParser:
        """A command whose description is `doc` (a docstring: its first paragraph, one
        sentence, is the command's summary in its parent's list)."""
        description = inspect.cleandoc(doc)
        summary = " ".join(description.split("\n\n", 1)[0].split())
        sub: argparse.ArgumentParser = parent.add_parser(
            name,
            help=summary,
            description=description,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        return sub

    def add(
        name: str, func: Callable[[argparse.Namespace], int], parent: Any = commands
    ) -> argparse.ArgumentParser:
        sub = add_command(parent, name, func.__doc__ or "")
        sub.set_defaults(func=func)
        return sub

    def group(name: str, doc: str) -> Any:
        """A command with subcommands of its own (`mpbroker config show`)."""
        parser = add_command(commands, name, doc)
        subcommands = parser.add_subparsers(dest=f"{name}_command", metavar="COMMAND")
        subcommands.required = True
        return subcommands

    _add_broker_options(add("serve", cmd_serve))

    config_commands = group("config", "Inspect the configuration, derive one, estimate memory.")
    _add_broker_options(add("show", cmd_config_show, config_commands))
    wizard = add("wizard", cmd_config_wizard, config_commands)
    for name, prompt, parse in _WIZARD_INPUTS:
        wizard.add_argument(
            "--" + name.replace("_", "-"),
            type=_size_arg if parse is parse_size else parse,
            help=prompt,
        )
    wizard.add_argument(
        "--cpus",
        type=int,
        metavar="N",
        help="CPUs of the broker's machine (default: this one's usable CPUs)",
    )
    wizard.add_argument("--out", metavar="FILE", help="write the TOML here (default: stdout)")
    wizard.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    estimate = add("estimate", cmd_config_estimate, config_commands)
    _add_broker_options(estimate, _ESTIMATE_OPTIONS)
    estimate.add_argument("--connections", type=int, default=0, metavar="N", help="connections")
    estimate.add_argument(
        "--sessions", type=int, default=0, metavar="S", help="sessions (subscriptions)"
    )
    estimate.add_argument(
        "--messages", type=int, default=0, metavar="M", help="messages waiting in memory"
    )
    estimate.add_argument(
        "--message-bytes",
        dest="message_bytes",
        type=_size_arg,
        default=0,
        metavar="B",
        help="body bytes of each message (e.g. 1KiB)",
    )
    estimate.add_argument(
        "--destinations",
        type=int,
        default=0,
        metavar="D",
        help="destinations (queues, topics with subscribers, durable subscriptions)",
    )

    admin_commands = group(
        "admin",
        f"""Ask a running broker how it is doing.

        Through its admin API (HTTP JSON on loopback). Without --port, it asks the broker
        of the data dir --data-dir (default {default_data_dir}, as serve's), which records
        where it listens in {PORTS_FILE} while it runs; without that record, port 8161.
        """,
    )
    for name, func in (("status", cmd_admin_status), ("flow", cmd_admin_flow)):
        admin_parser = add(name, func, admin_commands)
        admin_parser.add_argument(
            "--data-dir",
            dest="data_dir",
            metavar="DIR",
            help=f"the broker's data dir, where it records its ports in {PORTS_FILE} "
            f"(default {default_data_dir}, as serve's)",
        )
        admin_parser.add_argument(
            "--host", help="admin API address (default: the recorded one, else 127.0.0.1)"
        )
        admin_parser.add_argument(
            "--port",
            type=int,
            metavar="P",
            help="admin API port (default: the one the broker of --data-dir recorded, else 8161)",
        )
        admin_parser.add_argument("--json", action="store_true", help="print the raw JSON")
        admin_parser.add_argument(
            "--user",
            metavar="NAME",
            help="a user in group admin, for a broker with a users file; the password from "
            f"--password-file, else ${_PASSWORD_VARIABLE}, else asked on a terminal",
        )
        admin_parser.add_argument(
            "--password-file",
            dest="password_file",
            metavar="FILE",
            help="read --user's password from the first line of FILE",
        )

    user_commands = group(
        "user",
        """Add, remove and list the users who may connect.

        They are in the users file, security.users_file.
        """,
    )
    for name, func in (("add", cmd_user_add), ("remove", cmd_user_remove), ("list", cmd_user_list)):
        user_parser = add(name, func, user_commands)
        if name != "list":
            user_parser.add_argument("name", metavar="NAME", help="the user")
        if name == "add":
            user_parser.add_argument(
                "--group", action="append", metavar="G", help="a group of the user (repeatable)"
            )
            user_parser.add_argument(
                "--replace", action="store_true", help="change an existing user's password"
            )
        user_parser.add_argument(
            "--users-file", dest="users_file", metavar="FILE", help="the users file"
        )
        user_parser.add_argument(
            "--config", metavar="FILE", help="a config whose security.users_file to use"
        )

    export = add("export", cmd_export)
    export.add_argument(
        "--data-dir", dest="data_dir", metavar="DIR", required=True, help="the broker's data dir"
    )
    export.add_argument("--out", metavar="OUT", required=True, help="export directory")
    export.add_argument(
        "--destination", metavar="PATTERN", help="only destinations matching (fnmatch)"
    )
    export.add_argument(
        "--since", metavar="TIME", help="only messages received since (ISO-8601 or epoch ms)"
    )
    export.add_argument(
        "--no-body", dest="no_body", action="store_true", help="leave the body column out"
    )
    export.add_argument(
        "--max-memory",
        dest="max_memory",
        metavar="SIZE",
        default="128MiB",
        help="keep the export's memory under this (default 128MiB): it sizes its batches",
    )

    from mpbroker.loadgen.cli import add_arguments

    add_arguments(add("bench", cmd_bench))
    return parser


def _error_prefix(args: argparse.Namespace) -> str:
    """`<3>` (error) when stderr is the journal, so that a refused start is filed as an
    error (`journalctl -p err`), not at the stream's default priority."""
    from mpbroker.logs import log_format

    chosen = getattr(args, "log_format", None) or "auto"
    try:
        fd = sys.stderr.fileno()
    except (OSError, ValueError):  # not a file (a test capturing it)
        return ""
    journal = log_format(chosen, os.environ.get("JOURNAL_STREAM"), fd)
    return "<3>" if journal == "journal" else ""


def main(argv: Sequence[str] | None = None) -> int:
    from mpbroker.security import UsersFileError
    from mpbroker.workers.datadir import DataDirError

    parser = build_parser()
    args = _parse(parser, argv)
    try:
        result: int = args.func(args)
    except (ConfigError, DataDirError, UsersFileError) as exc:
        print(f"{_error_prefix(args)}mpbroker: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `mpbroker config show | head`: the reader left; say nothing more (and let no
        # flush at exit complain about it either).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return result


if __name__ == "__main__":
    sys.exit(main())
