"""The source conformance kit (sparkjet.testing.SourceConformance), run for each built-in source.

- the store's stream source: every check but the cap (it reads up to the end
  offsets) and added partitions (a stream's are fixed when it is created);
- the list and map sources are bounded (batch) sources: a batch job reads
  every item once, and planning and reading twice give the same items; the
  offset and micro-batch checks are declared not to apply;
- the file source on a local folder and on the moto S3 server: every check
  but added partitions and trimming (a folder has neither); its offsets name
  files and byte positions, so it declares them opaque
  (``offsets_count_items = False``) and the lag check is skipped. Its
  restart and driver-kill checks are the ones that caught the dropped file
  tail (a restarted job closed a half-read file at the offset it had reached);
- the Kafka source against the real Tansu broker (tests/kafka_broker.py): no
  cap, and no trim (deleting records on the test broker is not tried: the
  harness declares it cannot); partitions added while the
  job runs are staged in the metadata only, as in tests/test_kafka.py, since
  Tansu cannot add partitions to a topic;
- a third party's source with opaque offsets (tests/kit_sources.py: lines
  appended to files in a folder, offsets byte positions per file, as in
  docs/plugins.md): every check but the cap and trimming; its lag check is
  skipped by its declaration, and its sizes and restores pass as they are.
"""

from __future__ import annotations

import json
import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from pyspark import cloudpickle as pyspark_cloudpickle

from sparkjet.contrib import files as files_plugin
from sparkjet.contrib import kafka as kafka_plugin
from sparkjet.contrib.files import FileSource
from sparkjet.contrib.kafka import KafkaSource
from sparkjet.core.client import Client
from sparkjet.plugin import JobContext, Source
from sparkjet.plugins.lists import ListSource
from sparkjet.plugins.maps import MapSource
from sparkjet.plugins.streams import StreamSource
from sparkjet.testing import SourceConformance, SourceHarness, StoreLocation
from tests import kafka_broker, kit_sources
from tests.kit_sources import FolderLinesHarness

# Spark's workers cannot import the test modules: ship their classes by value.
pyspark_cloudpickle.register_pickle_by_value(sys.modules[__name__])
pyspark_cloudpickle.register_pickle_by_value(kit_sources)


def _register(client: Client, module: Any, name: str) -> None:
    """A contrib plugin on ``client``: by its entry point once installed, else at runtime."""
    if name not in {info.name for info in client.list_plugins()}:
        client.register_plugin(module, name)


# --- the store's stream -------------------------------------------------------------------


class StreamHarness(SourceHarness):
    """A stream of two partitions in the test's store; trimmed as retention trims it."""

    can_trim = True
    why_not = {"partitions": "a stream's partitions are fixed when it is created",
               "cap": "the stream source reads up to the end offsets"}

    def __init__(self) -> None:
        self.name = f"events-{uuid.uuid4().hex[:8]}"

    def new_source(self, *, capped: bool = True) -> Source:
        return StreamSource(self.name, partitions=2)

    def add(self, client: Client, items: list[dict[str, Any]]) -> None:
        client.get_stream(self.name, partitions=2).publish_all(items)

    def trim(self, client: Client) -> None:
        # Every chunk but each partition's newest (the last add's): what retention does.
        log = client.store.stream_log(self.name)
        for partition, end in enumerate(log.end_offsets()):
            log.trim(partition, end)


class TestStreamSource(SourceConformance):
    @pytest.fixture
    def source_harness(self) -> SourceHarness:
        return StreamHarness()


# --- lists and maps (bounded) ---------------------------------------------------------------


class ListHarness(SourceHarness):
    streaming = False
    why_not = {"streaming": "the list source reads the list as it is when a batch job starts"}

    def __init__(self) -> None:
        self.name = f"items-{uuid.uuid4().hex[:8]}"

    def new_source(self, *, capped: bool = True) -> Source:
        return ListSource(self.name)

    def add(self, client: Client, items: list[dict[str, Any]]) -> None:
        client.get_list(self.name).add_all(items)


class MapHarness(SourceHarness):
    streaming = False
    why_not = {"streaming": "the map source reads the map as it is when a batch job starts"}

    def __init__(self) -> None:
        self.name = f"entries-{uuid.uuid4().hex[:8]}"

    def new_source(self, *, capped: bool = True) -> Source:
        return MapSource(self.name)

    def add(self, client: Client, items: list[dict[str, Any]]) -> None:
        client.get_map(self.name).put_all({f"seq-{item['seq']}": item for item in items})

    def decode(self, item: Any) -> dict[str, Any]:
        key, value = item
        assert key == f"seq-{value['seq']}", f"entry {item!r} read under another key"
        return dict(value)


class TestListSource(SourceConformance):
    @pytest.fixture
    def source_harness(self) -> SourceHarness:
        return ListHarness()


class TestMapSource(SourceConformance):
    @pytest.fixture
    def source_harness(self) -> SourceHarness:
        return MapHarness()


# --- files ------------------------------------------------------------------------------------

#: The capped file source reads at most this many bytes per micro-batch...
FILE_BATCH_BYTES = 200
#: ...and a kit item is at least this long as a JSON line, so a batch holds at most
#: FILE_BATCH_BYTES // 44 + 1 lines (the +1: a line starting in the range ends past it).
KIT_LINE_BYTES = len(json.dumps({"seq": 0, "key": "k0", "kit": "01234567"})) + 1


