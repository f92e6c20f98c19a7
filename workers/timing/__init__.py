"""Timing: in-flight deadlines through the scanner process, and timer batches."""
