"""A pipeline for the CLI: `sparkjet submit examples/word_count.py TEXT...`.

The CLI calls `pipeline(args)` with the command line's ARGS and submits it.
"""

from __future__ import annotations

from sparkjet.aggregate import counting
from sparkjet.pipeline import Pipeline

DEFAULT_TEXT = ["to be or not to be", "that is the question"]


def pipeline(args: list[str]) -> Pipeline:
    lines = args or DEFAULT_TEXT
    p = Pipeline.create()
    (p.read_from(Pipeline.from_list("lines", lines))
     .flat_map(str.split)
     .group_by(lambda w: w.lower()).aggregate(counting()).set_name("count-words")
     .write_to(Pipeline.to_logger(lambda kv: f"{kv[0]}: {kv[1]}")))
    return p
