"""The Wrapper's store on an etcd cluster: a job spread over many hosts survives the loss of any host.

Why etcd (docs/inprocess.md, "Where the store lives"). A job over many hosts needs a store that no host is
essential to: a replicated one. etcd (Raft, linearizable reads and writes, transactions, watches) is the proven
engine for this, the one torchrun's own etcd rendezvous uses; we build no consensus of our own. A 3-member cluster
(one member on each of 3 hosts) keeps serving when any one host is gone.

Client. ``etcd3gw`` (maintained by OpenStack, pure Python over ``requests``) talks to etcd's v3 JSON gateway,
which every etcd >= 3.4 serves on its client port; no gRPC stack is needed. We use its client for the session,
the URLs, API discovery and the mapping of HTTP errors, and send the v3 requests (range, txn, watch) ourselves,
because ``torch.distributed.Store``'s semantics need revisions and compare-and-swap on every operation.

``EtcdStore`` is a ``torch.distributed.Store`` (a Python subclass), so it also carries the wrapped function's own
``init_process_group``: ``call_wrapper.store`` is a namespace of it. torch's C++ side reaches ``set``, ``get``,
``add``, ``compare_set``, ``check``, ``wait``, ``delete_key`` and ``num_keys`` through its Python trampoline and
builds ``append``/``multi_get``/``multi_set`` from them.

Semantics, operation by operation (torch's TCPStore is the model):

    set / multi_set     put (one transaction for many keys)
    get                 wait for the key (the store timeout), then range
    add                 compare-and-swap on the key's mod revision, retried on conflict; the transaction also
                        writes a one-off token under the client's lease, so a retry after an ambiguous failure
                        (a timeout after the request was sent) finds its own earlier success and never adds twice
    append              compare-and-swap loop on the value (duplicates after an ambiguous failure are harmless
                        for the wrapper: every list it appends to is read as a set or by its last element)
    compare_set         as TCPStore: a missing key is created only when ``expected`` is empty; returns the value
    check / wait        one transaction of count-only ranges; ``wait`` then watches the first missing key from
                        the revision it read (no event is lost) in chunks of at most ``WATCH_CHUNK`` seconds
    delete_key, num_keys

Fail-over. ``endpoints`` lists the cluster's client URLs (``host:port``); members on this host come first. A
request that fails to connect, times out (``request_timeout``) or meets a member without a leader moves on to the
next member, until the store's ``timeout``. A member cut off from the others cannot serve linearizable requests,
so its clients move to a member of the majority.

Keys live under ``prefix`` (default ``/torchras/<job>``: torchrun's run id, else ``MASTER_ADDR:MASTER_PORT``), so
jobs sharing a cluster never mix; ``etcdctl del --prefix <prefix>`` clears a finished job.
"""

from __future__ import annotations

import base64
import datetime
import errno
import json
import os
import socket
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import torch.distributed

from . import logs
from .store_base import StoreMixin

log = logs.get_logger(__name__)

ENDPOINTS_ENVIRONMENT = "INPROCESS_ETCD_ENDPOINTS"
PREFIX_ENVIRONMENT = "INPROCESS_ETCD_PREFIX"
WATCH_CHUNK = 2.0  # seconds a watch waits before the key is read again (and a silent member is left)
TOKEN_TTL = 600  # seconds an add's token outlives it: the window in which a retry can recognise its own success
_RETRY_PAUSE = 0.05

Timeout = datetime.timedelta | float | None


