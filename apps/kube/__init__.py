"""Kubernetes and KubeRay: the adapter (the only code that talks to a Kubernetes API server), the
typed objects it returns, and pure functions over them (K1-K4 checks, OOMKilled evidence, the
RayService config writer)."""
