"""A client of torch's TCPStore server in the standard library only: what the monitor process talks to the store with.

Why: the monitor process (``inprocess.monitor_process``) needs a client of the Wrapper's store, and torch's client
costs every rank's monitor an import of torch (seconds, and hundreds of MB of memory) for a few small messages. This
client speaks the same wire protocol to the same server (``inprocess.store_server``, a ``torch.distributed.TCPStore``
server, libuv or classic backend) and has the semantics of torch's ``Store`` for the operations ``StoreMixin``
uses. It is not a ``torch.distributed.Store``: the trainer keeps torch's client, which ``init_process_group`` needs.

The protocol (torch 2.13, ``c10d::detail::QueryType``), read from torch's sources and checked against its client on
the wire. Integers are in the host's byte order (both sides run on the same kind of machine, as torch assumes);
a *string* or a *value* is a ``uint64`` length and its bytes; a *list* is a ``uint64`` count and its items. The
client prefixes every key with ``/``, as torch's ``TCPStore`` does (``keyPrefix_``), so both clients name the
same keys. Requests are a one-byte query type and its arguments:

    VALIDATE     uint32 magic                                 no reply (the server drops a client that is wrong)
    PING         uint32 nonce                                 uint32 nonce, echoed
    SET          key, value                                   no reply
    GET          key                                          value (the client WAITs for the key first)
    ADD          key, int64 delta                             int64 new value (a missing key counts from 0)
    COMPARE_SET  key, expected value, desired value           value now stored (see ``compare_set``)
    CHECK        list of keys                                 uint8: 0 all exist, 1 not all
    WAIT         list of keys                                 uint8 0 (STOP_WAITING) once all exist
    CANCEL_WAIT  (nothing)                                    uint8 1 (WAIT_CANCELED), after a STOP_WAITING if
                                                              the keys arrived meanwhile
    DELETE_KEY   key                                          int64 number of keys deleted
    APPEND       key, value                                   no reply
    MULTI_GET    list of keys                                 one value per key (after a WAIT for all of them)
    MULTI_SET    uint64 count, then key, value per pair       no reply

A connection opens with VALIDATE then PING: a server that is not a TCPStore of this protocol does not echo the
nonce, and ``TCPStoreClient`` raises ``HandshakeError`` (the monitor then falls back to torch's client).
"""

from __future__ import annotations

import datetime
import enum
import os
import select
import socket
import struct
import threading
from collections.abc import Iterable

from .store_mixin import StoreTimeoutError

VALIDATION_MAGIC = 0x3C85F7CE
KEY_PREFIX = "/"
#: How long the opening hand-shake may take at most, whatever the client's timeout: a server that does not answer a
#: PING this fast is not one this client can use.
HANDSHAKE_TIMEOUT = 10.0


class Query(enum.IntEnum):
    """Query types, the first byte of a request (``c10d::detail::QueryType``, in torch 2.13's order)."""

    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13


CHECK_READY = 0
WAIT_STOP_WAITING = 0
WAIT_CANCELED = 1

_U8 = struct.Struct("=B")
_U32 = struct.Struct("=I")
_U64 = struct.Struct("=Q")
_I64 = struct.Struct("=q")


class StoreError(RuntimeError):
    """The store server answered something unexpected, or the connection to it broke (torch: ``DistNetworkError``)."""


class HandshakeError(StoreError):
    """The server did not complete the opening VALIDATE/PING exchange: not a TCPStore this client can talk to."""


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _string(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


def _key(key: str) -> bytes:
    return _string((KEY_PREFIX + key).encode())


def _keys(keys: Iterable[str]) -> bytes:
    encoded = [_key(key) for key in keys]
    return _U64.pack(len(encoded)) + b"".join(encoded)


def _seconds(timeout: datetime.timedelta | float) -> float:
    return timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)


