"""The EC2 instance ID from instance metadata (IMDSv2), only with ``--instance-id imds``.

Off by default: a pod without ``hostNetwork`` cannot reach IMDSv2 when the instance's PUT
response hop limit is 1 (Karpenter's default, and a common hardening), and a blocked IMDS
would cost a timeout at every start. Pass ``--instance-id i-…`` where the ID is known (e.g.
from the node's ``spec.providerID``), or ``--instance-id imds`` to ask the metadata service
once at start, with a one-second timeout per request.
"""

from __future__ import annotations

import logging
import re
import urllib.error
import urllib.request

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "http://169.254.169.254"
_INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")


def instance_id_from_imds(endpoint: str = DEFAULT_ENDPOINT, timeout: float = 1.0) -> str | None:
    """The instance ID (``i-…``), or None when IMDS does not answer within ``timeout``
    seconds per request or answers something else (logged as a warning)."""
    base = endpoint.rstrip("/")
    try:
        token_request = urllib.request.Request(
            f"{base}/latest/api/token", method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"},
        )
        with urllib.request.urlopen(token_request, timeout=timeout) as response:
            token = str(response.read().decode("ascii", "replace")).strip()
        id_request = urllib.request.Request(
            f"{base}/latest/meta-data/instance-id",
            headers={"X-aws-ec2-metadata-token": token},
        )
        with urllib.request.urlopen(id_request, timeout=timeout) as response:
            value = str(response.read().decode("ascii", "replace")).strip()
    except (OSError, urllib.error.URLError, ValueError) as exc:
        log.warning("instance ID from IMDS unavailable (%s): InstanceId dimension off", exc)
        return None
    if not _INSTANCE_ID.fullmatch(value):
        log.warning("IMDS answered %r for the instance ID: InstanceId dimension off", value[:40])
        return None
    return value