class EtcdUnavailable(torch.distributed.DistNetworkError):
    """No member of the cluster answered within the store's timeout."""


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else bytes(data)).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text) if text else b""


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def _is_local(host: str) -> bool:
    """True if ``host`` is an address of this machine (binding to it works)."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    for family, kind, protocol, _, address in infos:
        with socket.socket(family, kind, protocol) as probe:
            try:
                probe.bind(address)
                return True
            except OSError as error:
                if error.errno != errno.EADDRNOTAVAIL:
                    return True
    return False


def parse_endpoints(endpoints: str | Sequence[str] | None) -> list[tuple[str, int]]:
    """``"h1:2379,h2:2379"`` or a list of ``host:port`` (``http://`` allowed) -> [(host, port)], local first."""
    if endpoints is None:
        endpoints = os.environ.get(ENDPOINTS_ENVIRONMENT, "")
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    parsed = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        item = item.split("://", 1)[-1].rstrip("/")
        host, colon, port = item.rpartition(":")
        if not colon or "]" in port:  # no port given (a bare IPv4 name, or "[v6]")
            host, port = item, ""
        parsed.append((host.strip("[]"), int(port) if port else 2379))
    if not parsed:
        raise ValueError(f"no etcd endpoints: pass endpoints= or set {ENDPOINTS_ENVIRONMENT}")
    return sorted(parsed, key=lambda endpoint: not _is_local(endpoint[0]))  # stable: the given order otherwise


def default_prefix() -> str:
    job = os.environ.get("TORCHELASTIC_RUN_ID")
    if not job:
        job = f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}"
    return f"/torchras/{job}"