class TCPStoreClient:
    """One connection to a TCPStore server, with torch's ``Store`` semantics for the operations below.

    ``timeout`` bounds every reply, and ``get``/``multi_get``/``wait`` wait that long for missing keys, raising
    ``StoreTimeoutError`` as torch raises ``DistStoreError``. Operations are serialised by a lock, as torch's client
    serialises them: a request and its reply are never interleaved with another thread's.
    """

    def __init__(self, host: str, port: int, timeout: datetime.timedelta | float = 300.0) -> None:
        self.host = host
        self.port = port
        self._timeout = _seconds(timeout)
        self._lock = threading.Lock()
        handshake = min(self._timeout, HANDSHAKE_TIMEOUT)
        self._socket = socket.create_connection((host, port), timeout=handshake)
        try:
            self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._handshake(handshake)
        except BaseException:
            self._socket.close()
            raise
        self._socket.settimeout(self._timeout)

    def _handshake(self, timeout: float) -> None:
        nonce = os.getpid() & 0xFFFFFFFF
        self._socket.sendall(
            _U8.pack(Query.VALIDATE) + _U32.pack(VALIDATION_MAGIC) + _U8.pack(Query.PING) + _U32.pack(nonce)
        )
        try:
            (echoed,) = _U32.unpack(self._receive(_U32.size))
        except (OSError, StoreError) as error:
            raise HandshakeError(f"no PING reply from {self.host}:{self.port} within {timeout} s: {error}") from error
        if echoed != nonce:
            raise HandshakeError(f"{self.host}:{self.port} echoed PING nonce {echoed}, expected {nonce}")

    # ---- wire -----------------------------------------------------------------------------------------------------

    def _receive(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self._socket.recv(size - len(data))
            if not chunk:
                raise StoreError(f"the store server {self.host}:{self.port} closed the connection")
            data += chunk
        return data

    def _request(self, query: Query, payload: bytes = b"") -> None:
        try:
            self._socket.sendall(_U8.pack(query) + payload)
        except OSError as error:
            raise StoreError(f"cannot send to the store server {self.host}:{self.port}: {error}") from error

    def _reply(self, size: int) -> bytes:
        try:
            return self._receive(size)
        except OSError as error:  # socket.timeout included: no reply within the client's timeout
            # A reply may have been read in part: the connection cannot be trusted to be in step any more.
            self._socket.close()
            raise StoreError(f"no reply from the store server {self.host}:{self.port}: {error}") from error

    def _reply_value(self) -> bytes:
        (size,) = _U64.unpack(self._reply(_U64.size))
        return self._reply(size)

    def _wait(self, keys: list[str], timeout: float) -> None:
        """WAIT for ``keys``; on timeout CANCEL_WAIT, consume the server's answers, raise ``StoreTimeoutError``.

        The cancel must be answered before the connection is used again: the server may have sent STOP_WAITING
        just before it saw the cancel (the keys arrived at the last moment), and then sends WAIT_CANCELED as well.
        Like torch, the wait still counts as timed out then.
        """
        self._request(Query.WAIT, _keys(keys))
        ready, _, _ = select.select([self._socket], [], [], max(0.0, timeout))
        if ready:
            (response,) = _U8.unpack(self._reply(1))
            if response != WAIT_STOP_WAITING:
                raise StoreError(f"WAIT: expected STOP_WAITING, got {response}")
            return
        self._request(Query.CANCEL_WAIT)
        (response,) = _U8.unpack(self._reply(1))
        if response == WAIT_STOP_WAITING:
            (response,) = _U8.unpack(self._reply(1))
        if response != WAIT_CANCELED:
            raise StoreError(f"CANCEL_WAIT: expected WAIT_CANCELED, got {response}")
        shown = ", ".join(KEY_PREFIX + key for key in keys)
        raise StoreTimeoutError(f"wait timeout after {round(timeout * 1000)}ms, keys: {shown}")

    # ---- torch's Store operations ---------------------------------------------------------------------------------

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self._timeout)

    def set(self, key: str, value: str | bytes) -> None:
        with self._lock:
            self._request(Query.SET, _key(key) + _string(_as_bytes(value)))

    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting for it up to the client's timeout (``StoreTimeoutError``)."""
        with self._lock:
            self._wait([key], self._timeout)
            self._request(Query.GET, _key(key))
            return self._reply_value()

    def add(self, key: str, value: int) -> int:
        with self._lock:
            self._request(Query.ADD, _key(key) + _I64.pack(value))
            (result,) = _I64.unpack(self._reply(_I64.size))
            return result

    def check(self, keys: list[str]) -> bool:
        with self._lock:
            self._request(Query.CHECK, _keys(keys))
            (response,) = _U8.unpack(self._reply(1))
            return response == CHECK_READY

    def wait(self, keys: list[str], timeout: datetime.timedelta | float | None = None) -> None:
        """Block until every key exists; ``StoreTimeoutError`` after ``timeout`` (the client's if None)."""
        with self._lock:
            self._wait(list(keys), self._timeout if timeout is None else _seconds(timeout))

    def compare_set(self, key: str, expected_value: str | bytes, desired_value: str | bytes) -> bytes:
        """Store ``desired_value`` if the value is ``expected_value``; return the value stored now.

        torch's server semantics, kept: a missing key with an empty ``expected_value`` is created; a missing key
        with any other ``expected_value`` is left missing and ``expected_value`` is returned.
        """
        payload = _key(key) + _string(_as_bytes(expected_value)) + _string(_as_bytes(desired_value))
        with self._lock:
            self._request(Query.COMPARE_SET, payload)
            return self._reply_value()

    def append(self, key: str, value: str | bytes) -> None:
        with self._lock:
            self._request(Query.APPEND, _key(key) + _string(_as_bytes(value)))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """The values of ``keys``, waiting for all of them up to the client's timeout, as ``get`` does."""
        keys = list(keys)
        with self._lock:
            self._wait(keys, self._timeout)
            self._request(Query.MULTI_GET, _keys(keys))
            return [self._reply_value() for _ in keys]

    def multi_set(self, keys: list[str], values: list[str] | list[bytes]) -> None:
        encoded = [_as_bytes(value) for value in values]
        pairs = b"".join(_key(key) + _string(value) for key, value in zip(keys, encoded, strict=True))
        with self._lock:
            self._request(Query.MULTI_SET, _U64.pack(len(keys)) + pairs)

    def delete_key(self, key: str) -> bool:
        with self._lock:
            self._request(Query.DELETE_KEY, _key(key))
            (deleted,) = _I64.unpack(self._reply(_I64.size))
            return deleted == 1

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> TCPStoreClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
