"""Fleetdeck's side of Kubernetes: connections to API servers, the link from a registered Ray
cluster to its KubeRay resource, discovery, the K1-K4 inspection after each sync, and the
RayService writer of the push protocol. The adapter itself lives in `apps.kube`."""
