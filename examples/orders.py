"""A streaming job reading files: spend per customer, summed exactly once, kept in a map.

Terminal 1 runs the job in the foreground (docs/walkthrough.md tells the whole story):

    sparkjet submit -n orders -g exactly_once --snapshot-interval 1000 examples/orders.py

Terminal 2 drops files of orders (JSON lines) into ``inbox/`` and reads the sums:

    mkdir -p inbox && cp examples/orders.jsonl inbox/orders-1.jsonl
    sparkjet get map spend

Every file that lands in ``inbox/`` is read once, across kills and resumes.
"""

from __future__ import annotations

from sparkjet.aggregate import summing
from sparkjet.pipeline import FileSource, Pipeline

pipeline = Pipeline.create()
(pipeline.read_from(FileSource("inbox", settle_seconds=0.5))  # JSON lines landing in inbox/
 .group_by(lambda order: order["customer"])
 .aggregate(summing(lambda order: order["amount"])).set_name("spend-per-customer")
 .write_to(Pipeline.to_map("spend")))                        # (customer, spend so far)
