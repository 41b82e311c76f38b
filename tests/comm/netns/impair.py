"""A slow, lossy link between two namespaces, in user space (for kernels without sch_netem).

    python impair.py NS_A NS_B IFACE DELAY_MS LOSS_PCT SEED

Creates a TUN device named IFACE in each namespace (IP packets, no headers) and relays the
packets between them: each is dropped with probability LOSS_PCT/100, else delivered DELAY_MS
later, in order. Prints "ready" once both devices exist; runs until killed, or until its
stdin closes (the harness holds it open), or for at most MAX_S seconds.
"""

import ctypes
import fcntl
import os
import random
import select
import struct
import sys
import time
from collections import deque

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
CLONE_NEWNET = 0x40000000
MAX_S = 600.0

_libc = ctypes.CDLL(None, use_errno=True)


def enter(ns: str) -> None:
    fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({ns}): {os.strerror(err)}")
    finally:
        os.close(fd)


def tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def main():
    ns_a, ns_b, iface, delay_ms, loss_pct, seed = sys.argv[1:7]
    delay, loss = float(delay_ms) / 1000, float(loss_pct) / 100
    rng = random.Random(int(seed))
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    enter(ns_a)
    fd_a = tun(iface)
    enter(ns_b)
    fd_b = tun(iface)
    _libc.setns(home, CLONE_NEWNET)
    other = {fd_a: fd_b, fd_b: fd_a}
    print("ready", flush=True)
    queue: deque = deque()  # (due, out fd, packet): one delay for all, so in time order
    stdin = sys.stdin.fileno()
    end = time.monotonic() + MAX_S
    while time.monotonic() < end:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, out, packet = queue.popleft()
            try:
                os.write(out, packet)
            except OSError:
                pass  # the device is down: the packet is lost, as on a wire
        wait = max(0.0, queue[0][0] - now) if queue else 1.0
        ready, _, _ = select.select([fd_a, fd_b, stdin], [], [], wait)
        for fd in ready:
            if fd == stdin:
                if not os.read(stdin, 1024):
                    return
                continue
            for _ in range(64):
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if rng.random() >= loss:
                    queue.append((time.monotonic() + delay, other[fd], packet))


if __name__ == "__main__":
    main()
