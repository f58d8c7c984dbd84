"""The open-file limit of a lab process, raised once at start-up.

It owns one decision: how far the soft `RLIMIT_NOFILE` may go. It knows nothing about sockets,
servers or load: the simulator, the load generator and the bench call it before they open
thousands of connections.
"""

from __future__ import annotations

__all__ = ["raise_fd_limit"]

# Where the hard limit is unlimited, the soft one is raised this far: enough for any run on one
# machine, and a number the kernel accepts (it refuses RLIM_INFINITY for descriptors).
_UNLIMITED_TARGET = 1 << 20


def raise_fd_limit() -> None:
    """Raise the soft limit on open files to the hard limit (or to about a million when the hard
    limit is unlimited). Never raises: where the limit cannot be changed, or on a system without
    `resource` (Windows), it is left as it is, and a run that needs more descriptors reports
    connect errors that say why."""
    # Thousands of concurrent streams need more than the usual soft limit of 1024 descriptors.
    try:
        import resource  # POSIX only
    except ImportError:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else _UNLIMITED_TARGET
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass  # e.g. macOS caps it below the hard limit; the current limit stands
