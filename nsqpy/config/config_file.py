"""The ``--config`` TOML file, read the way NSQ's apps read theirs.

NSQ decodes the file into a plain map and then looks up, for each option, its
config name: the flag name with ``-`` changed to ``_`` unless the option names
another (``id`` for --node-id, ``nsqlookupd_tcp_addresses`` for
--lookupd-tcp-address, ...).  Keys it does not know are ignored, so nsqpy ignores
them too (an nsqd config file may carry keys for a newer nsqd).  Because NSQ's
special names are easy to get wrong, nsqpy also accepts the plain
flag-with-underscores spelling (``node_id``); a file that sets both spellings of
one option is an error.  Values are coerced per option kind (see kinds.py); a
value of the wrong type is an error naming the key.
"""
from __future__ import annotations

import json
import tomllib

from .flags import OptionsError


def read_config_file(path: str, specs: list) -> dict:
    """Return {spec: value} for the options the file sets."""
    try:
        with open(path, "rb") as stream:
            table = tomllib.load(stream)
    except OSError as err:
        raise OptionsError("failed to load config file %s - %s" % (path, err.strerror or err)) from None
    except tomllib.TOMLDecodeError as err:
        raise OptionsError("failed to load config file %s - %s" % (path, err)) from None
    found = {}
    for spec in specs:
        if not spec.from_file:
            continue
        keys = [key for key in dict.fromkeys((spec.cfg, spec.attr)) if key in table]
        if len(keys) > 1:
            raise OptionsError("config file %s: keys %s and %s both set -%s" % (path, keys[0], keys[1], spec.name))
        if not keys:
            continue
        raw = table[keys[0]]
        try:
            found[spec] = spec.kind.from_file(raw)
        except ValueError as err:
            raise OptionsError(
                "config file %s: invalid value %s for key %s: %s" % (path, _show(raw), keys[0], err)
            ) from None
    return found


def _show(raw: object) -> str:
    """The offending TOML value, in TOML-like notation on one line."""
    try:
        return json.dumps(raw, ensure_ascii=False)
    except TypeError:
        return str(raw)  # dates and times
