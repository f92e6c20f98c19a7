"""Typed options for nsqd, nsqlookupd and nsqadmin, read like NSQ v1.3.0 reads them.

Entry points call ``NsqdOptions.parse_or_exit(argv)`` (or the module-level
``parse_or_exit(NsqdOptions, argv, prog)``) once and pass the object down.
Modules: duration (Go duration text), kinds (value parsing per option type),
flags (Go flag syntax and -h), config_file (TOML), options (the declarative
base), common/nsqd/nsqlookupd/nsqadmin (the options themselves).
"""
from .common import LogLevel, TLSRequired, TLSVersion, default_node_id
from .duration import DurationError, format_duration, parse_duration
from .flags import HelpRequested, OptionsError
from .nsqadmin import NsqadminOptions
from .nsqd import NsqdOptions
from .nsqlookupd import NsqlookupdOptions
from .options import Spec, parse, parse_or_exit

__all__ = [
    "DurationError", "HelpRequested", "LogLevel", "NsqadminOptions", "NsqdOptions",
    "NsqlookupdOptions", "OptionsError", "Spec", "TLSRequired", "TLSVersion", "default_node_id",
    "format_duration", "parse", "parse_duration", "parse_or_exit",
]
