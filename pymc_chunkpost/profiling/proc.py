"""This process's memory as Linux reports it: the benchmarks' one reader of `/proc/self`."""

from __future__ import annotations


def status_bytes(field: str) -> int:
    """A size field of `/proc/self/status` (such as "VmRSS" or "VmHWM"), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status (Linux only)")


def reset_peak() -> None:
    """Reset `VmHWM` to the current resident set size (`echo 5 > /proc/self/clear_refs`)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class PeakRss:
    """This process's peak resident set size from now on: `VmHWM` after `reset_peak`, or,
    where that is not permitted or not reported (an ordinary user on the TPU machine, whose
    kernel reports no `VmHWM`), the largest `VmRSS` that a thread reads every 5 ms."""

    def __init__(self) -> None:
        import threading

        self.method = "VmHWM"
        try:
            status_bytes("VmHWM")
            reset_peak()
            return
        except (OSError, RuntimeError):
            self.method = "VmRSS every 5 ms"
        self.most = status_bytes("VmRSS")
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.done.wait(0.005):
            self.most = max(self.most, status_bytes("VmRSS"))

    def bytes(self) -> int:
        """The peak so far, in bytes (a watching thread stops here)."""
        if self.method == "VmHWM":
            return status_bytes("VmHWM")
        self.done.set()
        self.thread.join()
        return max(self.most, status_bytes("VmRSS"))
