"""The `mpbroker` command line: help for every command, `config show`, clean config errors."""

from __future__ import annotations

import argparse
import importlib.util
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpbroker import __version__, native
from mpbroker.cli import build_parser, main
from mpbroker.config import Config, config_from_mapping, load_config, replace_settings


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser in the tree with the command words that reach it (after sqlite-utils)."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, (*path, name))


COMMANDS = [path for path, _ in walk(build_parser())]
SUBCOMMANDS = [path for path in COMMANDS if path]


BUDGET_HEADER = "# Memory budget: the most each module can hold (instances x each, total)"


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in an empty directory: `config show` reads the default data dir, ./mpbroker-data,
    which a broker started from the checkout (`bash ops/run.sh`) leaves behind."""
    monkeypatch.chdir(tmp_path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_tree_has_the_commands_we_document() -> None:
    assert ("serve",) in COMMANDS
    assert ("config", "show") in COMMANDS
    assert ("config", "wizard") in COMMANDS
    assert ("config", "estimate") in COMMANDS


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "mpbroker")
def test_every_command_has_help_with_a_description(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    parser = dict(walk(build_parser()))[path]
    assert parser.description
    with pytest.raises(SystemExit) as info:
        main([*path, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: mpbroker")
    assert parser.description.splitlines()[0] in out


@pytest.mark.parametrize("path", SUBCOMMANDS, ids=" ".join)
def test_every_subcommand_is_summarised_in_its_parents_help(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([*path[:-1], "--help"])
    out = capsys.readouterr().out
    listed = [line.split(None, 1) for line in out.splitlines() if line.strip()]
    summaries = {words[0]: words[1] for words in listed if len(words) == 2}
    assert summaries.get(path[-1]), f"{path[-1]!r} has no one-line help in:\n{out}"


def test_leaf_commands_show_an_example() -> None:
    for path, parser in walk(build_parser()):
        if parser._subparsers is None:
            assert parser.description is not None
            assert "Example: mpbroker " + " ".join(path) in parser.description


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"mpbroker {__version__}, {native.describe()}"


def test_the_version_says_whether_the_hot_modules_are_compiled() -> None:
    compiled = native.compiled_modules()
    if not compiled:
        assert native.describe() == "pure Python (hot modules not compiled)"
    elif len(compiled) == len(native.HOT_MODULES):
        assert native.describe() == f"hot modules compiled with mypyc ({len(compiled)})"
    # Every name is a module of the package, so a build compiles what the list says.
    for name in native.HOT_MODULES:
        assert importlib.util.find_spec(name) is not None, name


@pytest.mark.parametrize("argv", [[], ["config"], ["nonsense"], ["config", "show", "--port", "x"]])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage: mpbroker" in capsys.readouterr().err


# -- config show -----------------------------------------------------------------------------


def test_config_show_prints_toml_that_reads_back_as_the_same_config(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "config", "show")
    assert (code, err) == (0, "")
    data = tomllib.loads(out)
    assert config_from_mapping(data) == Config()
    assert list(data) == [
        "broker",
        "stomp",
        "rings",
        "queues",
        "topics",
        "transactions",
        "selectors",
        "store",
        "replay",
        "flow",
        "admin",
        "security",
        "memory",
        "compression",
        "temp_store",
        "vol_queue_store",
        "pers_queue_store",
        "topic_store",
    ]


def test_config_show_documents_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "config", "show")
    assert 'host = "127.0.0.1"  # address the STOMP listener binds to' in out
    assert "heartbeat_grace = 2.0  # " in out
    settings = [line for line in out.splitlines() if " = " in line]
    assert all("  # " in line for line in settings)


def test_config_show_applies_the_file_and_the_command_line_overrides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('[broker]\nport = 7000\n[queues]\nmax_bytes = "32MiB"\n')
    code, out, _ = run(
        capsys,
        "config",
        "show",
        "--config",
        str(path),
        "--host",
        "0.0.0.0",
        "--data-dir",
        "/var/lib/mpbroker",
        "--gateways",
        "3",
        "--log-level",
        "debug",
    )
    assert code == 0
    config = config_from_mapping(tomllib.loads(out))
    assert config == replace_settings(
        load_config(path),
        "broker",
        host="0.0.0.0",
        data_dir="/var/lib/mpbroker",
        gateways=3,
        log_level="debug",
    )
    assert config.broker.port == 7000
    assert config.queues.max_bytes == 32 * 1024 * 1024


def test_a_bad_value_in_the_config_file_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broker.toml"
    path.write_text("[broker]\nport = 70000\n")
    code, out, err = run(capsys, "config", "show", "--config", str(path))
    assert code == 2
    assert out == ""
    assert err.startswith("mpbroker: config: broker.port = 70000: ")
    assert "65535" in err


def test_an_unknown_key_in_the_config_file_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broker.toml"
    path.write_text("[queues]\nprefech = 5\n")
    code, _, err = run(capsys, "config", "show", "--config", str(path))
    assert code == 2
    assert "queues.prefech" in err


def test_a_missing_config_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.toml"
    code, _, err = run(capsys, "config", "show", "--config", str(missing))
    assert code == 2
    assert "--config" in err
    assert str(missing) in err
    assert "file not found" in err


def test_a_bad_override_exits_2_naming_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "config", "show", "--port", "70000")
    assert code == 2
    assert "broker.port" in err
    code, _, err = run(capsys, "config", "show", "--gateways", "-1")
    assert code == 2
    assert "broker.gateways" in err


def test_serve_with_a_bad_config_exits_2_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broker.toml"
    path.write_text("[rings]\ncapacity_bytes = 3000000\n")
    code, _, err = run(capsys, "serve", "--config", str(path))
    assert code == 2
    assert "rings.capacity_bytes" in err


@pytest.mark.parametrize("data_dir", ["C:\\new\\data", 'with "quotes"'])
def test_config_show_escapes_strings(data_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--data-dir", data_dir]) == 0
    shown = config_from_mapping(tomllib.loads(capsys.readouterr().out))
    assert shown.broker.data_dir == data_dir


def test_sample_config_lists_every_setting_and_loads(capsys: pytest.CaptureFixture[str]) -> None:
    # Regenerate with `bash ops/sample-config.sh` after adding a setting.
    sample = Path(__file__).parent.parent / "ops" / "mpbroker.toml"
    assert load_config(sample) == Config()
    assert main(["config", "show"]) == 0
    shown = capsys.readouterr().out.splitlines()
    # The memory budget after the settings depends on the machine (one gateway per CPU).
    shown = shown[: shown.index(BUDGET_HEADER)]
    # Every line of `config show` stands in the sample, commented out where it is a setting.
    text = sample.read_text()
    for line in shown:
        assert (line if line.startswith("[") or not line else f"# {line}") in text, line


# -- memory budget: config show, serve, wizard, estimate ----------------------------------------


def test_config_show_ends_with_the_memory_budget(capsys: pytest.CaptureFixture[str]) -> None:
    from mpbroker.config import format_bytes
    from mpbroker.memory import plan

    code, out, _ = run(capsys, "config", "show", "--gateways", "2")
    assert code == 0
    lines = out.splitlines()
    budget = lines[lines.index(BUDGET_HEADER) :]
    assert all(line.startswith("# ") for line in budget)  # TOML comments: the file still loads
    memory = plan(replace_settings(Config(), "broker", gateways=2))
    text = "\n".join(budget)
    for b in memory.budgets:
        assert f"# {b.module} " in text
    assert "10 rings x (1 MiB + 4 KiB)" in text
    for label, value in (
        ("module budgets", memory.budget_total),
        ("fixed cost", memory.fixed_cost),
        ("theoretical maximum", memory.maximum),
        ("memory.max_memory", memory.max_memory),
        ("headroom", memory.headroom),
    ):
        row = next(line for line in budget if line.startswith(f"# {label} "))
        assert format_bytes(value) in row, row


def test_serve_refuses_a_config_over_max_memory_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broker.toml"
    # 8 MiB rings: among the largest modules, and the largest alone does not cover the
    # excess, so the refusal names them.
    path.write_text('[memory]\nmax_memory = "128MiB"\n[rings]\ncapacity_bytes = "8MiB"\n')
    data = tmp_path / "data"
    code, _, err = run(capsys, "serve", "--config", str(path), "--data-dir", str(data))
    assert code == 2
    assert err.startswith("mpbroker: config: memory.max_memory = 134217728: ")
    assert "exceeds memory.max_memory = 128 MiB by " in err
    assert "thread/buffer (rings)" in err and "rings.capacity_bytes" in err
    assert not data.exists()


WIZARD_FLAGS = [
    "--memory",
    "256MB",
    "--topics",
    "10",
    "--queues",
    "10",
    "--largest-topic-message",
    "64KiB",
    "--largest-queue-message",
    "64KiB",
    "--rate",
    "50",
    "--connections",
    "20",
    "--threads",
    "500",
    "--cpus",
    "2",
]


def test_the_wizard_writes_a_config_that_loads_and_prints_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mpbroker.memory import WizardInputs, derive

    out = tmp_path / "broker.toml"
    code, stdout, err = run(capsys, "config", "wizard", *WIZARD_FLAGS, "--out", str(out))
    assert (code, err) == (0, "")
    expected = derive(WizardInputs(256_000_000, 10, 10, 65536, 65536, 50.0, 20, 500, 2))
    assert out.read_text() == expected.toml()
    assert load_config(out) == expected.config
    assert "broker.gateways = 2: 500 threads/workers, at most one per CPU (2)" in stdout
    assert "theoretical maximum" in stdout and f"written to {out}" in stdout
    # The file it wrote passes serve's check too.
    code, shown, _ = run(capsys, "config", "show", "--config", str(out))
    assert code == 0 and "# headroom " in shown


def test_the_wizard_never_overwrites_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "broker.toml"
    out.write_text("# mine\n")
    code, _, err = run(capsys, "config", "wizard", *WIZARD_FLAGS, "--out", str(out))
    assert code == 2
    assert f"{out} exists (--force overwrites it)" in err
    assert out.read_text() == "# mine\n"
    code, _, _ = run(capsys, "config", "wizard", *WIZARD_FLAGS, "--out", str(out), "--force")
    assert code == 0
    assert out.read_text().startswith("# Written by `mpbroker config wizard`")


def test_the_wizard_writes_to_stdout_without_out(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "config", "wizard", *WIZARD_FLAGS)
    assert code == 0
    assert config_from_mapping(tomllib.loads(out)).broker.max_connections == 20


def test_the_wizard_asks_for_missing_inputs_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = iter(["lots", "64KiB", "64KiB", "50", "20", "500"])
    asked: list[str] = []

    def answer(prompt: str) -> str:
        asked.append(prompt)
        return next(answers)

    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", answer)
    code, out, err = run(
        capsys, "config", "wizard", "--memory", "256MB", "--topics", "10", "--queues", "10"
    )
    assert code == 0, err
    # A bad answer is explained and asked again.
    assert asked[:2] == ["largest topic message (e.g. 64KiB): "] * 2
    assert "not a size: 'lots'" in err
    assert len(asked) == 6
    assert "[broker]" in out


def test_the_wizard_names_missing_inputs_when_it_cannot_ask(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    code, out, err = run(capsys, "config", "wizard", "--memory", "256MB", "--topics", "10")
    assert (code, out) == (2, "")
    assert "missing --queues, --largest-topic-message, --largest-queue-message, --rate," in err


def test_the_wizard_says_which_input_cannot_fit(capsys: pytest.CaptureFixture[str]) -> None:
    flags = [*WIZARD_FLAGS]
    flags[flags.index("--connections") + 1] = "100000"
    code, out, err = run(capsys, "config", "wizard", *flags)
    # A refusal of what was given: 2, as every other (asking again cannot help).
    assert (code, out) == (2, "")
    assert err.startswith("mpbroker: config wizard: --connections 100000: ")
    assert "short by" in err
    assert err.count("\n") == 1


def _wizard_with(**changed: str) -> list[str]:
    flags = [*WIZARD_FLAGS]
    for name, value in changed.items():
        flags[flags.index("--" + name.replace("_", "-")) + 1] = value
    return flags


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            _wizard_with(memory="32MB"),
            "mpbroker: config wizard: --memory 32 MB: below the fixed cost of the smallest broker",
        ),
        (
            _wizard_with(largest_queue_message="200MB"),
            "mpbroker: config wizard: --largest-topic-message/--largest-queue-message 200 MB: ",
        ),
        (_wizard_with(topics="-1"), "mpbroker: config wizard: --topics -1: must be at least 0"),
        (_wizard_with(rate="nan"), "mpbroker: config wizard: --rate nan: must be at least 0"),
        ([*WIZARD_FLAGS, "--cpus", "0"], "mpbroker: config wizard: --cpus 0: must be at least 1"),
        (
            [*WIZARD_FLAGS, "--out", "no/such/dir/broker.toml"],
            "mpbroker: config wizard: cannot write --out no/such/dir/broker.toml: No such file "
            "or directory",
        ),
    ],
    ids=["memory", "message", "topics", "rate", "cpus", "out"],
)
def test_every_refusal_of_the_wizard_is_one_line_naming_the_value_and_exit_2(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "config", "wizard", *argv)
    assert (code, out) == (2, "")
    assert err.startswith(line), err
    assert err.count("\n") == 1 and err.endswith("\n"), err


@pytest.mark.parametrize("command", ["show", "estimate"])
@pytest.mark.parametrize(
    ("content", "line"),
    [
        (None, "mpbroker: config: --config = '{path}': cannot be read: Is a directory"),
        ("x = [", "mpbroker: config: --config = '{path}': not valid TOML: "),
        (b"\xff\xfe", "mpbroker: config: --config = '{path}': not UTF-8 text: "),
        ("[broker]\nport = -5\n", "mpbroker: config: broker.port = -5: "),
        ("[nonsense]\n", "mpbroker: config: "),
    ],
    ids=["directory", "toml", "utf8", "value", "section"],
)
def test_config_show_and_estimate_refuse_a_bad_file_in_one_line_with_exit_2(
    command: str,
    content: str | bytes | None,
    line: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "broker.toml"
    if content is None:
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    code, out, err = run(capsys, "config", command, "--config", str(path))
    assert (code, out) == (2, "")
    assert err.startswith(line.format(path=path)), err
    assert err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--connections", "-1"], "mpbroker: config estimate: connections = -1: must be >= 0"),
        (["--gateways", "-2"], "mpbroker: config: broker.gateways = -2: "),
    ],
)
def test_estimate_refuses_bad_values_in_one_line_with_exit_2(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "config", "estimate", *argv)
    assert (code, out) == (2, "")
    assert err.startswith(line) and err.count("\n") == 1, err


def test_a_bad_size_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["config", "wizard", "--memory", "lots"])
    assert info.value.code == 2
    assert "not a size: 'lots'" in capsys.readouterr().err


def test_estimate_prints_each_term_and_the_total(capsys: pytest.CaptureFixture[str]) -> None:
    from mpbroker.memory import estimate

    argv = ["--connections", "100", "--sessions", "200", "--messages", "1000"]
    code, out, err = run(
        capsys, "config", "estimate", *argv, "--message-bytes", "1KiB", "--gateways", "2"
    )
    assert (code, err) == (0, "")
    expected = estimate(replace_settings(Config(), "broker", gateways=2), 100, 200, 1000, 1024)
    assert out.splitlines() == expected.lines()
    assert "100 connections x " in out and "fits:" in out


def test_estimate_reads_the_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('[memory]\nmax_memory = "1GiB"\n')
    code, out, _ = run(capsys, "config", "estimate", "--config", str(path), "--messages", "10")
    assert code == 0
    assert "memory.max_memory = 1 GiB" in out


def test_estimate_refuses_negative_counts(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "config", "estimate", "--connections", "-1")
    assert code == 2
    assert "connections = -1: must be >= 0" in err


def _readme_section() -> str:
    """docs/configuration.md's "Memory budget" section."""
    readme = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    return readme.split("\n## Memory budget\n", 1)[1].split("\n## ", 1)[0]


