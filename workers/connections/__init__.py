"""Connections: arrival from the acceptor and moves between workers, TLS and compression, AUTH."""
