"""What `--help` shows, for every command and subcommand (the argparse tree, walked): whole
one-sentence summaries in each parent's list, in one style; descriptions that start at the
left margin; a mistyped option refused with its own command's usage; and only options that
change what their command does."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from mpbroker.cli import build_parser, main
from mpbroker.host import usable_cpus
from tests.test_cli import walk


def subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    """The commands of `parser`'s list: name -> (summary, parser)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            return {name: (helps[name], sub) for name, sub in action.choices.items()}
    return {}


TREE = dict(walk(build_parser()))
PARENTS = [path for path, parser in TREE.items() if subcommands(parser)]
LEAVES = [path for path, parser in TREE.items() if not subcommands(parser)]


def name_of(path: tuple[str, ...]) -> str:
    return " ".join(path) or "mpbroker"


@pytest.fixture(autouse=True)
def _setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """80 columns, whatever the terminal; an empty directory (`config show` reads the
    default data dir, ./mpbroker-data)."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(tmp_path)


def help_of(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main([*path, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def listed(text: str) -> dict[str, str]:
    """The command list of a parent's help: name -> its summary, its lines joined."""
    entries: dict[str, str] = {}
    name = ""
    for line in text.split("positional arguments:\n", 1)[1].splitlines():
        if not line.strip() or not line.startswith(" "):
            break
        if entry := re.match(r" {4}(\S+)\s+(.*)", line):
            name = entry[1]
            entries[name] = entry[2]
        elif line.startswith(" " * 6) and name:
            entries[name] += " " + line.strip()
    return entries


@pytest.mark.parametrize("path", PARENTS, ids=name_of)
def test_the_summaries_in_a_command_list_are_whole_sentences_in_one_style(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    shown = listed(help_of(path, capsys))
    commands = subcommands(TREE[path])
    assert set(shown) == set(commands)
    for name, (summary, sub) in commands.items():
        # One sentence, capitalised, that ends: the description's first paragraph, whole.
        assert re.fullmatch(r"[A-Z][^\n]*[.]", summary), (name, summary)
        assert summary.count(". ") == 0, (name, summary)
        assert sub.description is not None
        assert summary == " ".join(sub.description.split("\n\n")[0].split()), name
        # And the list shows all of it: no line ends in the middle of it.
        assert shown[name] == summary, (name, shown[name])


@pytest.mark.parametrize("path", list(TREE), ids=name_of)
def test_descriptions_start_at_the_left_margin(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    description = TREE[path].description
    assert description
    text = help_of(path, capsys)
    for line in description.splitlines():
        assert not line.startswith(" "), (name_of(path), line)
        if line:
            assert f"\n{line}\n" in text, (name_of(path), line)


@pytest.mark.parametrize("path", LEAVES, ids=name_of)
def test_a_mistyped_option_is_refused_with_the_commands_own_usage(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([*path, "--prot", "0"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: mpbroker {name_of(path)} "), err
    assert f"\nmpbroker {name_of(path)}: error: " in err


def test_serve_with_a_mistyped_option_says_so_with_serves_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--prot", "0"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: mpbroker serve [-h]")
    assert err.endswith("\nmpbroker serve: error: unrecognized arguments: --prot 0\n")


# -- every option of config show and config estimate changes what it prints ----------------


def options_of(parser: argparse.ArgumentParser) -> list[str]:
    return [
        action.option_strings[-1]
        for action in parser._actions
        if action.option_strings and not isinstance(action, argparse._HelpAction)
    ]


def trials(tmp_path: Path) -> dict[str, tuple[list[str], list[str]]]:
    """For each option: arguments without it, and the option with a value that must change
    the output against them."""
    big = tmp_path / "big.toml"
    big.write_text('[memory]\nmax_memory = "4GiB"\n')
    per_cpu = tmp_path / "per-cpu.toml"
    per_cpu.write_text('[broker]\np2p_workers = 0\n[memory]\nmax_memory = "4GiB"\n')
    fresh, recorded = tmp_path / "fresh", tmp_path / "recorded"
    fresh.mkdir()
    recorded.mkdir()
    # A data dir made with more p2p workers than this machine would start.
    partitions: dict[str, object] = {"p2p_workers": usable_cpus().count + 1}
    partitions |= {"pubsub_workers": 1, "dead_letter_prefix": "DLQ."}
    (recorded / "mpbroker-partitions.json").write_text(json.dumps(partitions))
    return {
        "--config": ([], ["--config", str(big)]),
        "--host": ([], ["--host", "127.0.0.2"]),
        "--port": ([], ["--port", "61000"]),
        "--data-dir": (
            ["--config", str(per_cpu), "--data-dir", str(fresh)],
            ["--data-dir", str(recorded)],
        ),
        "--gateways": (["--gateways", "1"], ["--gateways", "2"]),
        "--log-level": ([], ["--log-level", "debug"]),
        "--log-format": ([], ["--log-format", "journal"]),
        "--admin-port": ([], ["--admin-port", "-1"]),
        "--connections": ([], ["--connections", "10"]),
        "--sessions": ([], ["--sessions", "10"]),
        "--messages": ([], ["--messages", "10"]),
        "--message-bytes": (["--messages", "10"], ["--message-bytes", "1KiB"]),
        "--destinations": ([], ["--destinations", "10"]),
    }


def printed(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert (code, err) == (0, ""), argv
    return out


@pytest.mark.parametrize("command", [("config", "show"), ("config", "estimate")], ids=name_of)
def test_every_option_changes_what_the_command_prints(
    command: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An option listed where it does nothing misleads: `--log-level` on `config estimate`
    (the memory a load needs), say."""
    table = trials(tmp_path)
    for option in options_of(TREE[command]):
        assert option in table, f"{option}: add a trial for it"
        before, change = table[option]
        assert printed(capsys, *command, *before) != printed(capsys, *command, *before, *change), (
            f"{name_of(command)} {option} changes nothing"
        )


def test_estimate_takes_only_the_options_that_count_the_processes() -> None:
    assert options_of(TREE[("config", "estimate")]) == [
        "--config",
        "--data-dir",
        "--gateways",
        "--connections",
        "--sessions",
        "--messages",
        "--message-bytes",
        "--destinations",
    ]
