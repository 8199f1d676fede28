"""The Kubernetes adapter (`adapter`, the only code that talks to a Kubernetes API server, through
the official client), the typed objects it returns (`pods`, `kuberay`, `events`, `autoscalers`)
and what it raises (`errors`)."""
