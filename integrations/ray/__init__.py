"""The Ray dashboard client (`dashboard`), what it returns (`payloads`, built by `parsing`) and
what it raises (`errors`)."""
