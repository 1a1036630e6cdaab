"""A streaming job for the CLI: clicks per user, counted exactly once, kept in a map.

Terminal 1 runs the job in the foreground (until it is suspended, cancelled or fails):

    sparkjet submit -n clicks -g exactly_once --snapshot-interval 1000 examples/clicks.py

Terminal 2 publishes clicks (JSON lines) to the stream and reads the counts:

    sparkjet publish --partitions 2 clicks examples/clicks.jsonl
    python examples/clicks.py

`sparkjet submit` uses the module-level `pipeline`; run as a script, the file
prints the map `clicks-per-user` instead (the `__main__` block below, which
`sparkjet submit` does not run).
"""

from __future__ import annotations

import sparkjet
from sparkjet.aggregate import counting
from sparkjet.pipeline import Pipeline, StreamSource

pipeline = Pipeline.create()
(pipeline.read_from(StreamSource("clicks", partitions=2))  # created with 2 partitions if missing
 .group_by(lambda click: click["user"]).aggregate(counting()).set_name("count-per-user")
 .write_to(Pipeline.to_map("clicks-per-user")))             # (user, clicks so far), kept current


def main() -> None:
    counts = sparkjet.connect().get_map("clicks-per-user")
    for user, clicks in sorted(counts.entry_set()):
        print(f"{user}: {clicks}")


if __name__ == "__main__":
    main()
