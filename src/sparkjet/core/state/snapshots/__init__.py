"""Snapshots: named, checksummed, optionally signed sets of files in a snapshot backend.

An exported snapshot is the state of a job's stateful stages at one committed
batch plus its sources' offsets (DESIGN.md, "Snapshots"). This package owns
how such a snapshot is laid out in a snapshot backend, written, found, read
and trusted; what goes into it is the engine's business. Layout::

    <name>/                      the snapshot's name, percent-encoded
      <attempt>/                 one export: <start ms, 15 digits>-<16 hex digits>
        <data files>             any relative paths the manifest names
        MANIFEST.json            written last, with a create-only write

**Replace by name, on storage without rename.** Each export writes into a
folder of its own (an *attempt*) and publishes it by creating its
``MANIFEST.json`` last. A name's snapshot is its newest complete attempt,
newest by attempt id, whose leading start time is made to exceed every
attempt already under the name (so one writer's next export always wins,
whatever its clock). Only after its own manifest exists does an export
delete the older complete attempts, manifest first, then their files; an
export that finds a newer complete attempt beside its own removes itself. So
at every moment a name has its old or its new snapshot, whole: a failed or
killed export leaves an attempt folder without a manifest, which no reader
looks at and :meth:`SnapshotStore.gc` removes once older than its age.

**Trust.** The manifest records each file's size and sha256 and its own
sha256; every read checks them, so corruption is an error naming the file,
never a partial restore. With a signing key the manifest also carries an
HMAC-SHA256 of its canonical form (sorted keys, no spaces, UTF-8): a store
with a key refuses unsigned manifests and wrong signatures, and a store
without one refuses signed manifests (configure the key to read them).

The modules, one concern each:

- :mod:`.names`: snapshot folders, attempt ids, data-file paths;
- :mod:`.manifest`: what an export hands over, the manifest's codec and signing;
- :mod:`.format`: the data inside: state files, state signatures, the
  pipeline fingerprint;
- :mod:`.reader`: :class:`Snapshot`, every read checked against the manifest;
- :mod:`.storage`: :class:`SnapshotStore`: attempts, replace by name, list,
  delete, copy, gc;
- :mod:`.migrate`: a new snapshot from an old one, its stages renamed,
  dropped or rewritten key by key (``migrate-snapshot``);
- :mod:`.upgrade`: Jet's upgrade rules: what a pipeline may start from a
  snapshot, read from its manifest (``check_upgrade``);
- :mod:`.backends`: which backend ``[snapshots]`` means.
"""

from sparkjet.core.state.snapshots.backends import (
    STORE_SUBFOLDER,
    backend_settings,
    kind_for_url,
    make_backend,
    snapshot_store,
)
from sparkjet.core.state.snapshots.manifest import (
    FORMAT,
    FORMAT_VERSION,
    FileEntry,
    Manifest,
    ManifestFields,
    StageFields,
    StageManifest,
    canonical,
)
from sparkjet.core.state.snapshots.names import MANIFEST, snapshot_folder, snapshot_name
from sparkjet.core.state.snapshots.reader import Snapshot
from sparkjet.core.state.snapshots.storage import SnapshotStore

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST",
    "STORE_SUBFOLDER",
    "FileEntry",
    "Manifest",
    "ManifestFields",
    "Snapshot",
    "SnapshotStore",
    "StageFields",
    "StageManifest",
    "backend_settings",
    "canonical",
    "kind_for_url",
    "make_backend",
    "snapshot_folder",
    "snapshot_name",
    "snapshot_store",
]
