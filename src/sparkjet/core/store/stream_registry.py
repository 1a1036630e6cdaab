"""Registered batch chunks: which of a micro-batch's chunks in a stream partition counts.

Two drivers may append one batch's chunk to a partition (one of them fenced
off but not yet aware): both looked and found none, both appended. The
batch's chunk that counts is the one *registered*: after appending, the
writer creates ``registry/p<partition>/<token>`` holding the chunk's offset,
create-only, so the first registration stands. Readers skip a batch chunk
at any other offset. A chunk not yet registered (its writer is between the
two writes, or died there) is waited for, and registered by the reader
itself after :data:`PENDING_WAIT_SECONDS`: whoever registers first decides,
and every reader sees the same one.
"""

from __future__ import annotations

import time

from sparkjet.core.errors import StoreError
from sparkjet.core.store.stream_chunks import StreamFiles

#: How long a reader waits for a batch chunk's registration before making it.
PENDING_WAIT_SECONDS = 30.0


class StreamRegistry(StreamFiles):
    """The registrations of a stream's batch chunks, read and made."""

    def registered(self, partition: int, token: str) -> int | None:
        """The offset of ``token``'s registered chunk in ``partition``, or None."""
        known = self._registry.get((partition, token))
        if known is not None:
            return known
        try:
            raw = self.store.read_bytes(self.paths.registration(partition, token))
        except FileNotFoundError:
            return None
        try:
            offset = int(raw)
        except ValueError as exc:
            raise StoreError(self.store.redact(
                f"stream {self.name!r}: registration "
                f"{self.paths.registration(partition, token)!r} is corrupt: {raw[:40]!r}"
            )) from exc
        self._registry[(partition, token)] = offset  # registrations never change
        return offset

    def register(self, partition: int, token: str, offset: int) -> int:
        """Register ``offset`` as ``token``'s chunk unless another is; the one that stands."""
        data = str(offset).encode()
        if self.store.create_exclusive(self.paths.registration(partition, token), data):
            self._registry[(partition, token)] = offset
            return offset
        standing = self.registered(partition, token)
        if standing is None:
            raise StoreError(self.store.redact(
                f"stream {self.name!r}: registration "
                f"{self.paths.registration(partition, token)!r} exists but cannot be read"))
        return standing

    def _counts(self, partition: int, token: str, start: int) -> bool:
        """Whether the batch chunk of ``token`` at ``start`` is the one that counts."""
        waited = 0.0
        nap = 0.002  # its writer registers right after appending: look again soon
        while (standing := self.registered(partition, token)) is None:
            if waited >= PENDING_WAIT_SECONDS:
                # Its writer died between appending and registering (a replay
                # would register the first chunk it finds, this one).
                standing = self.register(partition, token, start)
                break
            time.sleep(nap)
            waited += nap
            nap = min(nap * 2, 0.05)
        return standing == start
