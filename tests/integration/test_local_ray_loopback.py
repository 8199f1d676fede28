"""A local Ray head listens on loopback only: an unauthenticated head reachable from the network runs anyone's code."""

from __future__ import annotations

import contextlib
import ipaddress

import psutil
import pytest

from apps.demo.local_ray import _ephemeral_start, _pids_in_session

pytestmark = pytest.mark.ray


def head_processes(head) -> list[psutil.Process]:
    """The head's process tree, and whatever left the tree but kept the head's session."""
    root = psutil.Process(head.process.pid)
    processes = {root.pid: root, **{child.pid: child for child in root.children(recursive=True)}}
    for pid in _pids_in_session(head.process.pid):
        if pid not in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                processes[pid] = psutil.Process(pid)
    return list(processes.values())


def listening_sockets(head) -> list[tuple[str, int, str, int]]:
    """(process name, pid, address, port) of every TCP socket in LISTEN, and every UDP socket bound
    without a peer, which takes datagrams from anyone who can reach its address."""
    found = set()
    for proc in head_processes(head):
        try:
            name = proc.name()
            connections = proc.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        for conn in connections:
            if conn.status == psutil.CONN_LISTEN or (conn.status == psutil.CONN_NONE and not conn.raddr):
                found.add((name, proc.pid, conn.laddr.ip, conn.laddr.port))
    return sorted(found, key=lambda row: (row[0], row[3]))


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    # Ray's gRPC servers bind 127.0.0.1 through an IPv6 socket, which reports it as ::ffff:127.0.0.1.
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def unpinnable(name: str, address: str, port: int) -> bool:
    """A Serve replica's inter-deployment gRPC server: Ray 2.60 binds it to "[::]:0"
    (ray/serve/_private/replica.py, `_on_initialized`) whatever the node's address, and no flag or
    environment variable changes that. The kernel picks its port from the ephemeral range, which is
    how it is told apart from the replica's core worker port. The README says what this exposes."""
    return name.startswith("ray::ServeReplica:") and address == "::" and port >= _ephemeral_start()


def test_every_port_of_a_head_with_serve_applications_running_listens_on_loopback_only(ray_head):
    sockets = listening_sockets(ray_head)
    ports = {port for *_, port in sockets}
    # The head's own ports and the Serve proxy's: a process tree missed would look all loopback.
    assert set(ray_head.ports.values()) | {ray_head.serve_http_port} <= ports, sockets
    exposed = [row for row in sockets if not is_loopback(row[2]) and not unpinnable(row[0], row[2], row[3])]
    assert not exposed, "listening beyond loopback:\n" + "\n".join(
        f"  {name} (pid {pid}) on {address} port {port}" for name, pid, address, port in exposed
    )
