"""Real nsqpy brokers without the HTTP API (tests/no_http_brokers.py)."""
from tests.no_http_brokers import (_factory, _module_factory, module_nsqd_factory, nsqd_factory,  # noqa: F401
                                   shared_nsqd)
