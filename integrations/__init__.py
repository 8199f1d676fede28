"""Fleetdeck's outbound clients: the only code that speaks HTTP to Ray dashboards, metrics
endpoints, Prometheus, Serve proxies, webhook endpoints and Kubernetes API servers.

Nothing here imports Django apps: a client takes what it needs (URLs, credentials, the network
policy) from its caller and raises `errors.AdapterError` subclasses."""
