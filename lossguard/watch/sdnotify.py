"""systemd's notify protocol: one datagram per state change to $NOTIFY_SOCKET (a path, or an
abstract socket when it starts with '@'). Small enough to implement rather than depend on."""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self) -> None:
        address = os.environ.get("NOTIFY_SOCKET")
        self.address = "\0" + address[1:] if address and address.startswith("@") else address
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        self.watchdog_interval = None
        if usec and usec.isdigit() and (not pid or pid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 1e6 / 2  # ping at half the timeout, as systemd advises

    def send(self, state: str) -> bool:
        if not self.address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto(state.encode(), self.address)
        except OSError:
            return False
        return True
