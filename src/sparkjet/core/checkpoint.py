"""TEMPORARY stand-in until the data-plane branch lands core/checkpoint.py (merge takes theirs)."""

from sparkjet.core.runtime.stream import StatePaths
from sparkjet.core.streaming import Checkpoint

__all__ = ["Checkpoint", "StatePaths"]
