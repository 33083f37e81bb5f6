"""One table of hostile broadcast manifests: each row changes one thing of a real manifest's JSON (or is
not JSON at all), as a peer that is not the job's source, or a source of another protocol version, could.

- ``mutate(obj)``: the change to the JSON object of a real two-tensor bucket manifest (or raw bytes);
- ``field``: the field the refusal must name; ``message``: a fragment of the rule.

Used by ``tests/trainer/test_broadcast_manifest.py`` (``weight_sync.manifest_wire.decode``).
"""

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asyncrl.trainer.weight_sync.buckets import BucketManifest, TensorEntry


@dataclass(frozen=True)
class HostileManifest:
    id: str
    mutate: Callable[[dict[str, Any]], Any]  # returns the new object, or bytes to send as they are
    field: str
    message: str


# The real manifest the rows start from: w [40, 30] float32 (4800 B) at 0, b [7] bfloat16 (14 B) at 4800.
BASE = BucketManifest(version=3, index=1, nbytes=4864,
                      entries=(TensorEntry("w", "float32", (40, 30), 0, 4800), TensorEntry("b", "bfloat16", (7,), 4800, 14)))


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], Any]:
    def mutate(obj: dict[str, Any]) -> Any:
        target: Any = obj
        for p in path[:-1]:
            target = target[p]
        target[path[-1]] = value
        return obj

    return mutate


def _drop(key: str) -> Callable[[dict[str, Any]], Any]:
    def mutate(obj: dict[str, Any]) -> Any:
        del obj[key]
        return obj

    return mutate


HOSTILE_MANIFESTS: list[HostileManifest] = [
    # the old wire format: a pickle is refused as "not JSON", never unpickled
    HostileManifest("pickle", lambda obj: pickle.dumps(BASE), "the manifest", "is not JSON"),
    HostileManifest("json-list", lambda obj: [obj], "the manifest", "must be an object"),
    HostileManifest("missing-entries", _drop("entries"), "the manifest", "must be an object with"),
    HostileManifest("extra-field", _set(("code",), "os.system"), "the manifest", "must be an object with"),
    HostileManifest("version-negative", _set(("version",), -1), "version", "integer >= 0"),
    HostileManifest("index-bool", _set(("index",), True), "index", "integer >= 0"),
    HostileManifest("nbytes-float", _set(("nbytes",), 4864.0), "nbytes", "integer >= 0"),
    # a size the receiver would allocate: 1 TiB, over the 8 GiB cap, refused before torch.empty
    HostileManifest("nbytes-1tib", _set(("nbytes",), 1 << 40), "nbytes 1099511627776", "over this receiver's cap"),
    HostileManifest("entries-object", _set(("entries",), {"w": 1}), "entries", "must be a list"),
    HostileManifest("entry-short", _set(("entries", 0), ["w", "float32", [40, 30], 0]), "entries[0]",
                    "[name, dtype, shape, offset, nbytes]"),
    HostileManifest("name-empty", _set(("entries", 0, 0), ""), "entries[0].name", "1-1024 characters"),
    HostileManifest("dtype-object", _set(("entries", 0, 1), "object"), "entries[0].dtype", "valid: ['bfloat16'"),
    HostileManifest("shape-negative", _set(("entries", 0, 2), [40, -30]), "entries[0].shape", "integers >= 0"),
    HostileManifest("shape-9-dims", _set(("entries", 0, 2), [1] * 9), "entries[0].shape", "at most 8"),
    HostileManifest("offset-bool", _set(("entries", 1, 3), False), "offset", "integer >= 0"),
    # 40 x 30 float32 = 4800 bytes, not 4000: a view would read past the tensor
    HostileManifest("nbytes-not-shape", _set(("entries", 0, 4), 4000), "entries[0] (w)", "nbytes 4000 != float32"),
    HostileManifest("offset-unaligned", _set(("entries", 1, 3), 4801), "entries[1] (b)", "not a multiple of 64"),
    # b at 4800 + 14 > a 4810-byte bucket: a view past the end of the buffer
    HostileManifest("past-the-bucket", _set(("nbytes",), 4810), "entries[1]", "inside the bucket's 4810 bytes"),
    HostileManifest("overlap", _set(("entries", 1, 3), 64), "entries[1]", "the previous ends at 4800"),
    HostileManifest("name-twice", _set(("entries", 1), ["w", "bfloat16", [7], 4800, 14]), "entries[1].name",
                    "appears twice"),
]
