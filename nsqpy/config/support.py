"""What nsqpy does with an NSQ option it accepts but does not act on yet, and the start-up check that says so.

No flag may be a lie: an option nsqd accepts either does what its help says, or is declared here, next to the
option itself (``option(..., support=Unused(...))``), as one of:

* ``Refused(feature)``: a security feature nsqpy does not have yet (TLS, authorization). Set away from its
  default, the broker refuses to start: serving every client in clear text or unauthenticated when the operator
  asked for TLS or an auth server would be worse than not serving. One FATAL line, exit code 1.
* ``Unused(what)``: accepted so NSQ command lines and config files keep working, without effect yet. Set away from
  its default, it costs one WARNING line at start; ``what`` says what nsqpy does instead. With ``note``, a
  default that NSQ acts on (the HTTP listener, compression) is one INFO line instead, so the operator knows
  what is not there; ``honoured`` names the values that ask for nothing nsqpy lacks (``--http-address=""``,
  ``--snappy=false``): they cost no line.
* ``Deprecated(use)``: deprecated in NSQ too, no effect there either; one WARNING line naming the replacement.
* ``Differs(what, note)``: used, but not quite as NSQ uses it; ``what`` says how, and ``note`` is an INFO line
  at every start when the difference is one an operator must know about (nothing kept across a restart).

``Refused`` may also apply to some values only (``applies``), e.g. a unix socket path for ``--tcp-address``.

The same declaration extends the option's ``-h`` text (``Spec.help``), so help, warnings and refusals cannot
disagree. ``check_support(opts)`` runs once in the entry point, after parsing and before anything is created.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from nsqpy.log import Logger


def _never(value) -> bool:
    return False


def _always(value) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class Refused:
    """A security option nsqpy does not implement yet: nsqd refuses to start when it is set (or, with
    ``applies``, when it is set to a value it names)."""

    feature: str  # e.g. "TLS"; the refusal groups the flags of one feature into one line
    why: str = ""  # what serving anyway would do to clients
    applies: Callable[[object], bool] = _always  # the values refused (when they differ from the default)
    when: str = "when this is set"  # ... in the help text

    def help_suffix(self) -> str:
        return f"[nsqpy: not supported yet ({self.feature}); nsqd refuses to start {self.when}]"


@dataclasses.dataclass(frozen=True)
class Unused:
    """An option accepted for compatibility that has no effect yet."""

    what: str  # what nsqpy does instead, e.g. "no stats are pushed"
    note: str = ""  # INFO line when left at its default ("{value}" is replaced by the value)
    honoured: Callable[[object], bool] = _never  # values that ask for nothing nsqpy lacks

    def help_suffix(self) -> str:
        return f"[nsqpy: not used yet: {self.what}]"


@dataclasses.dataclass(frozen=True)
class Deprecated:
    """Deprecated in NSQ, where it has no effect either."""

    use: str  # the replacement, e.g. "--log-level"

    def help_suffix(self) -> str:
        return ""  # NSQ's own help already says "[deprecated] ... use ..."


@dataclasses.dataclass(frozen=True)
class Differs:
    """Used, but not as NSQ uses it: the help says how, and ``note`` (if any) is said at every start."""

    what: str
    note: str = ""

    def help_suffix(self) -> str:
        return f"[nsqpy: {self.what}]"


@dataclasses.dataclass
class SupportReport:
    """What start-up must say: refusals (FATAL, exit 1), warnings (WARNING) and notes (INFO), one line each."""

    refusals: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


def check_support(opts) -> SupportReport:
    """Compare every option of ``opts`` (an Options dataclass) with its default and its declared support."""
    defaults = type(opts)()
    report = SupportReport()
    refused: dict[Refused, list[str]] = {}
    for spec in opts.specs():
        support = spec.support
        if support is None:
            continue
        value = getattr(opts, spec.attr)
        if isinstance(support, Differs):
            if support.note:
                report.notes.append(support.note.replace("{value}", str(value)))
            continue
        if isinstance(support, Unused) and support.honoured(value):
            continue
        if value == getattr(defaults, spec.attr):
            if isinstance(support, Unused) and support.note:
                report.notes.append(support.note.replace("{value}", str(value)))
            continue
        flag = "--" + spec.name
        if isinstance(support, Refused):
            if support.applies(value):
                refused.setdefault(support, []).append(flag if support.applies is _always else f"{flag}={value}")
        elif isinstance(support, Deprecated):
            report.warnings.append(f"flag {flag} is deprecated and has no effect (as in NSQ); use {support.use}")
        else:
            report.warnings.append(f"flag {flag} is accepted for compatibility but not used yet: {support.what}")
    for support, flags in refused.items():
        names = ", ".join(flags)
        if support.applies is _always:
            names = ("flag " if len(flags) == 1 else "flags ") + names
        verb = "is" if len(flags) == 1 else "are"
        rather = f" rather than {support.why}" if support.why else ""
        report.refusals.append(f"{names} {verb} not supported yet: nsqpy has no {support.feature} yet, "
                               f"so nsqd refuses to start{rather}")
    return report


def daemon_options(options_cls, argv, name: str, version: Callable[[], str]):
    """A daemon command's first steps, as Go's: parse its flags (exit 2 on a bad one), ``--version`` prints and
    returns 0, refused flags are FATAL lines and return 1. -> (opts, log, support report), or the exit code."""
    opts = options_cls.parse_or_exit(argv, name)
    if opts.version:
        print(version())
        return 0
    log = Logger(opts.log_prefix, opts.log_level.name.lower())
    support = check_support(opts)
    for line in support.refusals:
        log.fatal(line)
    if support.refusals:
        return 1
    return opts, log, support
