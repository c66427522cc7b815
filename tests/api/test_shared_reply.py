"""`SharedReplyInterceptor`: one reply object returned by many calls is encoded once; another
object, even an equal one, is encoded for itself; only the named methods are affected."""

from __future__ import annotations

from typing import Any

import grpc

from gpufair.api.interceptors import SharedReplyInterceptor


class Counted:
    def __init__(self, body: bytes) -> None:
        self.body = body
        self.encoded = 0

    def SerializeToString(self) -> bytes:  # noqa: N802 (protobuf's name)
        self.encoded += 1
        return self.body


class Details(grpc.HandlerCallDetails):
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


def serializer(interceptor: SharedReplyInterceptor, method: str) -> Any:
    inner = grpc.unary_unary_rpc_method_handler(
        lambda request, context: None, response_serializer=lambda m: m.SerializeToString()
    )
    return interceptor.intercept_service(lambda details: inner, Details(method)).response_serializer


def test_a_shared_reply_is_encoded_once_for_all_its_calls() -> None:
    interceptor = SharedReplyInterceptor(frozenset({"/s/Schedule"}), keep=2)
    encode = serializer(interceptor, "/s/Schedule")
    shared = Counted(b"cycle 7")
    assert [encode(shared) for _ in range(100)] == [b"cycle 7"] * 100
    assert shared.encoded == 1
    other = Counted(b"cycle 7")  # equal content, another object: its own encoding
    assert encode(other) == b"cycle 7" and other.encoded == 1
    for i in range(2):  # past `keep` newer replies, the first is forgotten
        encode(Counted(b"x%d" % i))
    assert encode(shared) == b"cycle 7" and shared.encoded == 2


def test_other_methods_keep_their_serializer() -> None:
    interceptor = SharedReplyInterceptor(frozenset({"/s/Schedule"}))
    encode = serializer(interceptor, "/s/GetConfig")
    reply = Counted(b"config")
    encode(reply)
    encode(reply)
    assert reply.encoded == 2
