"""Weight sync from the actor to rollout (and scorers): HF tensors in flat buckets behind one interface.

- :mod:`.buckets`: pack/unpack with a manifest (names, dtypes, shapes, offsets), bit-exact;
- :mod:`.source`: the actor's parameters per tensor (TP-gathered, HF-converted, cast to the wire dtype);
- transports: :mod:`.objectstore` (Ray objects, the default), :mod:`.broadcast` (a collective group:
  NCCL on GPU, gloo on CPU, over an authenticated store; its manifests as capped JSON, :mod:`.manifest_wire`),
  :mod:`.disk` (safetensors per version on shared storage);
- :mod:`.transport`: the registry of ``spec.actor.weightSync.transport``, the one path production takes: the
  actor publishes through it (:mod:`.actor_side`), every receiver takes a handle through it (``receive``);
- :mod:`.outcome`: what a sync answers across Ray (``Delivered``, ``Sent``, ``SyncFailed``), typed records.
"""
