"""Failing well: what a half-done write or a damaged file leaves, and what the error says."""

from __future__ import annotations

import pytest

import sparkjet


def test_publish_all_with_an_unpicklable_item_publishes_nothing_and_names_it(
    client: sparkjet.Client,
) -> None:
    stream = client.get_stream("events", partitions=4)
    stream.publish_all(range(3))
    for attempt in range(16):  # the first partition is chosen at random: every place
        items: list[object] = list(range(16))
        items[9] = lambda: attempt  # a local function: pickle cannot
        with pytest.raises(TypeError, match=r"stream 'events': nothing was published: item 9 "
                           r"\(of type builtins.function\) cannot be pickled"):
            stream.publish_all(items)
        assert stream.size() == 3
    by_key = client.get_stream("keyed", partitions=2)
    with pytest.raises(TypeError, match="item 1 "):
        by_key._log.publish_all([1, lambda: 0, 3], partition_of=lambda x: 0)  # type: ignore[attr-defined]
    assert by_key.size() == 0
