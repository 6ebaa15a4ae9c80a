"""What ``attnviz --help``, ``attnviz COMMAND --help`` and a bad flag print: usage lines a
newcomer can copy, and both scenario forms (.attn.json and .attn.npz) named."""

from __future__ import annotations

import re

import pytest

from attnviz.cli import SUBCOMMANDS, main

WITH_FILE = ("compute", "explain", "code", "export", "tiles")  # the commands that take FILE


def help_of(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    out, err = capsys.readouterr()
    assert exit_.value.code == 0 and err == ""
    return out


def usage_block(text: str) -> list[str]:
    """The usage lines: from 'usage:' to the first blank line."""
    return text.split("\n\n", 1)[0].splitlines()


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_each_command_usage_starts_attnviz_command(capsys, command):
    lines = usage_block(help_of(capsys, command))
    assert re.match(rf"usage: attnviz {command} \[-h\]( |$)", lines[0]), lines
    joined = " ".join(lines)
    assert "[FILE]" not in joined.split(command, 1)[0]  # not the top-level usage in front
    assert "COMMAND ..." not in joined and joined.count("attnviz") == 1
    indent = len(f"usage: attnviz {command} ")
    for line in lines[1:]:  # wrapped lines line up under the first option
        assert line.startswith(" " * indent) and line[indent] != " ", lines


def test_top_level_usage_gives_the_window_and_the_commands(capsys):
    lines = usage_block(help_of(capsys))
    assert lines == ["usage: attnviz [FILE]", "       attnviz [-h] [--version] COMMAND ..."]


@pytest.mark.parametrize("command", [c for c in SUBCOMMANDS if c != "bench"])
def test_a_bad_flag_is_one_line_that_points_at_the_commands_help(capsys, command):
    rc, (out, err) = main([command, "--frobnicate"]), capsys.readouterr()
    assert (rc, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("attnviz: ")
    assert err.rstrip().endswith(f"see 'attnviz {command} --help'"), err
    assert "usage:" not in err


def test_a_bad_top_level_flag_points_at_attnviz_help(capsys):
    rc, (_, err) = main(["--frobnicate", "x"]), capsys.readouterr()
    assert rc == 2 and err.rstrip().endswith("see 'attnviz --help'"), err


@pytest.mark.parametrize("command", WITH_FILE)
def test_file_help_names_both_scenario_forms(capsys, command):
    text = help_of(capsys, command)
    file_help = re.search(r"^  FILE +(.*(?:\n {10,}.*)*)", text, re.MULTILINE)
    assert file_help is not None, text
    words = " ".join(file_help.group(1).split())
    assert ".attn.json" in words and ".attn.npz" in words, words


def test_top_level_help_and_import_out_name_both_forms(capsys):
    top = " ".join(help_of(capsys).split())
    assert "'attnviz FILE' opens it on a saved scenario, .attn.json" in top
    assert ".attn.npz" in top
    imp = " ".join(help_of(capsys, "import").split())
    assert ".attn.json (text), or .attn.npz (binary" in imp
