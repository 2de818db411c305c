"""The mutual challenge-response: each side proves the secret over the other side's nonce."""

import hmac
import os

from hypothesis import given, settings, strategies as st

from rasd.core import auth

SECRET = b"job secret"
NC, NA = b"c" * 16, b"a" * 16


def test_both_proofs_verify_with_the_same_secret():
    assert auth.verify(auth.acceptor_mac(SECRET, NC, NA), auth.acceptor_mac(SECRET, NC, NA))
    assert auth.verify(auth.connector_mac(SECRET, NC, NA), auth.connector_mac(SECRET, NC, NA))
    assert len(auth.acceptor_mac(SECRET, NC, NA)) == 32


def test_another_secret_gives_other_proofs():
    assert not auth.verify(auth.acceptor_mac(SECRET, NC, NA), auth.acceptor_mac(b"other job", NC, NA))
    assert not auth.verify(auth.connector_mac(SECRET, NC, NA), auth.connector_mac(b"other job", NC, NA))


def test_a_reflected_proof_does_not_pass():
    """The two roles are labelled: the acceptor's proof is never a valid connector proof over the same nonces."""
    assert auth.acceptor_mac(SECRET, NC, NA) != auth.connector_mac(SECRET, NC, NA)
    # Even with the nonces swapped (a connector that echoes the acceptor's nonce as its own).
    assert auth.acceptor_mac(SECRET, NA, NC) != auth.connector_mac(SECRET, NC, NA)
    assert auth.acceptor_mac(SECRET, NC, NA) != auth.connector_mac(SECRET, NA, NC)


def test_a_replayed_proof_for_another_nonce_does_not_pass():
    old = auth.connector_mac(SECRET, NC, b"o" * 16)
    assert not auth.verify(auth.connector_mac(SECRET, NC, NA), old)
    old = auth.acceptor_mac(SECRET, b"o" * 16, NA)
    assert not auth.verify(auth.acceptor_mac(SECRET, NC, NA), old)


def test_verify_rejects_other_lengths_and_empty():
    good = auth.connector_mac(SECRET, NC, NA)
    assert not auth.verify(good, good[:-1])
    assert not auth.verify(good, b"")
    assert not auth.verify(good, good + b"\x00")


def test_the_proof_is_hmac_sha256_and_the_secret_never_appears():
    mac = auth.connector_mac(SECRET, NC, NA)
    assert mac == hmac.new(SECRET, auth.CONNECTOR_LABEL + NA + NC, "sha256").digest()
    assert SECRET not in mac


@settings(max_examples=100, deadline=None)
@given(
    secret=st.binary(min_size=1, max_size=64),
    other=st.binary(min_size=1, max_size=64),
    nc=st.binary(min_size=16, max_size=16),
    na=st.binary(min_size=16, max_size=16),
)
def test_only_the_same_secret_and_nonces_verify(secret, other, nc, na):
    expected = auth.connector_mac(secret, nc, na)
    assert auth.verify(expected, auth.connector_mac(secret, nc, na))
    if hmac.new(secret, b"", "sha256").digest() != hmac.new(other, b"", "sha256").digest():
        assert not auth.verify(expected, auth.connector_mac(other, nc, na))
    if nc != na:
        assert not auth.verify(expected, auth.connector_mac(secret, na, nc))
    assert not auth.verify(auth.acceptor_mac(secret, nc, na), expected)


def test_random_nonces_make_every_handshake_different():
    a, b = os.urandom(16), os.urandom(16)
    assert auth.connector_mac(SECRET, a, NA) != auth.connector_mac(SECRET, b, NA)