class FileHarness(SourceHarness):
    """JSON-lines files in a folder, one per add, each read over several micro-batches.

    ``settle_seconds`` is above zero, as it is by default: a file is read once
    its size has not changed for that long.
    """

    max_items_per_batch = FILE_BATCH_BYTES // KIT_LINE_BYTES + 1
    why_not = {"partitions": "a folder has no partitions",
               "trim": "a folder has no retention: a file removed before it was listed "
                       "was never there for the source"}

    def __init__(self, url: str, options: dict[str, Any] | None = None) -> None:
        self.url = url
        self.options = dict(options or {})
        self.files = 0

    def prepare(self, client: Client) -> None:
        _register(client, files_plugin, "files")

    def new_source(self, *, capped: bool = True) -> Source:
        return FileSource(self.url, format="jsonl", storage_options=self.options,
                          max_bytes_per_batch=FILE_BATCH_BYTES if capped else None,
                          settle_seconds=0.2, poll_seconds=0.05, name="conformance-files")

    def add(self, client: Client, items: list[dict[str, Any]]) -> None:
        fs, root = fsspec.core.url_to_fs(self.url, **self.options)
        data = b"".join(json.dumps(item).encode() + b"\n" for item in items)
        fs.makedirs(root, exist_ok=True)
        # Written whole under a hidden name, then moved into place (or one PUT on S3).
        final = f"{root}/part-{self.files:05d}.jsonl"
        protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
        if "file" in protocols:
            temp = f"{root}/.part-{self.files:05d}.tmp"
            fs.pipe(temp, data)
            fs.mv(temp, final)
        else:
            fs.pipe(final, data)
        self.files += 1


class TestFileSourceLocal(SourceConformance):
    @pytest.fixture
    def source_harness(self, tmp_path: Path) -> SourceHarness:
        return FileHarness(str(tmp_path / "inbox"))


@pytest.mark.storage
class TestFileSourceS3(SourceConformance):
    @pytest.fixture
    def source_harness(self, s3_location: StoreLocation) -> SourceHarness:
        where = s3_location.fresh()
        return FileHarness(f"{where.url}/inbox", where.options)


# --- a third party's source with opaque offsets ----------------------------------------------


class TestFolderLinesSource(SourceConformance):
    @pytest.fixture
    def source_harness(self, tmp_path: Path) -> SourceHarness:
        return FolderLinesHarness(str(tmp_path / "inbox"))


# --- Kafka ------------------------------------------------------------------------------------


class GrowingTopicSource(KafkaSource):
    """Sees only the topic's first partitions, as many as ``visible_file`` says.

    Tansu cannot add partitions to a topic (no CreatePartitions): the topic
    has three and the source is shown two, then three. Only the metadata is
    staged; offsets, planning and reading are the real ones.
    """

    visible_file: str

    def _partition_ids(self, context: JobContext) -> list[int]:
        ids = super()._partition_ids(context)
        with open(self.visible_file) as fh:
            return ids[: int(fh.read())]


class KafkaHarness(SourceHarness):
    """A topic of three partitions on the test broker, of which the source sees two at first."""

    can_add_partitions = True
    why_not = {"cap": "the Kafka source reads up to the end offsets",
               "trim": "this harness does not delete records on the test broker (Tansu)"}

    def __init__(self, bootstrap: str, folder: Path) -> None:
        self.bootstrap = bootstrap
        self.topic = f"t-{uuid.uuid4().hex[:10]}"
        kafka_broker.create_topic(bootstrap, self.topic, 3)
        self.visible_file = str(folder / f"{self.topic}.visible")
        self.visible = 2
        Path(self.visible_file).write_text("2")

    def prepare(self, client: Client) -> None:
        _register(client, kafka_plugin, "kafka")

    def new_source(self, *, capped: bool = True) -> Source:
        source = GrowingTopicSource(self.topic, self.bootstrap, metadata_refresh=0.2)
        source.visible_file = self.visible_file
        return source

    def add(self, client: Client, items: list[dict[str, Any]]) -> None:
        kafka_broker.produce(self.bootstrap, self.topic, [
            (i % self.visible, None, json.dumps(item).encode()) for i, item in enumerate(items)])

    def add_partitions(self, client: Client) -> None:
        self.visible = 3
        Path(self.visible_file).write_text("3")


@pytest.fixture(scope="module")
def bootstrap() -> Iterator[str]:
    with kafka_broker.kafka_broker() as servers:
        yield servers


class TestKafkaSource(SourceConformance):
    @pytest.fixture
    def source_harness(self, bootstrap: str, tmp_path: Path) -> SourceHarness:
        return KafkaHarness(bootstrap, tmp_path)


def test_a_harness_still_declaring_lag_countable_is_told_where_the_declaration_went(
    client: Client, tmp_path: Path
) -> None:
    """The harness flag is gone: what offsets mean is the source's ``offsets_count_items``."""
    from sparkjet.testing.source_harness import _Run

    class OldHarness(FolderLinesHarness):
        lag_countable = False

    with pytest.warns(DeprecationWarning, match=r"OldHarness.lag_countable is ignored: .*"
                                                r"offsets_count_items = False on the Source"
                      ) as told:
        _Run(client, OldHarness(str(tmp_path / "inbox")))
    assert len([w for w in told if "lag_countable" in str(w.message)]) == 1, "warned once"
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("always")
        _Run(client, FolderLinesHarness(str(tmp_path / "inbox2")))
    assert [str(w.message) for w in quiet if "lag_countable" in str(w.message)] == [], (
        "a harness that does not declare lag_countable is not warned"
    )
