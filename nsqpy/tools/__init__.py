"""NSQ's utility apps on nsqpy's client, with NSQ's flags: to_nsq, nsq_tail, nsq_stat, nsq_to_file, nsq_to_http,
nsq_to_nsq (console scripts of the same names; `python -m nsqpy.tools.<name>` works too)."""
