"""The driver's watcher of a source's topic: what it read, kept for reads in its process.

:class:`~sparkjet.contrib.kafka.source.KafkaSource` follows its topic on the
driver with a watcher consumer (how far each partition went, so a job wakes
when a record comes and knows a micro-batch's ends without a request). This
module drains the watcher's events (:func:`_take_watched`) and keeps the
records it read (:class:`_Followed`, one per driver source in
:data:`_FOLLOWED`), so the in-process engine's reads of the same ranges, in
the same process, need no consumer.
"""

from __future__ import annotations

import bisect
import threading
import weakref
from typing import Any

from sparkjet.contrib.kafka.clients import _confluent_kafka

#: Most records a driver's watcher keeps for the reads of its process.
_FOLLOWED_KEPT = 100_000


class _Span:
    """What a watcher read of one partition: every record from ``first`` to ``reached``."""

    def __init__(self, first: int) -> None:
        self.first = self.reached = first
        self.offsets: list[int] = []
        self.messages: list[Any] = []


class _Followed:
    """The records a driver's watcher read, kept for reads in the same process.

    The in-process engine reads a micro-batch's ranges on the driver, just
    after the watcher read the same records (that is how the batch's ends were
    known): a read takes them from here, with no consumer and no fetch to
    wait for (a partition reader fetches every ``fetch.wait.max.ms``, and
    five of them kept Tansu busy). A range not wholly here (read on an
    executor, before the watcher started, or after it dropped records over
    :data:`_FOLLOWED_KEPT`) is read by a partition reader as before.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: dict[int, _Span] = {}
        self._kept = 0

    def follow(self, partition: int, offset: int) -> None:
        """Keep ``partition``'s records from ``offset`` on (what the watcher reads next)."""
        with self._lock:
            old = self._spans.pop(partition, None)
            self._kept -= len(old.offsets) if old else 0
            self._spans[partition] = _Span(offset)

    def add(self, partition: int, message: Any, reached: int) -> None:
        """Note the watcher's next event of ``partition``: a record (or None: an EOF)."""
        with self._lock:
            span = self._spans.get(partition)
            if span is None:
                return
            if message is not None and reached > span.first:
                if self._kept >= _FOLLOWED_KEPT:  # keep none until the job catches up
                    self._drop_all()
                    return
                span.offsets.append(reached - 1)
                span.messages.append(message)
                self._kept += 1
            span.reached = max(span.reached, reached)

    def _drop_all(self) -> None:
        self._spans.clear()
        self._kept = 0

    def prune(self, partition: int, below: int, position: int) -> None:
        """Forget records below ``below``; follow anew from ``position`` if dropped."""
        with self._lock:
            span = self._spans.get(partition)
            if span is None:
                self._spans[partition] = _Span(position)
                return
            cut = bisect.bisect_left(span.offsets, below)
            del span.offsets[:cut], span.messages[:cut]
            self._kept -= cut
            span.first = max(span.first, below)

    def take(self, partition: int, start: int, end: int) -> list[Any] | None:
        """The records of ``[start, end)`` if every one of them is here, else None."""
        with self._lock:
            span = self._spans.get(partition)
            if span is None or not span.first <= start or end > span.reached:
                return None
            lo = bisect.bisect_left(span.offsets, start)
            hi = bisect.bisect_left(span.offsets, end)
            return span.messages[lo:hi]


#: Each driver source's kept records, by the source's token (its copies on the
#: in-process engine find them here); gone with the driver's source.
_FOLLOWED: weakref.WeakValueDictionary[str, _Followed] = weakref.WeakValueDictionary()


def _take_watched(
    watcher: Any, watched: dict[int, int], followed: _Followed | None, wait: float
) -> tuple[bool, bool]:
    """Note what ``watcher`` fetched; if nothing, block up to ``wait`` s for the next.

    Each partition's position goes into ``watched`` (how far it has seen
    records or the end), each record into ``followed``. Returns whether
    something came (False: nothing), and whether the watcher failed: an error
    of a partition (its offsets out of range, the topic gone) counts as
    something, so the source's ``latest_offsets`` sees (and names) what is
    wrong. Other errors (a broker unreachable for a while) librdkafka retries:
    the positions stand still, and the periodic ``ListOffsets`` fails the job
    if the brokers stay away.
    """
    ck = _confluent_kafka()
    failed = {ck.KafkaError._AUTO_OFFSET_RESET, ck.KafkaError.OFFSET_OUT_OF_RANGE,
              ck.KafkaError.UNKNOWN_TOPIC_OR_PART, ck.KafkaError._UNKNOWN_PARTITION,
              ck.KafkaError._UNKNOWN_TOPIC}
    came = False
    while True:
        messages = watcher.consume(num_messages=10_000, timeout=0)
        if not messages:
            if came or wait <= 0:
                return came, False
            message = watcher.poll(wait)
            if message is None:
                return False, False
            messages = [message]
        came = True
        for message in messages:
            error = message.error()
            if error is None:
                reached = message.offset() + 1
            elif error.code() == ck.KafkaError._PARTITION_EOF:
                reached = message.offset()
            elif error.code() in failed:
                return True, True
            else:
                continue
            p = message.partition()
            watched[p] = max(watched.get(p, 0), reached)
            if followed is not None:
                followed.add(p, message if error is None else None, reached)
        if len(messages) < 10_000:
            return True, False
