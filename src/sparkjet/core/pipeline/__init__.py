"""The pipeline model: what a job computes, independent of where it runs.

- :mod:`.planner`: a ``Pipeline`` checked and turned into a ``Plan``;
- :mod:`.graph`: the stages and their specs, and the builder users call;
- :mod:`.dead_letters`: the items a stage failed on, set aside;
- :mod:`.window_fold`: windowed aggregation, folded per key as event time passes;
- :mod:`.keyed`: keyed-operation semantics, one for batch and streaming;
- :mod:`.fusion`: per-partition kernels (fused stateless passes, map-side folds);
- :mod:`.aggregation`: the aggregate operations;
- :mod:`.event_time`: the watermark and each window's clock;
- :mod:`.timers`: keys indexed by when they are next due;
- :mod:`.windows`: window definitions and results, as users see them.

The public face is :mod:`sparkjet.pipeline` and :mod:`sparkjet.aggregate`.
"""
