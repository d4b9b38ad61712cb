"""Whether the Hugging Face Hub answers, asked once with a short timeout. Offline without ``HF_HUB_OFFLINE=1``, the hub
library retries each request for about 50 s before it reads its cache or fails; with an unreachable hub a download
runs in the library's offline mode instead (the cache, else its error at once)."""

from __future__ import annotations

import socket
from contextlib import contextmanager
from typing import Iterator, Optional
from urllib.parse import urlparse

__all__ = ["PROBE_SECONDS", "hub_reachable", "offline_unless_reachable"]

PROBE_SECONDS = 3.0


def hub_reachable(endpoint: str, timeout: float = PROBE_SECONDS) -> bool:
    """Whether a TCP connection to ``endpoint``'s host opens within ``timeout`` seconds."""
    url = urlparse(endpoint)
    try:
        socket.create_connection((url.hostname, url.port or (80 if url.scheme == "http" else 443)), timeout).close()
    except OSError:
        return False
    return True


@contextmanager
def offline_unless_reachable() -> Iterator[Optional[str]]:
    """Inside, the hub library is in its offline mode when its endpoint does not answer; yields why (None when the
    hub answers or offline mode was already on)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or hub_reachable(constants.ENDPOINT):
        yield None
        return
    constants.HF_HUB_OFFLINE = True
    try:
        yield f"{constants.ENDPOINT} does not answer and they are not in the hub cache"
    finally:
        constants.HF_HUB_OFFLINE = False
