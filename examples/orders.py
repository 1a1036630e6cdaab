"""A streaming job reading files: spend per customer, summed exactly once, kept in a map.

docs/walkthrough.md tells the whole story. Terminal 1 runs the job in the
foreground:

    sparkjet submit -n orders -g exactly_once --snapshot-interval 1000 examples/orders.py

Terminal 2 drops files of orders (JSON lines) into ``inbox/`` and reads the sums,
and the orders the job could not use:

    mkdir -p inbox && cp examples/orders.jsonl inbox/orders-1.jsonl
    sparkjet get map spend
    sparkjet get stream orders.dead-letters

Every file that lands in ``inbox/`` is read once, across kills and resumes; an
order whose amount is not a positive whole number goes to the dead letters.
"""

from __future__ import annotations

from typing import Any

from sparkjet.aggregate import summing
from sparkjet.contrib.files import FileSource
from sparkjet.pipeline import Pipeline


def checked(order: dict[str, Any]) -> dict[str, Any]:
    """The order with a whole, positive amount; anything else raises (a dead letter)."""
    amount = int(order["amount"])
    if amount <= 0:
        raise ValueError(f"amount {amount} is not positive")
    return {**order, "amount": amount}


pipeline = Pipeline.create()
(pipeline.read_from(FileSource("inbox", settle_seconds=0.5))  # JSON lines landing in inbox/
 .map(checked).set_name("check").on_error("dead-letter")      # bad orders set aside
 .group_by(lambda order: order["customer"])
 .aggregate(summing(lambda order: order["amount"])).set_name("spend-per-customer")
 .write_to(Pipeline.to_map("spend")))                         # (customer, spend so far)
