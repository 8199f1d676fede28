"""Requests per second of one URL under concurrent clients, and the same as a ratio to a
baseline URL measured alongside it: the load generator of bench/ui_api_cost.py."""

from __future__ import annotations

import http.client
import multiprocessing
import threading
import time

TRIVIAL = "/bench/trivial/"
SLICE_SECONDS = 1.0
LOAD_PROCESSES, LOAD_THREADS = 2, 4


def hammer(port: int, path: str, token: str, seconds: float, threads: int, out) -> None:
    """One load process: `threads` clients requesting `path` back to back until the deadline."""
    counts = []
    deadline = time.monotonic() + seconds

    def client() -> None:
        ok = failed = 0
        while time.monotonic() < deadline:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                connection.request("GET", path, headers={"Authorization": f"Token {token}", "Host": "127.0.0.1"})
                response = connection.getresponse()
                response.read()
                ok, failed = (ok + 1, failed) if response.status == 200 else (ok, failed + 1)
            except OSError:
                failed += 1
            finally:
                connection.close()
        counts.append((ok, failed))

    workers = [threading.Thread(target=client) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    out.put((sum(ok for ok, _ in counts), sum(failed for _, failed in counts)))


def requests_per_second(port: int, path: str, token: str, seconds: float) -> tuple[float, int]:
    queue = multiprocessing.get_context("fork").Queue()
    processes = [
        multiprocessing.get_context("fork").Process(
            target=hammer, args=(port, path, token, seconds, LOAD_THREADS, queue)
        )
        for _ in range(LOAD_PROCESSES)
    ]
    for process in processes:
        process.start()
    totals = [queue.get() for _ in processes]
    for process in processes:
        process.join()
    return sum(ok for ok, _ in totals) / seconds, sum(failed for _, failed in totals)


def paired(port: int, path: str, token: str, seconds: float) -> tuple[float, int, float]:
    """Requests per second of `path` and of the trivial endpoint measured in alternating slices
    of SLICE_SECONDS, `seconds` each in all: a shared machine's speed drifts by tens of percent
    within minutes, and a baseline measured once, minutes before, moved the ratio with it."""
    done = failed = trivial = 0.0
    for _ in range(max(1, round(seconds / SLICE_SECONDS))):
        rate, _ = requests_per_second(port, TRIVIAL, token, SLICE_SECONDS)
        trivial += rate
        rate, lost = requests_per_second(port, path, token, SLICE_SECONDS)
        done, failed = done + rate, failed + lost
    slices = max(1, round(seconds / SLICE_SECONDS))
    return done / slices, int(failed), trivial / slices
