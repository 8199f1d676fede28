"""The ports a local Ray head is given: distinct, and new ones when Ray finds one taken."""

import socket

from apps.demo import local_ray
from apps.demo.local_ray import free_ports


class Repeating:
    """A random source that picks the same port again before moving on, as a real one can.

    It replaces the module's private `_PICK` (and `_PORTS_FROM`, to reach a port the OS handed
    out): free_ports takes no source, and nothing outside it can make a random pick repeat."""

    def __init__(self, values):
        self.values = list(values)

    def randrange(self, start, stop):
        return self.values.pop(0)


def test_ports_picked_together_are_distinct_even_when_the_random_source_repeats(monkeypatch):
    # Ports free a moment ago: fixed numbers were sometimes held by a Ray worker of another test.
    first, second, third = free_ports(3)
    monkeypatch.setattr(local_ray, "_PICK", Repeating([first, first, first, second, third]))
    assert free_ports(3) == [first, second, third]


def test_a_port_something_listens_on_is_never_picked(monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        monkeypatch.setattr(local_ray, "_PORTS_FROM", 1024)
        (free,) = free_ports(1)
        monkeypatch.setattr(local_ray, "_PICK", Repeating([taken, taken, free]))
        assert free_ports(1) == [free]
