"""nsqd whose periodic paths to nsqlookupd are an hour apart: the workers' stats publication period
(``nsqpy.workers.domain.stats_rows.PERIOD``) and the lookupd link's poll (``nsqpy.workers.processes.lookupd_link.POLL``). What reaches lookupd
within seconds then came through the wake-up a topic or channel change sends (tests/lookupd/test_registration_lag.py).

    python -m tests.lookupd.slow_ticks <nsqd flags>
"""
import sys

from nsqpy.workers.processes import lookupd_link
from nsqpy.workers.processes import nsqd
from nsqpy.workers.domain import stats_rows as stats

HOUR = 3600.0

if __name__ == "__main__":
    stats.PERIOD = HOUR
    lookupd_link.POLL = HOUR
    sys.exit(nsqd.main(sys.argv[1:]))
