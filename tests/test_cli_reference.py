"""docs/cli.md: generated from the parser, complete and current."""

import argparse

from vlaperf import cli_reference
from vlaperf.cli import build_parser


def test_the_page_is_what_the_parser_says():
    # a help text, default or option changed without `python -m vlaperf.cli_reference` fails here
    assert cli_reference.main(["--check"]) == 0, "run `python -m vlaperf.cli_reference` and commit docs/cli.md"


def test_every_option_of_every_command_is_on_the_page_in_its_section():
    text = cli_reference.reference_markdown()
    sections = {s.split("\n", 1)[0]: s for s in text.split("\n## vlaperf ")[1:]}
    parser = build_parser()
    assert list(sections) == list(parser.commands)
    for name, sub in parser.commands.items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                assert f"| `{option}`" in sections[name] or f", `{option}`" in sections[name], (name, option)
            if action.help:
                assert " ".join(action.help.split())[:60].replace("|", "\\|") in sections[name], (name, action.dest)


def test_a_pipe_in_a_help_text_does_not_split_the_row():
    assert cli_reference._cell("a | b\n  c") == "a \\| b c"
    switch = argparse.ArgumentParser().add_argument("--x", action="store_true")
    assert (cli_reference._value(switch), cli_reference._default(switch)) == ("", "")
    listed = argparse.ArgumentParser().add_argument("names", nargs="*", metavar="NAME")
    assert cli_reference._value(listed) == "`NAME` ..."