def _readme_blocks() -> list[str]:
    """The fenced blocks of docs/configuration.md's "Memory budget" section."""
    return _readme_section().split("```")[1::2]


def test_the_readme_memory_budget_examples_are_what_the_commands_print(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # When a constant in mpbroker/memory/_budget.py changes, paste the commands' output again.
    refusal, table, wizard_usage, wizard_seed, estimate = _readme_blocks()
    path = tmp_path / "broker.toml"
    path.write_text('[memory]\nmax_memory = "128MiB"\n')
    _, _, err = run(capsys, "serve", "--config", str(path), "--gateways", "2")
    assert refusal.strip() == err.strip()
    _, out, _ = run(capsys, "config", "show", "--gateways", "2")
    # The budget, up to the workers (their reason names this machine's CPUs).
    assert table.strip() == out[out.index(BUDGET_HEADER) : out.index("# Workers: ")].strip()
    # The prose after the table quotes its totals.
    from mpbroker.config import format_bytes
    from mpbroker.memory import plan

    memory = plan(replace_settings(Config(), "broker", gateways=2))
    prose = " ".join(_readme_section().split("```")[4].split())
    share = f"{100 * memory.headroom / memory.max_memory:.0f} %"
    assert (
        f"theoretical maximum of {format_bytes(memory.maximum)}, leaving "
        f"{format_bytes(memory.headroom)} ({share})"
    ) in prose
    assert f"Half of the {format_bytes(memory.budget_total)} of module budgets" in prose
    assert wizard_usage.startswith("sh\nmpbroker config wizard --memory 256MB")
    seed = [*WIZARD_FLAGS]
    for flag in ("--largest-topic-message", "--largest-queue-message"):
        seed[seed.index(flag) + 1] = "20MB"
    _, out, err = run(capsys, "config", "wizard", *seed)
    assert err == ""
    # Excerpts of what it writes, in order, cut where a line is "...".
    at = 0
    for excerpt in wizard_seed.strip().split("\n...\n"):
        assert excerpt in out[at:], excerpt
        at = out.index(excerpt, at) + len(excerpt)
    command, _, printed = estimate.strip().partition("\n")
    assert command.startswith("$ mpbroker config estimate ")
    _, out, _ = run(capsys, *command.split()[2:])
    assert printed.strip() == out.strip()


def test_config_show_says_how_many_workers_of_each_kind_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mpbroker.host import usable_cpus

    cpus = usable_cpus()
    path = tmp_path / "broker.toml"
    path.write_text(
        "[broker]\ngateways = 0\np2p_workers = 0\npubsub_workers = 3\n"
        "[replay]\nworkers = 0\n[memory]\nmax_memory = '4GiB'\n"
    )
    code, out, _ = run(capsys, "config", "show", "--config", str(path))
    assert code == 0
    lines = out.splitlines()
    # The settings as written (0 stays 0), the effective counts at the end.
    assert "gateways = 0  # gateway worker processes; 0 = one per usable CPU (as many as fit)" in (
        lines
    )
    tail = lines[lines.index(f"# Workers: {cpus.why()}") :]
    n = cpus.count
    assert tail[1:] == [
        f"#   broker.gateways: {n} (0: one per usable CPU ({n}))",
        f"#   broker.p2p_workers: {n} (0: one per usable CPU ({n}))",
        "#   broker.pubsub_workers: 3 (set)",
        f"#   replay.workers: {min(n, 3)} (0: one per usable CPU ({n})"
        + (", at most one per pubsub worker (3))" if n > 3 else ")"),
    ]


# -- users ---------------------------------------------------------------------------------


def test_user_add_list_remove(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from mpbroker.security import load_users, verify_password

    users = tmp_path / "users"
    config = tmp_path / "broker.toml"
    config.write_text(f'[security]\nusers_file = "{users}"\n')
    monkeypatch.setattr("sys.stdin", io.StringIO("s3cret\n"))
    code, out, _ = run(
        capsys, "user", "add", "alice", "--group", "producers", "--config", str(config)
    )
    assert (code, out) == (0, f"added alice in {users}\n")
    assert verify_password("s3cret", load_users(users)["alice"].password_hash)
    monkeypatch.setattr("sys.stdin", io.StringIO("other\n"))
    code, _, err = run(capsys, "user", "add", "alice", "--users-file", str(users))
    assert code == 2 and "'alice' is in" in err and "--replace" in err
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    code, _, err = run(capsys, "user", "add", "bob", "--users-file", str(users))
    assert (code, err) == (2, "mpbroker: user add: an empty password is not allowed\n")
    monkeypatch.setattr("sys.stdin", io.StringIO("pw\n"))
    code, _, err = run(capsys, "user", "add", "bad name", "--users-file", str(users))
    assert code == 2 and "user name 'bad name'" in err
    monkeypatch.setattr("sys.stdin", io.StringIO("pw\n"))
    assert run(capsys, "user", "add", "bob", "--users-file", str(users))[0] == 0
    code, out, _ = run(capsys, "user", "list", "--users-file", str(users))
    assert out == "alice\tproducers\nbob\t-\n"
    assert run(capsys, "user", "remove", "bob", "--config", str(config))[0] == 0
    code, _, err = run(capsys, "user", "remove", "bob", "--config", str(config))
    assert code == 2 and "no user 'bob'" in err
    assert list(load_users(users)) == ["alice"]


def test_user_commands_need_a_users_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "user", "list")
    assert code == 2
    assert "no users file: give --users-file FILE" in err


# -- admin ---------------------------------------------------------------------------------


@pytest.fixture
def admin_port(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The port of an admin API (in this process) with users: root in group admin
    (password r00t), alice not (s3cret). No password in the environment to begin with."""
    from mpbroker.admin import StatusView
    from mpbroker.admin.server import AdminServer
    from mpbroker.security import User, hash_password

    monkeypatch.delenv("MPBROKER_PASSWORD", raising=False)
    fast = {"n": 2**4, "r": 1}
    users = {
        "root": User("root", hash_password("r00t", **fast), ("admin",)),
        "alice": User("alice", hash_password("s3cret", **fast), ("producers",)),
    }
    server = AdminServer("127.0.0.1", 0, lambda: StatusView(at_ms=1, workers=[]), users=users)
    server.start()
    yield server.address[1]
    server.close()


def admin(capsys: pytest.CaptureFixture[str], port: int, *argv: str) -> tuple[int, str, str]:
    return run(capsys, "admin", "status", "--port", str(port), "--json", *argv)


def test_admin_passes_the_password_of_the_environment(
    admin_port: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MPBROKER_PASSWORD", "r00t")
    code, out, err = admin(capsys, admin_port, "--user", "root")
    assert (code, err) == (0, "")
    assert '"workers": []' in out


@pytest.mark.parametrize(
    ("user", "password", "error"),
    [
        ("root", "guess", "HTTP 401: authentication failed"),
        ("mallory", "r00t", "HTTP 401: authentication failed"),
        ("alice", "s3cret", "HTTP 403: user 'alice' is not in group 'admin'"),
    ],
)
def test_admin_refused_says_why_in_one_line_and_exits_2(
    user: str,
    password: str,
    error: str,
    admin_port: int,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MPBROKER_PASSWORD", password)
    code, out, err = admin(capsys, admin_port, "--user", user)
    assert (code, out) == (2, "")
    assert err == f"mpbroker: admin API at http://127.0.0.1:{admin_port}/status: {error}\n"


def test_admin_without_user_is_told_to_give_one(
    admin_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = admin(capsys, admin_port)
    assert code == 2
    assert err == (
        f"mpbroker: admin API at http://127.0.0.1:{admin_port}/status: HTTP 401: "
        "authentication required: HTTP Basic credentials of a user in group 'admin' "
        "(give --user NAME, the password in $MPBROKER_PASSWORD)\n"
    )


def test_admin_reads_the_first_line_of_the_password_file_before_the_environment(
    admin_port: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MPBROKER_PASSWORD", "wrong")
    secret = tmp_path / "secret"
    secret.write_text("r00t\r\nnot this line\n")
    code, _, err = admin(capsys, admin_port, "--user", "root", "--password-file", str(secret))
    assert (code, err) == (0, "")


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (None, "cannot read --password-file {path}: No such file or directory"),
        ("", "--password-file {path}: its first line is empty"),
        ("\nr00t\n", "--password-file {path}: its first line is empty"),
    ],
)
def test_admin_says_what_is_wrong_with_the_password_file(
    content: str | None,
    error: str,
    admin_port: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "secret"
    if content is not None:
        path.write_text(content)
    code, _, err = admin(capsys, admin_port, "--user", "root", "--password-file", str(path))
    assert (code, err) == (2, f"mpbroker: admin: {error.format(path=path)}\n")


def test_admin_asks_for_the_password_on_a_terminal_and_only_there(
    admin_port: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    def getpass(prompt: str) -> str:
        asked.append(prompt)
        return "r00t"

    monkeypatch.setattr("getpass.getpass", getpass)
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    code, _, err = admin(capsys, admin_port, "--user", "root")
    assert (code, err, asked) == (
        2,
        "mpbroker: admin: --user root needs a password: set MPBROKER_PASSWORD, give "
        "--password-file FILE, or run on a terminal to be asked\n",
        [],
    )
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    code, _, err = admin(capsys, admin_port, "--user", "root")
    assert (code, err, asked) == (0, "", ["password for root: "])


def test_admin_password_file_needs_a_user(
    admin_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("r00t\n")
    code, _, err = admin(capsys, admin_port, "--password-file", str(secret))
    assert (code, err) == (2, "mpbroker: admin: --password-file needs --user NAME\n")


def test_admin_refuses_a_user_name_that_is_not_utf8_in_one_line(
    admin_port: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A byte of the command line that is not UTF-8 arrives as a lone surrogate.
    monkeypatch.setenv("MPBROKER_PASSWORD", "r00t")
    code, _, err = admin(
        capsys, admin_port, "--user", b"r\xf6ot".decode("utf-8", "surrogateescape")
    )
    assert (code, err) == (
        2,
        "mpbroker: admin: cannot send the credentials: the user name or the password is not "
        "valid UTF-8\n",
    )
