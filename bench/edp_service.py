"""The codec baseline: the service's own stream logic, with envoy-data-plane message classes.

Everything but the codec is the shipped ``ExtProcService``: requests are parsed into
envoy-data-plane (betterproto2) ``ProcessingRequest`` objects, and every response is built
from envoy-data-plane classes and serialized per message, the way a service written on that
library would. Run as its own process: ``python -m bench.edp_service serve --pools-file F``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy_data_plane.envoy.config.core import v3 as edp_core
from envoy_data_plane.envoy.service.ext_proc import v3 as edp
from envoy_data_plane.google import protobuf as edp_pb

from extproc import app, cli
from extproc.protocol.answers import METADATA_KEY, METADATA_NAMESPACE
from extproc.protocol.service import SERVICE, ExtProcService

_OVERWRITE = edp_core.HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD


class _Request:
    """An envoy-data-plane request with the one upb method the service calls (HasField)."""

    __slots__ = ("_msg",)

    def __init__(self, msg: edp.ProcessingRequest) -> None:
        self._msg = msg

    def HasField(self, name: str) -> bool:  # noqa: N802 (the protobuf method name)
        """True when the oneof member ``name`` is set (betterproto2 leaves unset ones None)."""
        return getattr(self._msg, name) is not None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._msg, name)


def parse_request(data: bytes) -> _Request:
    """Decode one ProcessingRequest with envoy-data-plane."""
    return _Request(edp.ProcessingRequest.parse(data))


def _continue_headers() -> edp.ProcessingResponse:
    return edp.ProcessingResponse(
        request_headers=edp.HeadersResponse(response=edp.CommonResponse()))


def _route_builder(key: str, value: bytes) -> Callable[[], edp.ProcessingResponse]:
    def build() -> edp.ProcessingResponse:
        header = edp_core.HeaderValueOption(header=edp_core.HeaderValue(key=key, raw_value=value),
                                            append_action=_OVERWRITE)
        common = edp.CommonResponse(header_mutation=edp.HeaderMutation(set_headers=[header]),
                                    clear_route_cache=True)
        # the member in dynamic metadata too, as the service's answer (one-message routes)
        member = edp_pb.Struct(fields={METADATA_KEY: edp_pb.Value(
            string_value=value.decode("latin-1"))})
        return edp.ProcessingResponse(
            request_body=edp.BodyResponse(response=common),
            dynamic_metadata=edp_pb.Struct(fields={
                METADATA_NAMESPACE: edp_pb.Value(struct_value=member)}))
    return build


def _builder_for(wire: bytes) -> Callable[[], edp.ProcessingResponse]:
    """How to build, with envoy-data-plane classes, the response the service serialized."""
    shape = ep.ProcessingResponse.FromString(wire)
    kind = shape.WhichOneof("response")
    if kind == "request_headers" and shape.request_headers.response.ByteSize() == 0:
        return _continue_headers
    if kind == "request_body" and shape.request_body.response.clear_route_cache:
        option = shape.request_body.response.header_mutation.set_headers[0]
        return _route_builder(option.header.key, option.header.raw_value)
    # Refusals, parking timeouts: not on the measured resident-hit path; still decoded and
    # re-encoded by envoy-data-plane so no message skips the library.
    return lambda: edp.ProcessingResponse.parse(wire)


class EdpExtProcService(ExtProcService):
    """ExtProcService whose messages are decoded and encoded by envoy-data-plane."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._builders: dict[bytes, Callable[[], edp.ProcessingResponse]] = {}

    def handler(self) -> grpc.GenericRpcHandler:
        """The gRPC handler with envoy-data-plane (de)serializers."""
        method = grpc.stream_stream_rpc_method_handler(
            self.process, request_deserializer=parse_request,
            response_serializer=self._serialize)
        return grpc.method_handlers_generic_handler(SERVICE, {"Process": method})

    def _serialize(self, wire: bytes) -> bytes:
        # The service hands over its pre-serialized answer; the baseline builds the same
        # message afresh with envoy-data-plane classes and serializes that instead.
        builder = self._builders.get(wire)
        if builder is None:
            builder = self._builders[wire] = _builder_for(wire)
        return bytes(builder())


def main(argv: list[str] | None = None) -> int:
    """Same command line as ``python -m extproc``; the servicer is the baseline's."""
    # The app builds its servicer by this module-level name; swapping it in this process only
    # keeps every other part of the service (hub, pools, gRPC options) identical.
    app.ExtProcService = EdpExtProcService  # type: ignore[misc]
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
