"""The base of the per-daemon options objects: declare once, parse, report.

Each daemon's options are one dataclass whose fields are declared with
``option(kind, default, help)``.  The field name is the flag name with ``-``
changed to ``_``; that single declaration drives argv parsing, the config file,
``-h`` text and ``GET /config/:opt``, so adding an option is adding one field.

Resolution follows NSQ (and STYLE habit 9): a flag given on the command line
beats the config file, which beats the default.  The object is built at the
entry point and passed down; nothing below it reads argv, files or the
environment for configuration.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import ClassVar

from .config_file import read_config_file
from .flags import HelpRequested, OptionsError, format_usage, parse_flags
from .kinds import Kind


@dataclasses.dataclass(frozen=True, eq=False)
class Spec:
    """One option as the parser sees it."""

    attr: str  # dataclass field name, e.g. "msg_timeout"
    name: str  # flag name, e.g. "msg-timeout"
    kind: Kind
    help: str
    cfg: str  # config-file key and GET /config/:opt name
    from_file: bool  # read from --config (False for --config, --version and no-op flags)
    reported: bool  # visible through GET /config/:opt
    nsqpy_only: bool  # an nsqpy extension, not an NSQ flag
    support: object = None  # None: implemented; else a support.Refused / Unused / Deprecated (help says so)
    hidden: bool = False  # accepted, but left out of -h and the example config files (test-only flags)


def option(kind: Kind, default=None, help: str = "", *, factory=None, cfg: str | None = None,
           from_file: bool = True, reported: bool = True, nsqpy_only: bool = False, support=None, hidden=False):
    """Declare a dataclass field that is also a flag; ``factory`` computes the default. ``support``: what nsqpy
    does with an option it accepts but does not implement yet (``nsqpy.config.support``); None: implemented.
    ``hidden``: a test-only flag (fault injection), accepted but not listed by -h."""
    meta = {"option": (kind, help, cfg, from_file, reported, nsqpy_only, support, hidden)}
    if factory is None and isinstance(default, list):
        factory = default.copy
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def parse(cls, argv: list[str], prog: str | None = None):
    """Build ``cls`` from argv (and the --config file it names); raise OptionsError or HelpRequested."""
    specs = cls.specs()
    by_flag = {spec.name: spec for spec in specs}
    from_flags = parse_flags(by_flag, argv, lambda: cls.usage(prog))
    opts = cls()
    config_path = from_flags.get(by_flag["config"], "")
    from_file = read_config_file(config_path, specs) if config_path else {}
    for spec in specs:
        if spec in from_flags:
            setattr(opts, spec.attr, from_flags[spec])
        elif spec in from_file:
            setattr(opts, spec.attr, from_file[spec])
    opts.settle()
    return opts


def parse_or_exit(cls, argv: list[str] | None = None, prog: str | None = None):
    """Entry-point wrapper: usage on -h (exit 0), one line on stderr and exit 2 on any error."""
    try:
        return parse(cls, sys.argv[1:] if argv is None else argv, prog)
    except HelpRequested as help_request:
        sys.stderr.write(help_request.usage)  # Go's flag package prints usage on stderr too
        raise SystemExit(0) from None
    except OptionsError as err:
        sys.stderr.write("%s\n" % err)
        raise SystemExit(OptionsError.exit_code) from None


class Options:
    """Mixin for the daemon dataclasses: parsing, usage and /config lookups."""

    PROG: ClassVar[str] = ""

    @classmethod
    def specs(cls) -> list[Spec]:
        found = cls.__dict__.get("_specs")
        if found is None:
            found = [_spec(field) for field in dataclasses.fields(cls) if "option" in field.metadata]
            cls._specs = found
        return found

    @classmethod
    def parse(cls, argv: list[str], prog: str | None = None):
        return parse(cls, argv, prog)

    @classmethod
    def parse_or_exit(cls, argv: list[str] | None = None, prog: str | None = None):
        return parse_or_exit(cls, argv, prog)

    @classmethod
    def usage(cls, prog: str | None = None) -> str:
        return format_usage(prog or cls.PROG, cls.specs(), cls())

    def settle(self) -> None:
        """Apply NSQ's cross-option rules after resolution; raise OptionsError on a conflict."""

    def config_value(self, name: str):
        """The JSON value of GET /config/<name>; KeyError for a name that is not an option."""
        for spec in self.specs():
            if spec.cfg == name and spec.reported:
                value = spec.kind.to_json(getattr(self, spec.attr))
                return list(value) if isinstance(value, list) else value
        raise KeyError(name)


def _spec(field: dataclasses.Field) -> Spec:
    kind, help_text, cfg, from_file, reported, nsqpy_only, support, hidden = field.metadata["option"]
    suffix = support.help_suffix() if support is not None else ""
    return Spec(
        attr=field.name, name=field.name.replace("_", "-"), kind=kind,
        help=f"{help_text} {suffix}" if suffix else help_text,
        cfg=cfg or field.name, from_file=from_file, reported=reported, nsqpy_only=nsqpy_only, support=support,
        hidden=hidden,
    )


def require(condition: bool, message: str) -> None:
    """settle() helper: raise the one-line OptionsError unless condition holds."""
    if not condition:
        raise OptionsError(message)
