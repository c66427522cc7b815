"""`Layers` (api/interceptors.py): gpufair's interceptors run as one, the first outermost, each
method's composed handler built once however many calls it serves."""

from __future__ import annotations

from typing import Any

import grpc

from gpufair.api.interceptors import Layer, Layers


class Details:
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


class Tagging(Layer):
    """Wraps a unary handler so that its reply lists this layer's tag outside the inner ones."""

    def __init__(self, tag: str) -> None:
        super().__init__()
        self.tag = tag
        self.built: list[str] = []

    def wrap(self, method: str, inner: Any) -> Any:
        self.built.append(method)
        if inner is None:
            return None
        behavior = inner.unary_unary
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: [self.tag, *behavior(request, context)]
        )


def test_layers_compose_in_order_and_build_once_per_method() -> None:
    outer, inner = Tagging("outer"), Tagging("inner")
    layers = Layers([outer, inner])
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: ["servicer"])
    replies = [
        layers.intercept_service(lambda d: handler, Details(method)).unary_unary(None, None)
        for method in ["/s/A"] * 100 + ["/s/B"] * 50
    ]
    assert replies == [["outer", "inner", "servicer"]] * 150
    assert outer.built == inner.built == ["/s/A", "/s/B"]
    # The same reply as the two as separate interceptors, outer first.
    separate = outer.intercept_service(
        lambda d: inner.intercept_service(lambda d: handler, d), Details("/s/C")
    )
    assert separate.unary_unary(None, None) == ["outer", "inner", "servicer"]


def test_an_unknown_method_passes_through_as_none_and_is_not_kept() -> None:
    layer = Tagging("only")
    layers = Layers([layer])
    assert layers.intercept_service(lambda d: None, Details("/s/Missing")) is None
    assert layers.intercept_service(lambda d: None, Details("/s/Missing")) is None
    assert layer.built == ["/s/Missing", "/s/Missing"]  # tried again: a miss is not memoized
