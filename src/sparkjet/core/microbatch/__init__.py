"""A streaming job's micro-batches on the driver.

- :mod:`.loop`: the loop: stop? → plan → run → commit, batch after batch;
- :mod:`.commit`: the one owner of a micro-batch's commit sequence.
"""
