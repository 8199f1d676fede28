"""The operations playbook as data: cause and remedy ids shared by presets, incident causes,
findings and wizards. One place, so an id means the same thing everywhere."""

CAUSES = {
    "OOM-1": "Per-request temporaries too big (large batches, long inputs, binary payloads)",
    "OOM-2": "A replica accepts too many concurrent requests",
    "OOM-3": "Object store plus heap exceed node memory",
    "OOM-4": "Model loaded per replica plus unbounded caches",
    "OOM-5": "Allocator fragmentation: memory ratchets up between restarts",
    "OOM-6": "Kubernetes memory limit below what Ray believes it has",
    "OOM-7": "Rolling update or slow drain briefly doubles replicas",
    "LAT-1": "Cold start after a replica starts",
    "LAT-2": "Queue build-up: no backpressure, autoscaler too slow",
    "LAT-3": "Event loop or thread pool blocked",
    "LAT-4": "Serialization of large payloads",
    "LAT-5": "Object store spill or cross-node transfer",
    "LAT-6": "GC or memory-pressure pauses",
    "LAT-7": "Synchronous logging or metrics per request",
    "LAT-8": "Hot tenant or hot key on one replica",
}

REMEDIES = {
    "R1": "Cap per-replica concurrency at 1–2 (max_ongoing_requests)",
    "R2": "Queue-based autoscaling: target ≈ 1, min replicas ≥ 2, fast upscale, slow downscale",
    "R3": "Cap input size and requested tokens at the edge",
    "R4": "Batch by token (pixel, frame) sum, not request count",
    "R5": "Keep big payloads out of request bodies and the object store",
    "R6": "Warm up on replica start",
    "R7": "Bound every cache with size and TTL",
    "R8": "Recycle replicas on a schedule as a rolling restart",
    "R9": "Roll updates with headroom, one deployment at a time",
    "R10": "Bound the queue (max_queued_requests) so overload fails fast",
}

REMEDIES_FOR = {
    "OOM-1": ["R3", "R4", "R5"], "OOM-2": ["R1", "R2"], "OOM-3": ["R5"], "OOM-4": ["R7"], "OOM-5": ["R8", "R1"],
    "OOM-6": [], "OOM-7": ["R9"], "LAT-1": ["R6", "R2"], "LAT-2": ["R2", "R10"], "LAT-3": ["R1"], "LAT-4": ["R5"],
    "LAT-5": ["R5"], "LAT-6": ["R1", "R7", "R8"], "LAT-7": [], "LAT-8": [],
}


def cause(cause_id: str, reason: str, rank: int) -> dict:
    return {
        "id": cause_id,
        "title": CAUSES[cause_id],
        "reason": reason,
        "rank": rank,
        "remedies": [{"id": r, "title": REMEDIES[r]} for r in REMEDIES_FOR[cause_id]],
    }
