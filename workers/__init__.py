"""The broker's processes and what they run, installed as ``nsqpy.workers`` (setup.cfg maps it from here).

Sub-packages, each with one job; NSQ's ``nsqd/`` file for the same thing in brackets:

- ``processes``: the programs the supervisor forks and their entry points: the ``nsqd`` command, supervisor,
  acceptor, worker, scanner, the HTTP child, the lookupd link, their event loop and the shared ``Plan`` (nsqd.go).
- ``domain``: topics, channels, client sessions, the topic table of a worker, deferred messages, end-to-end latency,
  the stats rows (topic.go, channel.go, client_v2.go, protocol_v2.go, stats.go).
- ``publishing``: PUB/MPUB/DPUB at the accepting worker and at the topic's owner, the records in the rings
  between them, and the rings themselves.
- ``control``: the control block (a few shared words per process) and the commands other processes send a topic's
  owner (the HTTP API's topic and channel actions, lookupd's rows).
- ``lane``: the compiled hot path: the socket pump, the forward lane, the owner's own path, bulk in-flight kernels,
  and the warm-up that loads them all before the first fork.
- ``storage``: what survives a stop or a crash: the clean-stop save and load, a replacement worker's restart, a
  whole-broker crash, log space, the sync policy, the topic journal, nsqd.dat, poison records, leftovers of dead
  instances (diskqueue files themselves: ``nsqpy.store``).
- ``connections``: a connection's arrival and moves between workers, TLS and compression, AUTH (tcp.go, the
  transport half of client_v2.go).
- ``timing``: in-flight deadlines and the timer batches that keep the scanner's heap small.
"""
