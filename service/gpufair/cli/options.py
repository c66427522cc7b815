"""Options every command shares: output formats, defaults shown in help, `serve` settings from
the environment, and shell completion.

- `-o table|json|yaml` on every read (`add_output_option`, `emit`): JSON is the proto's own JSON
  mapping (field names as in the proto) with every field, zeros, empty strings and empty lists
  included (`message_json`), so a script reading `.gpus` gets 0, not nothing; a field with
  presence (an `optional`, a message) that is not set stays out. YAML: the short forms of
  cluster files (`config_file.message_to_data`) with every field as in JSON, so a queue's 0
  GPU-hours is written as 0; only `get config -o yaml` leaves the defaults out, a file `apply`
  takes back as a person writes it.
- `HelpFormatter` ends each option's help with its default, unless the help already says it.
- `env_defaults(parser, prefix)`: each option `--foo-bar` of `parser` reads `GPUFAIR_FOO_BAR` when
  not given on the command line. It is generic, so options added later get their variable too;
  a variable that does not parse is the same one-line error as a bad flag, naming the variable.
- `completion_script(parser, shell)`: a bash or zsh completion script written from the parser
  itself, so it never lags the commands.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeAlias

import yaml
from google.protobuf import json_format
from google.protobuf.message import Message

from gpufair.config_file import message_to_data

# The subcommands of `gpufair`, on which each command module registers its own. A string:
# argparse's class is generic only in the type stubs, not at run time.
SubCommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

OUTPUTS = ("table", "json", "yaml")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def add_output_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=OUTPUTS, default="table", help="output format")


def message_json(message: Message) -> str:
    """`message` in the proto's JSON mapping with every field: protobuf leaves out the fields at
    their zero value by default, which a script cannot tell from a field that does not exist."""
    data = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return json.dumps(data, indent=2)


def emit(fmt: str, message: Message, show_table: Callable[[], None]) -> None:
    """Print `message` as JSON or YAML, or call `show_table` for the human-readable form."""
    if fmt == "json":
        print(message_json(message))
    elif fmt == "yaml":
        print(message_yaml(message), end="")
    else:
        show_table()


def message_yaml(message: Message) -> str:
    """`message` in the YAML short forms with every field, zeros included (module docstring)."""
    return yaml.safe_dump(message_to_data(message, every_field=True), sort_keys=False)


def emit_rows(fmt: str, rows: list[dict[str, Any]], show_table: Callable[[], None]) -> None:
    """The same for results that are not a message (rows of plain values)."""
    if fmt == "json":
        print(json.dumps(rows, indent=2, default=str))
    elif fmt == "yaml":
        print(yaml.safe_dump(rows, sort_keys=False), end="")
    else:
        show_table()


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, with each option's default at the end of its help."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or not action.option_strings
            or default in (None, False, "", argparse.SUPPRESS)
            or (isinstance(default, list | tuple) and not default)
        ):
            return action.help
        shown = ",".join(default) if isinstance(default, list | tuple) else default
        return f"{text} (default: {shown})".lstrip()


def _parsers(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
    """Every parser under `parser` with its command path, `parser` itself first."""
    stack: list[tuple[list[str], argparse.ArgumentParser]] = [([], parser)]
    while stack:
        path, p = stack.pop(0)
        yield path, p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                seen: set[int] = set()
                for name, sub in action.choices.items():
                    if id(sub) not in seen:
                        seen.add(id(sub))
                        stack.append(([*path, name], sub))


def use_help_formatter(parser: argparse.ArgumentParser) -> None:
    """Show defaults in the help of `parser` and every parser under it (an option without help
    text gets one that states its default: argparse prints nothing for it otherwise)."""
    for _, p in _parsers(parser):
        p.formatter_class = HelpFormatter
        for action in p._actions:
            if action.help is None and action.option_strings:
                action.help = ""
                action.help = HelpFormatter("")._get_help_string(action) or None


def env_name(prefix: str, option: str) -> str:
    return prefix + option.lstrip("-").upper().replace("-", "_")


def env_defaults(
    parser: argparse.ArgumentParser, prefix: str, environ: dict[str, str] | None = None
) -> None:
    """Make each `--foo-bar` option of `parser` default to `$<prefix>FOO_BAR` when that is set.

    Values are checked as the option's own would be (type, choices; flags take 1/0, true/false,
    yes/no, on/off); a bad one ends the program with a usage error naming the variable.
    """
    env = os.environ if environ is None else environ
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.dest in ("help", "version"):
            continue
        name = env_name(prefix, longs[0])
        action.help = f"{action.help or ''} [${name}]".lstrip()
        if name not in env:
            continue
        raw = env[name]
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
            word = raw.strip().lower()
            if word not in _TRUE | _FALSE:
                parser.error(f"${name}: {raw!r} is not a boolean (1/0, true/false, yes/no)")
            action.default = (word in _TRUE) == isinstance(action, argparse._StoreTrueAction)
            continue
        value: Any = raw
        if callable(action.type):
            try:
                value = action.type(raw)
            except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
                parser.error(f"${name}: {raw!r} is not valid for {longs[0]}: {exc}")
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(str, action.choices))
            parser.error(f"${name}: {raw!r} is not one of {choices}")
        action.default = value


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """A completion script for `shell` (bash or zsh; zsh through its bash compatibility)."""
    cases = []
    for path, p in _parsers(parser):
        words: list[str] = []
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                words += list(action.choices)
            words += [o for o in action.option_strings if o.startswith("--")]
            if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
                words += [str(c) for c in action.choices if not action.option_strings]
        cases.append(f'        "{" ".join(path)}") words="{" ".join(words)}" ;;')
    prog = parser.prog
    body = "\n".join(cases)
    script = f"""# {prog} completion for {shell}: eval "$({prog} completion {shell})"
_{prog}_complete() {{
    local i path="" cur="${{COMP_WORDS[COMP_CWORD]}}" words=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in -*) ;; *)
            local next="${{path:+$path }}${{COMP_WORDS[i]}}"
            case "$next" in
{chr(10).join(f'                "{" ".join(path)}") path="$next" ;;' for path, _ in _parsers(parser) if path)}
            esac ;;
        esac
    done
    case "$path" in
{body}
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _{prog}_complete {prog}
"""
    if shell == "zsh":
        script = "autoload -U +X bashcompinit && bashcompinit\n" + script
    return script
