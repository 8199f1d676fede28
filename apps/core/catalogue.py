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
    "LAT-9": "LLM engine's KV cache full: sequences wait or are preempted",
    "LLM-1": "LLM engine stuck while its replica looks healthy",
}

REMEDIES = {
    "R1": "Cap per-replica concurrency at what memory holds (max_ongoing_requests)",
    "R2": "Queue-based autoscaling: target ≈ 1, min replicas ≥ 2, fast upscale, slow downscale",
    "R3": "Cap input size and requested tokens at the edge",
    "R4": "Batch by token (pixel, frame) sum, not request count",
    "R5": "Keep big payloads out of request bodies and the object store",
    "R6": "Warm up on replica start",
    "R7": "Bound every cache with size and TTL",
    "R8": "Recycle replicas on a schedule as a rolling restart",
    "R9": "Roll updates with headroom, one deployment at a time",
    "R10": "Bound the queue (max_queued_requests) so overload fails fast",
    # Offered by the wizard from the incident's load (apps.remediation.scaler_offer), not by a cause.
    "R11": "Let Fleetdeck scale it",
}

REMEDIES_FOR = {
    "OOM-1": ["R3", "R4", "R5"],
    "OOM-2": ["R1", "R2"],
    "OOM-3": ["R5"],
    "OOM-4": ["R7"],
    "OOM-5": ["R8", "R1"],
    "OOM-6": [],
    "OOM-7": ["R9"],
    "LAT-1": ["R6", "R2"],
    "LAT-2": ["R2", "R10"],
    "LAT-3": ["R1"],
    "LAT-4": ["R5"],
    "LAT-5": ["R5"],
    "LAT-6": ["R1", "R7", "R8"],
    "LAT-7": [],
    "LAT-8": [],
    "LAT-9": ["R1", "R3"],
    "LLM-1": ["R8"],
}


# The playbook's Kubernetes checks. Their fixes live in pod specs and KubeRay resources, not in a
# Serve config, so they are not remedies a wizard applies: a cause names the check that fixes it.
CHECKS = {
    "K1": "Memory requests and limits on every Ray container; Ray's memory and object store inside the limit",
    "K2": "No HPA or KEDA ScaledObject scaling what Ray or Serve autoscaling already scales",
    "K3": "No pod hanging in Terminating: scale-in frees memory",
    "K4": "GPU pods request enough CPU",
}
CHECKS_FOR = {"OOM-6": ["K1"], "OOM-7": ["K3"]}


def cause(cause_id: str, reason: str, rank: int) -> dict:
    return {
        "id": cause_id,
        "title": CAUSES[cause_id],
        "reason": reason,
        "rank": rank,
        "remedies": [{"id": r, "title": REMEDIES[r]} for r in REMEDIES_FOR[cause_id]],
        "checks": [{"id": k, "title": CHECKS[k]} for k in CHECKS_FOR.get(cause_id, [])],
    }


# The playbook's heavy-model prescription: lower the peak, keep queues short, soften cold starts.
# R10 follows R2 because lowering concurrency moves requests into the queue, which then needs a bound.
PRESCRIPTION = ["R1", "R2", "R10", "R3", "R4", "R5", "R6", "R7", "R8", "R9"]
CONFIG_REMEDIES = {"R1", "R2", "R10"}

GUIDANCE = {
    "R3": (
        "Reject oversized input at the edge, before it reaches the model: cap prompt characters (or bytes, pixels, "
        "frames) and requested tokens, and answer 413 or 422 with the limit in the message. An outlier request then "
        "costs a 4xx, not a replica. Read the token caps from user_config (max_prompt_tokens, max_tokens_cap) and "
        "the wizard sizes them from a token-sum calibration and the memory budget, and applies them as a config "
        "change."
    ),
    "R4": (
        "Batch by the sum of tokens (pixels, frames) rather than by request count, so one long request cannot make a "
        "batch ten times the memory of a typical one. Serve's @serve.batch takes a size function for this; size the "
        "sum from the calibrated memory curve: give the deployment class a calibration_batch(token_sum) method, "
        "calibrate it on the token-sum axis, and the wizard computes the largest sum that fits the memory budget. "
        "Read the limit from user_config (max_batch_tokens) and the wizard can apply it as a config change."
    ),
    "R5": (
        "Keep large inputs and results out of request bodies and the object store: upload to object storage, pass "
        "the key, return small JSON. Large bodies cost serialization time (LAT-4) and object-store memory (OOM-3)."
    ),
    "R6": (
        "Run one dummy inference in the replica's constructor and ship model files with the image, so a new replica "
        "is warm before Serve routes traffic to it. Pair with a warmup profile after recycles and changes."
    ),
    "R7": (
        "Give every cache a maximum size and a TTL (cachetools.TTLCache or functools.lru_cache(maxsize=…)); an "
        "unbounded cache grows with every new key until the replica is killed."
    ),
    "R8": (
        "Schedule a rolling recycle (e.g. every 6 h, in a quiet window) so memory kept by allocators is returned "
        "before the memory monitor kills a replica. Keep at least two replicas so a recycle is never an outage."
    ),
    "R9": (
        "Roll with headroom: never shrink min replicas during an update, change one deployment at a time, and keep "
        "node memory below ~70 % so old and new replicas fit together for a few seconds."
    ),
}
