"""NSQ's domain inside a worker: topics, channels, client sessions, the worker's topic table, deferred messages,
end-to-end latency, stats rows."""
