"""The state wing: a streaming job's checkpoint and keyed state, and how state moves.

Top to bottom (import-linter orders them, see ``pyproject.toml``):

- :mod:`.export`: a committed batch of a checkpoint written out as a snapshot;
- :mod:`.restore`: a new job's empty checkpoint seeded from a snapshot;
- :mod:`.snapshots`: snapshots themselves: their format, manifests, names,
  storage backends, reading, migrations and the upgrade rules;
- :mod:`.compaction`: a state task's changelog chain folded off the critical path;
- :mod:`.warming`: the driver's copy of the keyed state, warmed in the background;
- :mod:`.checkpoint`: the checkpoint's folder and records (plans, commits, pins, meta);
- :mod:`.cache`: keyed state kept loaded in a worker process between micro-batches;
- :mod:`.files`: the keyed state's files: their formats, reading and writing;
- :mod:`.versions`: their names: ranges, versions, the order of a chain;
- :mod:`.keygroups`: which key group a key belongs to and which groups a task owns.
"""
