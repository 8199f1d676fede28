from django.db import models


class Heartbeat(models.Model):
    """When a background process last showed it runs: the worker each time it runs the tick, beat
    when it starts and each time it sends the tick. In the database, so every web process sees
    the same rows and they outlive a restart."""

    class Process(models.TextChoices):
        WORKER = "worker", "worker"
        BEAT = "beat", "beat"

    process = models.CharField(max_length=16, choices=Process.choices, primary_key=True)
    at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.process} at {self.at:%Y-%m-%d %H:%M:%S}"


class TickFailure(models.Model):
    """A tick handler that raised: how often, and whether it still does. A row is written when a
    handler fails and when it next succeeds, never on the ticks in between, so a healthy tick
    writes nothing here."""

    handler = models.CharField(max_length=64, primary_key=True)
    failures = models.PositiveIntegerField(default=0, help_text="Ticks on which it raised, in all.")
    consecutive = models.PositiveIntegerField(default=0, help_text="Ticks in a row it raised; 0 once it ran again.")
    last_error = models.TextField(blank=True)
    last_failed_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.handler}: {self.consecutive} in a row"
