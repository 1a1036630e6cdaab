"""The Spark Connect engine: the same plans on a server reached through Spark Connect.

- :mod:`.engine`: the :class:`~sparkjet.core.engine.boundary.Engine`;
- :mod:`.datasets`: a run's datasets as DataFrames of pickled chunks;
- :mod:`.arrow`: what runs on the server's Python workers (``mapInArrow``);
- :mod:`.reports`: task reports as rows that travel with the data;
- :mod:`.session`: the session, the server's checks, shipping sparkjet's code.
"""
