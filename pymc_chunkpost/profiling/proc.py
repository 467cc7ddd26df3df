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
