"""Fleetdeck's side of Kubernetes: connections to API servers, the link from a registered Ray
cluster to its KubeRay resource, discovery, the K1-K4 checks and the inspection after each sync,
OOMKilled evidence, and the RayService serveConfigV2 writer of the push protocol. The adapter
itself lives in `integrations.kubernetes`."""
