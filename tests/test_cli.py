"""The `mpbroker` command line: help for every command, `config show`, clean config errors."""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpbroker import __version__
from mpbroker.cli import build_parser, main
from mpbroker.config import Config, config_from_mapping, load_config


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


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_tree_has_the_commands_we_document() -> None:
    assert ("serve",) in COMMANDS
    assert ("config", "show") in COMMANDS


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
    assert capsys.readouterr().out.strip() == f"mpbroker {__version__}"


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
        "store",
        "replay",
        "flow",
        "admin",
        "memory",
        "compression",
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
    assert config == load_config(path).replace(
        "broker", host="0.0.0.0", data_dir="/var/lib/mpbroker", gateways=3, log_level="debug"
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
    # Every line of `config show` stands in the sample, commented out where it is a setting.
    text = sample.read_text()
    for line in shown:
        assert (line if line.startswith("[") or not line else f"# {line}") in text, line
