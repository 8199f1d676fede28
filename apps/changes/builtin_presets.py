"""Built-in tuning presets, shipped as data. Each encodes remedies of the operations playbook
(R1 concurrency cap, R2 queue-based autoscaling, R10 bounded queue) with the reason for it."""

BUILTIN_PRESETS = [
    {
        "slug": "heavy-gpu-model",
        "name": "Heavy GPU model (no batching engine)",
        "remedies": ["R1", "R2", "R10"],
        "description": (
            "For models that hold gigabytes per request and do not batch them (a hand-written model server, large"
            " batches); a vLLM engine batches, so serve.llm deployments take vllm-engine. Each replica takes at "
            "most two requests at once, so a burst cannot multiply per-request temporaries into an OOM kill "
            "(OOM-2); autoscaling follows the queue with a target of one request per replica, keeps two replicas "
            "so a restart or recycle is never a cold start for everyone (LAT-1), scales up within seconds and "
            "down only after a minute of calm; the queue is bounded so overload fails fast with 503 instead of "
            "building minutes of latency (LAT-2). Constants trade OOM kills for rejections: calibrate from "
            "measured per-request memory where you can."
        ),
        "options": {
            "max_ongoing_requests": 2,
            "max_queued_requests": 16,
            "autoscaling_config": {
                "min_replicas": 2,
                "max_replicas": 8,
                "target_ongoing_requests": 1,
                "upscale_delay_s": 5,
                "downscale_delay_s": 90,
            },
        },
    },
    {
        "slug": "vision-gpu",
        "name": "Vision model on GPU",
        "remedies": ["R1", "R2", "R10"],
        "description": (
            "For image and video models whose memory grows with pixels per batch. A few concurrent "
            "requests per replica keep the GPU busy while bounding the peak (OOM-1, OOM-2); autoscaling "
            "targets two in flight per replica, keeps two replicas for restarts (LAT-1), reacts within "
            "ten seconds and waits a minute before shrinking; a bounded queue sheds overload early."
        ),
        "options": {
            "max_ongoing_requests": 4,
            "max_queued_requests": 32,
            "autoscaling_config": {
                "min_replicas": 2,
                "max_replicas": 6,
                "target_ongoing_requests": 2,
                "upscale_delay_s": 10,
                "downscale_delay_s": 60,
            },
        },
    },
    {
        "slug": "light-cpu",
        "name": "Light CPU service",
        "remedies": ["R2", "R10"],
        "description": (
            "For light CPU deployments (routers, pre/post-processing, small models) where a request costs "
            "little memory. Higher concurrency per replica is safe; autoscaling keeps one replica warm and "
            "adds more when each carries about eight requests; the queue is bounded so a stalled backend "
            "does not pile up unbounded work (LAT-2)."
        ),
        "options": {
            "max_ongoing_requests": 16,
            "max_queued_requests": 128,
            "autoscaling_config": {
                "min_replicas": 1,
                "max_replicas": 4,
                "target_ongoing_requests": 8,
                "upscale_delay_s": 10,
                "downscale_delay_s": 120,
            },
        },
    },
    {
        "slug": "vllm-engine",
        "name": "LLM on a vLLM engine (serve.llm)",
        "remedies": ["R1", "R2", "R9", "R10"],
        "description": (
            "For serve.llm deployments, whose vLLM engine batches requests and bounds them by its KV cache rather "
            "than by a small constant. max_ongoing_requests 256 is vLLM's smallest max_num_seqs default, so a "
            "replica takes no more than its engine runs at once instead of serve.llm's unbounded 1e9 (ray#54070); "
            "autoscaling targets half a batch per replica, not one request, which would add a GPU per request; "
            "two replicas cover restarts, and the slow downscale spares minutes-long model loads (LAT-1); the "
            "health check waits 30 s rather than 10, so it does not kill a busy replica whose first tokens are "
            "slow; the queue is bounded. Set max_ongoing_requests to the engine's own max_num_seqs where it differs "
            "(1024 on 80 GB GPUs other than A100)."
        ),
        "options": {
            "max_ongoing_requests": 256,
            "max_queued_requests": 512,
            "health_check_timeout_s": 30,
            "autoscaling_config": {
                "min_replicas": 2,
                "max_replicas": 8,
                "target_ongoing_requests": 128,
                "upscale_delay_s": 30,
                "downscale_delay_s": 600,
            },
        },
    },
]
