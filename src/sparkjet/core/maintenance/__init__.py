"""Keeping a store bounded: what no inline step removes.

- :mod:`.gc`: garbage collection of the store (``sparkjet gc``);
- :mod:`.retention`: stream retention (``sparkjet trim``), held back by live
  jobs' committed offsets and by snapshots.
"""
