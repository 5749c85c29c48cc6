"""Stops a launched server's process group once the process that launched it is gone.

Run as a script (``python reaper.py WATCHED_PID STOP_TIMEOUT_S``) in a session of its own,
so that it outlives its launcher: when the actor that started a server dies (killed by Ray,
by the driver's Ctrl-C or SIGTERM, or with its raylet), nothing of the actor runs any more,
and this is what ends the server. It also exits, after clearing the server's group, when
the server's leader exits first (a normal stop).

It starts before the server and reads the server's pid from its stdin, written by the
launcher the moment the server is started: a watchdog started after the server (a Python
start, a second or more on a loaded machine) left a window in which an interrupt killed the
launcher, Ray killed the server's leader as the dead worker's child, and the leader's own
children ran on with no one to end them. An end of input without a pid (the launcher died
first, or started no server) ends the watchdog: there is nothing to watch.

It detaches (forks, and the launched process exits at once): Ray kills a dead worker's
direct children, which would be the server's leader and this watchdog, and leave the
rest of the server's group (vLLM's engine cores) running with no one to end them.

No imports beyond the standard library: it must start in milliseconds and depend on
nothing the actor's environment might lack.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time


def _answers(send: object, target: int) -> bool:
    """Whether signal 0 reaches ``target`` through ``send`` (os.kill: a process; os.killpg: a group)."""
    try:
        send(target, 0)  # type: ignore[operator]
    except ProcessLookupError:
        return False
    except PermissionError:  # there, but another user's
        return True
    return True


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat``'s fields after the command name (state, ppid, pgrp, ...), or None
    where it cannot be read. The name, in parentheses, may itself hold spaces and parentheses."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs.

    A member that has exited but is not yet reaped (a zombie: the server's leader until the
    process that launched it waits for it) still answers ``killpg``'s signal 0, and a stop that
    asked only that would wait out its whole bound for a server that is gone. So where /proc
    lists the group's members, only a member that is not a zombie counts; where it lists none
    (another PID namespace's view), the signal's answer stands.
    """
    if not _answers(os.killpg, pgid):
        return False
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return True
    members = 0
    for pid in pids:
        fields = _stat_fields(int(pid))
        if fields is None:
            continue  # gone since the listing
        state, _ppid, pgrp = fields[:3]
        if int(pgrp) == pgid:
            if state != "Z":
                return True
            members += 1
    return members == 0


def stop_group(pgid: int, timeout_s: float) -> None:
    """SIGTERM to the whole group, then SIGKILL to whatever is left after ``timeout_s``."""
    stop_groups({pgid}, timeout_s)


def tree_groups(pid: int) -> set[int]:
    """The process groups of ``pid`` and of every process descended from it, read now.

    A child that starts a session of its own (``setsid``; vLLM's sweep starts its `vllm serve`
    so) leaves its parent's group, and a stop of that group alone leaves it running. The tree
    is read before anything is signalled: once a parent dies, its children are adopted by init
    and no longer lead back to it.
    """
    children: dict[int, list[int]] = {}
    groups: dict[int, int] = {}
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        pids = []
    for p in pids:
        fields = _stat_fields(p)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(p)
            groups[p] = int(fields[2])
    found: set[int] = set()
    with contextlib.suppress(ProcessLookupError):
        found.add(os.getpgid(pid))
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(groups[child])
            todo.append(child)
    return found


def stop_groups(pgids: set[int], timeout_s: float) -> None:
    """SIGTERM to each group, then, after one shared bound (none once every group is gone),
    SIGKILL to whatever is left of them."""
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(group_running(g) for g in pgids):
        time.sleep(0.05)
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def _wait_for_either(watched: int, server: int) -> str:
    """'launcher' or 'server': which of the two processes ended first."""
    try:
        fds = {os.pidfd_open(watched): "launcher", os.pidfd_open(server): "server"}
    except ProcessLookupError:
        return "launcher" if not alive(watched) else "server"
    except (AttributeError, OSError):  # no pidfd (old kernel): poll
        while True:
            if not alive(watched):
                return "launcher"
            if not alive(server):
                return "server"
            time.sleep(0.2)
    ready, _, _ = select.select(list(fds), [], [])
    return fds[ready[0]]


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs; a zombie (exited, not yet reaped by its parent) does not."""
    if not _answers(os.kill, pid):
        return False
    fields = _stat_fields(pid)
    return fields is None or fields[0] != "Z"  # no /proc entry to read: signal 0's answer stands


def main(argv: list[str]) -> int:
    watched, timeout_s = int(argv[1]), float(argv[2])
    if os.fork() > 0:
        return 0  # the launcher reaps this one at once; the watchdog is no child of its
    # (an orphan, adopted by init or the node's subreaper)
    # The launcher's Ctrl-C reaches its own process group, not this session; ignore it anyway.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    line = sys.stdin.readline().strip()
    if not line.isdigit():
        return 0  # no server was started, or its launcher is gone before it could say which
    server = int(line)
    ended = _wait_for_either(watched, server)
    # The server leads its own group (its pgid is its pid). After a normal stop its leader
    # has exited and the launcher cleared the group; anything left is killed here.
    stop_group(server, timeout_s if ended == "launcher" else 1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
