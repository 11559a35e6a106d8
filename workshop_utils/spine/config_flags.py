"""The flags of ``python -m workshop_utils.train``, generated from ``TrainConfig``'s fields.

One flag per field, in the fields' ``--help`` groups, with the field's help, units and allowed words. The
command builds its parser from here, and so does notebook 06's check of a sweep file's lines, which must read
a line exactly as the command would.
"""

from __future__ import annotations

import argparse
import dataclasses

from ..system.errors import whole_number
from .config import GROUPS, Setting, TrainConfig, field_types, setting_of


COMMAND_DEFAULTS = {"name": "train"}  # where the command's default differs from the field's


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


# Flags only parse: a value of the right type (or a word such as "auto") becomes the field's value, and
# validate_config, the one check of every entry, then judges it (ranges, combinations, paths).

def only_words(s: Setting, types: tuple) -> bool:
    """True when the flag takes a fixed set of words (choices, or named values such as synthetic's yes/no)."""
    return s.choices is not None or (bool in types and bool(s.words))


def value_parser(s: Setting, types: tuple):
    def parse(text: str):
        if text in s.words:
            return s.words[text]
        if only_words(s, types):
            if text in (s.choices or ()):
                return text
            allowed = ", ".join(repr(word) for word in (*s.words, *(s.choices or ())))
            raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {allowed})")
        if int in types:
            return whole_number(text)
        if float in types:
            return number(text)
        return text

    return parse


def metavar(f: dataclasses.Field, s: Setting, types: tuple) -> str:
    if s.metavar:
        return s.metavar
    if only_words(s, types):
        return "{" + ",".join((*s.words, *(s.choices or ()))) + "}"
    return "|".join(("N" if int in types else "X" if float in types else f.name.upper(), *s.words))


def help_text(f: dataclasses.Field, s: Setting) -> str:
    default = COMMAND_DEFAULTS.get(f.name, f.default)
    shown = next((word for word, value in s.words.items() if type(value) is type(default) and value == default),
                 None)
    if shown is None and default is not None:  # None's meaning is in the help itself ("default: all")
        shown = ("on" if default else "off") if isinstance(default, bool) else str(default)
    text = s.help + (f" (default: {shown})" if shown is not None else "")
    return text.replace("%", "%%")  # argparse formats help with %


def add_config_flags(parser: argparse.ArgumentParser) -> dict:
    """One flag per TrainConfig field, in the fields' --help groups; returns the groups by name.

    Every flag defaults to "not given" (argparse.SUPPRESS): the config then takes the field's own
    default, so a default is written once, in the dataclass.
    """
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    all_types = field_types()
    for f in dataclasses.fields(TrainConfig):
        s, types = setting_of(f), all_types[f.name]
        flags = ("--" + f.name.replace("_", "-"), *s.aliases)
        common = dict(dest=f.name, default=argparse.SUPPRESS, help=help_text(f, s))
        group = groups[s.group]
        if types == (bool,):
            group.add_argument(*flags, action=argparse.BooleanOptionalAction, **common)
        elif bool in types:  # on, off, or a value: --resume alone is True, --resume PATH that path
            group.add_argument(*flags, nargs="?", const=True, type=value_parser(s, types),
                               metavar=metavar(f, s, types), **common)
            group.add_argument("--no-" + flags[0][2:], dest=f.name, action="store_const", const=False,
                               default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        else:
            group.add_argument(*flags, type=value_parser(s, types), metavar=metavar(f, s, types), **common)
    return groups
