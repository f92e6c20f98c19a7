"""`import nsqpy.client` must stay light: no numba, no numpy, no broker module (workers, ipc)."""

import subprocess
import sys

from nsqpy.protocol import client as wire
from nsqpy.protocol import v2_parser


def test_client_import_loads_no_numba_and_no_broker_module():
    code = ("import sys, nsqpy.client, nsqpy.tools; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'numba', 'numpy', 'workers', 'ipc', 'http_api'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_client_codec_magic_matches_the_parser():
    assert wire.MAGIC_V2 == v2_parser.MAGIC_V2 == wire.magic()
