"""argv parsing with the rules of Go's ``flag`` package, and its -h text.

NSQ's daemons are Go programs, so their users type Go flag syntax; nsqpy reads
the same command lines the same way:

* ``-name`` and ``--name`` are the same; ``-name=value`` and ``-name value``;
* a bool-like flag never takes the next argument (``-deflate false`` leaves
  deflate on and stops parsing at ``false``); turn it off with ``-deflate=false``;
* parsing stops at ``--`` (consumed) or at the first argument that is not a
  flag (``-`` alone is not a flag); NSQ ignores what follows, and so does nsqpy;
* ``-h``/``-help``/``--help`` asks for usage unless a flag of that name exists;
* repeatable flags accumulate; any other flag given twice keeps the last value.

Error texts are Go's, so scripts and people that know nsqd see the same words.
"""
from __future__ import annotations

import textwrap

from .kinds import go_quote

HELP_WIDTH = 72  # columns of help text after Go's "    \t" indent (a tab stop at 8): every line fits 80


class OptionsError(Exception):
    """A bad command line, config file or combination; str() is one line for stderr, exit code 2."""

    exit_code = 2


class HelpRequested(Exception):
    """-h was given; ``usage`` is the text to print before exiting 0."""

    def __init__(self, usage: str):
        super().__init__(usage)
        self.usage = usage


def parse_flags(specs: dict, argv: list[str], usage) -> dict:
    """Return {spec: value} for the flags present in argv (Go order: the last one wins)."""
    found: dict = {}
    rest = list(argv)
    while rest:
        arg = rest[0]
        if len(arg) < 2 or arg[0] != "-":
            break
        dashes = 2 if arg[1] == "-" else 1
        if arg == "--":
            break
        name = arg[dashes:]
        if not name or name[0] in "-=":
            raise OptionsError("bad flag syntax: %s" % arg)
        rest.pop(0)
        name, has_value, value = name.partition("=")
        has_value = bool(has_value)
        spec = specs.get(name)
        if spec is None:
            if name in ("h", "help"):
                raise HelpRequested(usage())
            raise OptionsError("flag provided but not defined: -%s" % name)
        if spec.kind.is_bool:
            parsed = _parse_bool_like(spec, value if has_value else None)
        else:
            if not has_value:
                if not rest:
                    raise OptionsError("flag needs an argument: -%s" % name)
                value = rest.pop(0)
            try:
                parsed = spec.kind.parse(value)
            except ValueError as err:
                raise OptionsError("invalid value %s for flag -%s: %s" % (go_quote(value), name, err)) from None
        found[spec] = spec.kind.merge(found[spec], parsed) if spec in found else parsed
    return found


def _parse_bool_like(spec, value: str | None):
    try:
        return spec.kind.parse("true" if value is None else value)
    except ValueError as err:
        if value is None:
            raise OptionsError("invalid boolean flag %s: %s" % (spec.name, err)) from None
        raise OptionsError("invalid boolean value %s for -%s: %s" % (go_quote(value), spec.name, err)) from None


def format_usage(prog: str, specs: list, defaults) -> str:
    """Go's ``Usage of prog:`` + PrintDefaults layout, flags sorted by name, each help wrapped to HELP_WIDTH under
    its flag. A help that describes its default in words (``(default: the OS hostname)``) is not followed by the
    value computed on this host as well; hidden (test-only) flags are left out."""
    lines = ["Usage of %s:" % prog]
    for spec in sorted((s for s in specs if not s.hidden), key=lambda s: s.name):
        head = "  -" + spec.name
        if spec.kind.type_name:
            head += " " + spec.kind.type_name
        text = spec.help
        shown = spec.kind.show(getattr(defaults, spec.attr))
        if shown is not None and "(default" not in text:
            text += " (default %s)" % shown
        # Go keeps a one-letter bool flag's help on its own line; no such flag here.
        lines.append(head)
        for paragraph in text.split("\n"):
            wrapped = textwrap.wrap(paragraph, HELP_WIDTH, break_long_words=False, break_on_hyphens=False)
            lines.extend("    \t" + line for line in wrapped or [""])
    return "\n".join(lines) + "\n"
