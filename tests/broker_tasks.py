"""A trivial task for the embedded broker tests: each run appends its number to a file, so the
test counts what the worker executed, and how often, without a database."""

import os

from celery import shared_task


@shared_task(name="tests.record", ignore_result=True)
def record(number: int) -> None:
    # One short O_APPEND write per run: lines from concurrent pool processes never interleave.
    with open(os.environ["FLEETDECK_TEST_RECORD_FILE"], "a") as out:
        out.write(f"{number}\n")
