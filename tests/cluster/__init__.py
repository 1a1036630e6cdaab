"""Helpers of the standalone-cluster fault test (``tests/test_stream_cluster.py``)."""