class EtcdStore(StoreMixin, torch.distributed.Store):
    """A ``torch.distributed.Store`` on an etcd cluster, usable as the Wrapper's ``store_factory``.

    ``EtcdStore(endpoints="10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379")``; ``endpoints`` defaults to
    ``INPROCESS_ETCD_ENDPOINTS``, ``prefix`` to ``INPROCESS_ETCD_PREFIX`` or ``/torchras/<job>``. Extra keyword
    arguments that the Wrapper's other stores take (``host_name``, ``port``, ``world_size``...) are ignored, so
    ``store_kwargs`` written for ``TCPStore`` keep working.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str] | None = None,
        prefix: str | None = None,
        timeout: Timeout = datetime.timedelta(seconds=300),
        request_timeout: float = 2.0,
        **_ignored: Any,
    ) -> None:
        import etcd3gw

        super().__init__()
        self.endpoints = parse_endpoints(endpoints)
        self.prefix = (prefix or os.environ.get(PREFIX_ENVIRONMENT) or default_prefix()).rstrip("/")
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout or 300)
        self.set_timeout(datetime.timedelta(seconds=seconds))
        self.request_timeout = float(request_timeout)
        self._clients = [
            etcd3gw.Etcd3Client(host=host, port=port, timeout=self.request_timeout, api_path="/v3/")
            for host, port in self.endpoints
        ]
        self._current = 0
        self._lease: tuple[str, float] | None = None  # (id, monotonic expiry) of the lease add tokens live on
        self._request("/maintenance/status", {})  # fail now, not at the first operation, if no member answers

    # ---- identity ---------------------------------------------------------------------------------------------

    @property
    def ports(self) -> tuple[int, ...]:
        """The members' client ports (the gloo abort leaves connections to them alone)."""
        return tuple(sorted({port for _, port in self.endpoints}))

    def new_connection(self) -> EtcdStore:
        return EtcdStore(self._endpoint_list(), self.prefix, self.timeout, self.request_timeout)

    def connection_parameters(self) -> dict:
        return dict(
            kind="etcd",
            endpoints=self._endpoint_list(),
            prefix=self.prefix,
            timeout=self.timeout.total_seconds(),
            request_timeout=self.request_timeout,
        )

    @classmethod
    def from_connection_parameters(cls, parameters: dict) -> EtcdStore:
        return cls(
            parameters["endpoints"], parameters["prefix"], parameters["timeout"], parameters.get("request_timeout", 2.0)
        )

    def _endpoint_list(self) -> list[str]:
        return [f"{host}:{port}" for host, port in self.endpoints]

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    # ---- transport with fail-over -----------------------------------------------------------------------------

    def _request(self, path: str, body: dict, deadline: float | None = None) -> dict:
        """POST a v3 request to the current member; on failure to the next ones, until ``deadline``."""
        from etcd3gw import exceptions

        deadline = deadline if deadline is not None else time.monotonic() + self.timeout.total_seconds()
        last_error: BaseException | None = None
        while True:
            client = self._clients[self._current]
            try:
                return client.post(client.get_url(path), json=body)
            except (
                exceptions.ConnectionFailedError,
                exceptions.ConnectionTimeoutError,
                exceptions.InternalServerError,
            ) as error:
                last_error = error
            except exceptions.Etcd3Exception as error:  # e.g. "etcdserver: no leader" as another status
                if "leader" not in str(error) and "timed out" not in str(error):
                    raise torch.distributed.DistStoreError(f"etcd refused {path}: {error}") from error
                last_error = error
            log.debug("etcd member %s:%s failed (%s); trying the next one", *self.endpoints[self._current], last_error)
            self._current = (self._current + 1) % len(self._clients)
            if time.monotonic() >= deadline:
                raise EtcdUnavailable(f"no etcd member of {self._endpoint_list()} answered: {last_error}")
            if self._current == 0:
                time.sleep(_RETRY_PAUSE)  # a whole round failed: do not spin

    def _range(self, key: str) -> tuple[dict | None, int]:
        """(the key's kv or None, the store revision it was read at)."""
        reply = self._request("/kv/range", {"key": _b64(self._key(key))})
        kvs = reply.get("kvs") or []
        return (kvs[0] if kvs else None), int(reply["header"]["revision"])

    def _ranges(self, keys: Sequence[str]) -> list[dict | None]:
        """The kvs of ``keys`` (None where missing), read together in one transaction."""
        reply = self._txn([], [{"request_range": {"key": _b64(self._key(key))}} for key in keys])
        return [((item.get("response_range") or {}).get("kvs") or [None])[0] for item in reply.get("responses", [])]

    def _txn(self, compare: list, success: list, failure: Iterable = ()) -> dict:
        return self._request("/kv/txn", {"compare": compare, "success": success, "failure": list(failure)})

    def _put(self, key: str, value: bytes, lease: str | None = None) -> dict:
        request = {"key": _b64(self._key(key)), "value": _b64(value)}
        if lease is not None:
            request["lease"] = lease
        return {"request_put": request}

    def _token_lease(self) -> str:
        now = time.monotonic()
        if self._lease is None or self._lease[1] <= now:
            reply = self._request("/lease/grant", {"TTL": TOKEN_TTL})
            self._lease = (reply["ID"], now + TOKEN_TTL / 2)
        return self._lease[0]

    # ---- torch.distributed.Store ------------------------------------------------------------------------------

    def set(self, key: str, value: Any) -> None:
        self._request("/kv/put", {"key": _b64(self._key(key)), "value": _b64(_as_bytes(value))})

    def multi_set(self, keys: Sequence[str], values: Sequence[Any]) -> None:
        self._txn([], [self._put(key, _as_bytes(value)) for key, value in zip(keys, values, strict=True)])

    def get(self, key: str) -> bytes:
        kv, _ = self._range(key)
        if kv is not None:
            return _unb64(kv.get("value", ""))
        self.wait([key])  # torch's get waits for a missing key (up to the store's timeout)
        kv, _ = self._range(key)
        if kv is None:  # deleted between the wait and the read
            raise torch.distributed.DistStoreError(f"key {key!r} was deleted")
        return _unb64(kv.get("value", ""))

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        return [self.get(key) for key in keys]

    def add(self, key: str, amount: int) -> int:
        token = f"_inprocess_etcd_add/{uuid.uuid4().hex}"
        lease = self._token_lease()
        while True:
            kv, done = self._ranges([key, token])
            if done is not None:  # an earlier attempt of this very add succeeded, its answer was lost
                return int(_unb64(done["value"]))
            current = int(_unb64(kv.get("value", "")) or b"0") if kv is not None else 0
            result = current + int(amount)
            if kv is None:
                compare = [{"key": _b64(self._key(key)), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}]
            else:
                compare = [
                    {
                        "key": _b64(self._key(key)),
                        "result": "EQUAL",
                        "target": "MOD",
                        "mod_revision": kv["mod_revision"],
                    }
                ]
            reply = self._txn(
                compare, [self._put(key, str(result).encode()), self._put(token, str(result).encode(), lease)]
            )
            if reply.get("succeeded"):
                return result

    def append(self, key: str, value: Any) -> None:
        addition = _as_bytes(value)
        while True:
            kv, _ = self._range(key)
            if kv is None:
                compare = [{"key": _b64(self._key(key)), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}]
                new = addition
            else:
                compare = [
                    {
                        "key": _b64(self._key(key)),
                        "result": "EQUAL",
                        "target": "MOD",
                        "mod_revision": kv["mod_revision"],
                    }
                ]
                new = _unb64(kv.get("value", "")) + addition
            if self._txn(compare, [self._put(key, new)]).get("succeeded"):
                return

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        expected_bytes, desired_bytes = _as_bytes(expected), _as_bytes(desired)
        while True:
            kv, _ = self._range(key)
            if kv is None:
                if expected_bytes:
                    return expected_bytes  # torch's TCPStore answers so for a missing key
                compare = [{"key": _b64(self._key(key)), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}]
            else:
                current = _unb64(kv.get("value", ""))
                if current != expected_bytes:
                    return current
                compare = [
                    {
                        "key": _b64(self._key(key)),
                        "result": "EQUAL",
                        "target": "MOD",
                        "mod_revision": kv["mod_revision"],
                    }
                ]
            if self._txn(compare, [self._put(key, desired_bytes)]).get("succeeded"):
                return desired_bytes

    def _count(self, keys: Sequence[str]) -> tuple[list[bool], int]:
        """Which keys exist, and the revision of that one consistent read."""
        requests = [{"request_range": {"key": _b64(self._key(key)), "count_only": True}} for key in keys]
        reply = self._txn([], requests)
        present = [int(item.get("response_range", {}).get("count", 0)) > 0 for item in reply.get("responses", [])]
        return present, int(reply["header"]["revision"])

    def check(self, keys: Sequence[str]) -> bool:
        present, _ = self._count(list(keys))
        return all(present)

    def wait(self, keys: Sequence[str], timeout: Timeout = None) -> None:
        if timeout is None:
            timeout = self.timeout
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
        deadline = time.monotonic() + seconds
        keys = list(keys)
        while True:
            present, revision = self._count(keys)
            missing = [key for key, there in zip(keys, present, strict=True) if not there]
            if not missing:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise torch.distributed.DistStoreError(f"Wait timeout after {seconds:.3f} s for keys {missing}")
            self._watch(missing[0], revision + 1, min(left, WATCH_CHUNK))

    def _watch(self, key: str, start_revision: int, seconds: float) -> None:
        """Return when ``key`` changes at or after ``start_revision``, or after about ``seconds``."""
        import requests

        client = self._clients[self._current]
        create = {"create_request": {"key": _b64(self._key(key)), "start_revision": str(start_revision)}}
        try:
            response = client.session.post(
                client.get_url("/watch"), json=create, stream=True, timeout=(self.request_timeout, max(seconds, 0.05))
            )
        except requests.RequestException:
            time.sleep(min(seconds, _RETRY_PAUSE))  # the next read moves to another member if this one is gone
            return
        try:
            for line in response.iter_lines():
                if not line:
                    continue
                result = json.loads(line).get("result", {})
                if result.get("events") or result.get("canceled"):
                    return
        except (requests.RequestException, ValueError):
            return  # the chunk is over (read timeout) or the member went away: read the key again
        finally:
            response.close()

    def delete_key(self, key: str) -> bool:
        reply = self._request("/kv/deleterange", {"key": _b64(self._key(key))})
        return int(reply.get("deleted", 0)) > 0

    def num_keys(self) -> int:
        start = self._key("")
        end = start[:-1] + chr(ord(start[-1]) + 1)
        reply = self._request("/kv/range", {"key": _b64(start), "range_end": _b64(end), "count_only": True})
        return int(reply.get("count", 0))
