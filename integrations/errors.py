"""The one error base of every outbound client. Like a transport error that says whether it is
permanent, each says whether a retry may help (`transient`) and, when the far end answered, with
which HTTP status."""

from __future__ import annotations


class AdapterError(Exception):
    """`transient` defaults to the class's own: a family of errors that are always transient
    (a timeout, an unreachable server) says so once, on its class."""

    transient = False

    def __init__(self, message: str, *, transient: bool | None = None, status: int | None = None, excerpt: str = ""):
        # The message without the far end's words: an answer from a URL someone just typed is not theirs to read.
        self.summary = message
        message = f"{message}: {excerpt}" if excerpt else message
        super().__init__(message)
        self.message = message
        self.status = status
        self.excerpt = excerpt
        if transient is not None:
            self.transient = transient


class AdapterConflict(AdapterError):
    """The target changed since it was read: nothing was written, the caller must read again."""
