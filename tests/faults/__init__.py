"""Helpers of the fault tests (tests/test_stream_faults.py): driver scripts and plugins."""
