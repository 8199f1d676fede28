"""Client of Ray's Prometheus metrics endpoint (`--metrics-export-port`): the only code that
fetches metrics. It returns parsed samples; what they mean is computed by the incidents app."""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from integrations.egress import AnswerTooSlow, PinnedTransport
from integrations.errors import AdapterError

USER_AGENT = "fleetdeck-metrics/1"
# A scrape of a busy node is ~760 KB; refuse what is clearly not a metrics page.
MAX_BYTES = 32 * 1024 * 1024


class MetricsUnavailable(AdapterError):
    """The endpoint (or Prometheus) is down, slow, too large or not answering metrics."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Scrape:
    at: float
    samples: list[Sample] = field(default_factory=list)

    def named(self, name: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name]


def parse(text: str, at: float | None = None, names: Collection[str] | None = None) -> Scrape:
    """Prometheus text exposition to samples; garbage raises MetricsUnavailable. With `names`,
    only samples of those names are parsed: a busy endpoint has tens of thousands of lines, the
    parser costs far more than reading them, and a reader needs a few hundred."""
    scrape = Scrape(at=time.time() if at is None else at)
    if names is not None:
        text = only(text, frozenset(names))
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                scrape.samples.append(Sample(sample.name, dict(sample.labels), float(sample.value)))
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsUnavailable(
            f"The metrics endpoint did not answer Prometheus text: {exc}", transient=False
        ) from exc
    return scrape


def only(text: str, names: frozenset[str]) -> str:
    """The sample lines of `names`. Comments go too: without its TYPE line a histogram's lines
    parse as untyped samples of the same names, labels and values."""
    kept = []
    for line in text.splitlines():
        if line and line[0] != "#" and line.partition("{")[0].partition(" ")[0] in names:
            kept.append(line)
    return "\n".join(kept) + "\n"


def scrape(
    url: str,
    *,
    timeout_s: float = 5.0,
    transport: httpx.BaseTransport | None = None,
    names: Collection[str] | None = None,
) -> Scrape:
    try:
        with (
            httpx.Client(
                timeout=timeout_s,
                follow_redirects=False,
                trust_env=False,
                transport=transport or PinnedTransport(),
                headers={"User-Agent": USER_AGENT, "Accept": "text/plain"},
            ) as client,
            client.stream("GET", url) as response,
        ):
            if response.status_code != 200:
                raise MetricsUnavailable(
                    f"{url} answered HTTP {response.status_code}.", transient=response.status_code >= 500
                )
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_BYTES:
                    raise MetricsUnavailable(
                        f"{url} sent more than {MAX_BYTES // 2**20} MiB; not a metrics page.", transient=False
                    )
    except AnswerTooSlow as exc:
        # Its own message names the deadline and the setting; "did not answer in time" would hide it.
        raise MetricsUnavailable(str(exc), transient=True) from exc
    except httpx.TimeoutException as exc:
        raise MetricsUnavailable(f"{url} did not answer in time.", transient=True) from exc
    except httpx.TransportError as exc:
        raise MetricsUnavailable(f"Cannot reach {url}: {str(exc) or exc.__class__.__name__}.", transient=True) from exc
    return parse(body.decode("utf-8", errors="replace"), names=names)
