"""Mutual challenge-response on every mesh connection, keyed by the job's secret.

::

    connector                                   acceptor
      HELLO(magic, nc)             ------>
                                   <------      CHALLENGE(na, HMAC(secret, "acceptor" | nc | na))
      checks the acceptor's proof
      PROOF(HMAC(secret, "connector" | na | nc)) ---->
      CONNINIT(...)                ------>      checks the connector's proof, then reads CONNINIT

Each side proves it holds the secret over a nonce the *other* side chose, so neither a replayed handshake nor a
reflected one passes, and the secret itself never crosses the wire. A process of another job (another secret), a
port scanner or a stray client fails here and is dropped before it can say anything the node would act on.
"""

from __future__ import annotations

import hashlib
import hmac

ACCEPTOR_LABEL = b"torchras acceptor"
CONNECTOR_LABEL = b"torchras connector"


def acceptor_mac(secret: bytes, connector_nonce: bytes, acceptor_nonce: bytes) -> bytes:
    return hmac.new(secret, ACCEPTOR_LABEL + connector_nonce + acceptor_nonce, hashlib.sha256).digest()


def connector_mac(secret: bytes, connector_nonce: bytes, acceptor_nonce: bytes) -> bytes:
    return hmac.new(secret, CONNECTOR_LABEL + acceptor_nonce + connector_nonce, hashlib.sha256).digest()


def verify(expected: bytes, got: bytes) -> bool:
    return hmac.compare_digest(expected, got)
