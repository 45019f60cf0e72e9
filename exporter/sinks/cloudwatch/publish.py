"""Sending datums: boto3's ``put_metric_data``, or printing them (``--cloudwatch-dry-run``).

boto3 is imported only by :func:`make_client`, which the CLI calls only when the sink is on
and not a dry run: on a node without CloudWatch the exporter never pays boto3's import time
and memory (about 100 ms and 25 MiB).
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol, TextIO

from gpuscope.exporter import __version__
from gpuscope.exporter.sinks.cloudwatch.aggregate import Datum

log = logging.getLogger(__name__)

#: Error codes that mean "this request is wrong and will never be accepted": the batch is
#: dropped (and counted) instead of blocking every later datum behind it.
_REJECTED_CODES = frozenset({
    "InvalidParameterValue", "InvalidParameterValueException",
    "InvalidParameterCombination", "InvalidParameterCombinationException",
    "MissingParameter", "MissingRequiredParameter", "MissingRequiredParameterException",
    "ValidationError", "ValidationException", "RequestEntityTooLarge",
    "SerializationException",
})


class PublishError(Exception):
    """A request that did not go through. ``retryable`` False means CloudWatch rejected it
    for what it contains: sending it again would fail again."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class Publisher(Protocol):
    """Sends one request's datums. ``protocol`` is the wire protocol, for size estimates."""

    protocol: str

    def put(self, namespace: str, datums: Sequence[Datum]) -> None: ...


class ClientError(Exception):
    """The region could not be resolved or the client could not be built (one line)."""


def make_client(
    region: str | None,
    endpoint_url: str | None,
    *,
    total_attempts: int = 3,
    connect_timeout: float = 5.0,
    read_timeout: float = 10.0,
) -> Any:
    """A boto3 CloudWatch client with the default credential chain (IRSA, instance profile,
    environment), botocore's **standard** retry mode (exponential backoff with jitter on
    throttling, 5xx and connection errors; ``total_attempts`` tries per call, the first
    included) and short timeouts so a shutdown flush stays bounded."""
    # importlib keeps boto3 out of the import graph mypy and the exporter's start-up see;
    # boto3 ships no type information anyway (the client is Any).
    try:
        boto3 = importlib.import_module("boto3")
        botocore_config = importlib.import_module("botocore.config")
        exceptions = importlib.import_module("botocore.exceptions")
    except ImportError:
        raise ClientError(
            "--cloudwatch needs boto3, which is not installed "
            "(pip install 'gpuscope[cloudwatch]', or boto3)"
        ) from None

    config = botocore_config.Config(
        retries={"mode": "standard", "total_max_attempts": total_attempts},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        user_agent_extra=f"gpuscope/{__version__}",
    )
    try:
        return boto3.session.Session().client(
            "cloudwatch", region_name=region, endpoint_url=endpoint_url, config=config
        )
    except exceptions.NoRegionError:
        raise ClientError(
            "--cloudwatch-region: no region given and none in the AWS environment "
            "(AWS_REGION, AWS_DEFAULT_REGION, ~/.aws/config)"
        ) from None
    except (exceptions.BotoCoreError, ValueError) as exc:
        raise ClientError(f"cannot create the CloudWatch client: {exc}") from None


def _classify(exc: Exception) -> PublishError:
    exceptions = importlib.import_module("botocore.exceptions")
    if isinstance(exc, exceptions.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        message = f"PutMetricData failed: HTTP {status} {code}: {error.get('Message', '')}"
        # Only a request refused for its content is dropped; everything else (throttling,
        # 5xx, expired or missing credentials, AccessDenied while IAM is being fixed, a
        # wrong endpoint) keeps the data buffered, within the buffer's bound.
        rejected = code in _REJECTED_CODES or status == 413
        return PublishError(message, retryable=not rejected)
    if isinstance(exc, exceptions.ParamValidationError):
        return PublishError(f"PutMetricData rejected by botocore: {exc}", retryable=False)
    return PublishError(f"PutMetricData failed: {type(exc).__name__}: {exc}", retryable=True)


class BotoPublisher:
    """``put_metric_data`` on a boto3 client (built by a factory the caller passes)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        # The protocol botocore actually speaks: the model's first entry of ``protocols``
        # that this botocore supports (``resolved_protocol``), not the model's default
        # ``protocol`` (``smithy-rpc-v2-cbor`` for CloudWatch in botocore 1.4x, which sends
        # JSON). Older botocore without ``resolved_protocol`` speaks ``protocol``.
        model = client.meta.service_model
        self.protocol = str(getattr(model, "resolved_protocol", None) or model.protocol)

    def put(self, namespace: str, datums: Sequence[Datum]) -> None:
        try:
            self._client.put_metric_data(Namespace=namespace, MetricData=list(datums))
        except Exception as exc:
            raise _classify(exc) from exc


def datum_json(namespace: str, datum: Datum) -> str:
    """One datum as a JSON line: the request's shape, with the namespace and an ISO 8601
    timestamp, for ``--cloudwatch-dry-run``."""
    out: dict[str, Any] = {"Namespace": namespace}
    for key, value in datum.items():
        if isinstance(value, datetime):
            out[key] = value.strftime("%Y-%m-%dT%H:%M:%SZ")
        else:
            out[key] = value
    return json.dumps(out, separators=(",", ":"))


class DryRunPublisher:
    """Prints every datum it is given as a JSON line; never calls AWS, needs no
    credentials and no boto3."""

    protocol = "json"

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def put(self, namespace: str, datums: Sequence[Datum]) -> None:
        lines = "".join(datum_json(namespace, d) + "\n" for d in datums)
        try:
            self._out.write(lines)
            self._out.flush()
        except (OSError, ValueError) as exc:  # stdout closed or a broken pipe
            raise PublishError(f"cannot write datums: {exc}", retryable=False) from None
