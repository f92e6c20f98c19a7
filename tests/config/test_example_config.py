"""deploy/config/*.toml are what ``python -m nsqpy.config.example`` generates from the options' declarations, and
each, read as the daemon's --config, gives exactly the defaults."""
import dataclasses
import pathlib

import pytest

from nsqpy.config import NsqadminOptions, NsqdOptions, NsqlookupdOptions
from nsqpy.config.example import example_config

DEPLOY = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "config"


@pytest.mark.parametrize("cls", [NsqdOptions, NsqlookupdOptions, NsqadminOptions], ids=lambda c: c.PROG)
def test_example_config_is_generated_and_gives_the_defaults(cls):
    path = DEPLOY / f"{cls.PROG}.toml"
    assert path.read_text() == example_config(cls), f"regenerate: python -m nsqpy.config.example {cls.PROG} > {path}"
    listed = {line.split(" = ")[0].lstrip("# ") for line in path.read_text().splitlines() if " = " in line}
    assert listed == {s.cfg for s in cls.specs() if s.from_file and not s.hidden}
    required = ["--lookupd-http-address=127.0.0.1:4161"] if cls is NsqadminOptions else []  # (one is required)
    read, defaults = cls.parse([f"--config={path}", *required]), cls()
    for field in dataclasses.fields(cls):
        if field.name not in ("config", "lookupd_http_address"):
            assert getattr(read, field.name) == getattr(defaults, field.name), field.name
