"""Built-in tuning presets, shipped as data. Each encodes remedies of the operations playbook
(R1 concurrency cap, R2 queue-based autoscaling, R10 bounded queue) with the reason for it."""

BUILTIN_PRESETS = [
    {
        "slug": "heavy-gpu-model",
        "name": "Heavy GPU model (LLM)",
        "remedies": ["R1", "R2", "R10"],
        "description": (
            "For models that hold gigabytes per request (LLMs, large batches). Each replica takes at "
            "most two requests at once, so a burst cannot multiply per-request temporaries into an OOM "
            "kill (OOM-2); autoscaling follows the queue with a target of one request per replica, keeps "
            "two replicas so a restart or recycle is never a cold start for everyone (LAT-1), scales up "
            "within seconds and down only after a minute of calm; the queue is bounded so overload fails "
            "fast with 503 instead of building minutes of latency (LAT-2). Constants trade OOM kills for "
            "rejections: calibrate from measured per-request memory where you can."
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
]
