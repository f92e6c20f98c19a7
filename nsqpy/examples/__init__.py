"""Runnable examples of nsqpy's client (`python -m nsqpy.examples.<name> --help`)."""
