"""`Layers` (api/interceptors.py): gpufair's interceptors run as one, the first outermost, each
method's composed handler built once however many calls it serves; and the metrics layer's
line per RPC (`RpcRecord`)."""

from __future__ import annotations

import json
import logging
from typing import Any

import grpc

from gpufair.api.interceptors import Layer, Layers, MetricsInterceptor, RpcRecord
from gpufair.cli.logs import TEXT_FORMAT, JsonFormatter, TextFormatter


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


class Request:
    request_id, pool = "r-1", "gpu"


def test_an_rpc_line_has_the_fields_and_text_of_one_logged_with_extra() -> None:
    """The metrics layer's line (`RpcRecord`) renders in both formats as the record that
    `logger.info(..., extra=...)` made before, apart from the time."""
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    rpc_log = logging.getLogger("gpufair.rpc")
    keep, level = Keep(), rpc_log.level
    rpc_log.addHandler(keep)
    rpc_log.setLevel(logging.INFO)
    try:
        handler = grpc.unary_unary_rpc_method_handler(lambda request, context: "reply")
        wrapped = Layers([MetricsInterceptor()]).intercept_service(
            lambda d: handler, Details("/gpufair.v1.Ledger/GetFairShare")
        )
        assert wrapped.unary_unary(Request(), None) == "reply"
    finally:
        rpc_log.removeHandler(keep)
        rpc_log.setLevel(level)
    [line] = seen
    assert isinstance(line, RpcRecord)
    fields = {"method": "GetFairShare", "code": "OK", "duration_s": line.duration_s}
    before = rpc_log.makeRecord(
        "gpufair.rpc", logging.INFO, "(unknown file)", 0, "%s %s %.1f ms",
        ("GetFairShare", "OK", line.duration_s * 1000), None, "(unknown function)",
        {**fields, "request_id": "r-1", "pool": "gpu"},
    )  # fmt: skip
    before.created, before.msecs = line.created, line.msecs
    as_json = [json.loads(JsonFormatter().format(r)) for r in (line, before)]
    assert as_json[0] == as_json[1]
    assert as_json[0]["request_id"] == "r-1" and as_json[0]["pool"] == "gpu"
    assert TextFormatter().format(line) == logging.Formatter(TEXT_FORMAT).format(before)
    assert line.getMessage().startswith("GetFairShare OK ")
