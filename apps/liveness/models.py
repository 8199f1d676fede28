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
