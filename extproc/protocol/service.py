"""The ext_proc stream: one HTTP request from Envoy in, one decision out.

Envoy opens a stream per request and keeps it open until the downstream response (SSE
included) has finished. So the stream's lifetime is the request's lifetime: the pool counts a
request in flight from admission until this handler returns, which is exactly what "drain
before unload" needs.

A stream comes in one of two shapes, and both are served:

* two messages (Envoy Gateway, and the standalone Envoy's bodyless or chunked requests): the
  headers, answered with CONTINUE or an answer of our own, then the buffered body;
* one message (the standalone Envoy's requests with a body, ``request_header_mode: SKIP``): the
  buffered body alone, with the head (method, path, request id, our client headers) in its
  ``attributes`` (``request.ATTRIBUTES``): one message each way instead of two.

The decision always rides on the body's answer (``answers.route`` works for both shapes),
except for an endpoint picker in full duplex mode, where it rides on the held headers'
(``picker.py``, which also tells the body modes an InferencePool's gateway may choose).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from google.protobuf.message import DecodeError

from .. import metrics
from ..logs import Throttled, get_logger
from ..policy.events import Admit, Divert, Reject
from ..runtime.driver import Ticket
from ..runtime.hub import Hub, Route
from ..settings import Settings
from . import answers, picker, stream
from .jsonscan import run_async
from .request import BadRequest, RequestHead, activation, max_wait, model_scan, priority
from .trust import granted

log = get_logger(__name__)

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
_MODELS_PATH = "/v1/models"

# A member admitted as Ready whose Ready pods the pod watch has not delivered yet (two
# watches, no order between them) gets this long for them before the 503 no_endpoint.
_ENDPOINT_WAIT = 5.0
# Open streams of every service in the process, read by the gauge when scraped: a gauge's
# inc/dec takes a lock twice per request (5 % of the loop's time in a burst of 10,000).
_open_streams = 0
metrics.STREAMS_IN_FLIGHT.set_function(lambda: _open_streams)


_malformed = Throttled(log, "undecodable ext_proc message")
_silent = Throttled(log, "ext_proc stream ended: its first message never came")


def _request_id_header(head: RequestHead) -> tuple[tuple[str, str], ...]:
    """Envoy's x-request-id, echoed on answers we give ourselves so client and our logs join."""
    return (("x-request-id", head.request_id),) if head.request_id else ()


class ExtProcService:
    """Implements ExternalProcessor/Process on top of the Hub."""

    def __init__(self, hub: Hub, settings: Settings) -> None:
        self._hub = hub
        self._settings = settings
        self._header = settings.route_header
        self._template = settings.route_template
        self._route_values: dict[tuple[Any, str], str] = {}
        self._outcomes: dict[tuple[str, str, str], Any] = {}
        self._picker = picker.EndpointPicker(hub.endpoints) if settings.endpoint_picker \
            else None
        self.open_streams = 0  # this service's (the gauge counts the whole process's)
        # one service per process: its budget is the process's
        self._budget = stream.BodyBudget(settings.body_bytes_in_flight)

    def handler(self) -> grpc.GenericRpcHandler:
        """The gRPC generic handler; messages in are parsed with upb, out are raw bytes."""
        method = grpc.stream_stream_rpc_method_handler(
            self.process, request_deserializer=ep.ProcessingRequest.FromString,
            response_serializer=None)
        return grpc.method_handlers_generic_handler(SERVICE, {"Process": method})

    async def process(self, _requests: Any, context: grpc.aio.ServicerContext) -> None:
        """Handle one request's stream from its headers to its end."""
        global _open_streams
        _open_streams += 1
        self.open_streams += 1
        ticket: Ticket | None = None
        route: Route | None = None
        hold = self._budget.hold()
        try:
            opened = await stream.read_opening(context, self._picker is not None,
                                               self._settings.first_message_timeout)
            if opened is None:
                return
            head, end_of_stream, first = opened
            del opened  # a parked stream keeps only what it still needs
            early = self._decide_on_headers(head, end_of_stream and first is None)
            if early is None and first is None and head.streamed and self._picker is not None:
                early = self._streamed_too_large(head)
            if early is not None:
                await context.write(early)
                return await stream.until_closed(context)
            if first is None and not head.duplex_request:
                await context.write(answers.CONTINUE_HEADERS if self._picker is None
                                    else picker.STRIP_HEADERS)
            try:
                body = await stream.read_body(context, head, self._settings.max_body_bytes,
                                              self._picker is not None, hold, first,
                                              end_of_stream)
                del first
            except BadRequest as exc:
                hold.release()  # the body is dropped; the stream may stay open long after
                await context.write(self._refuse(head, exc))
                return await stream.until_closed(context)
            if body is None:
                return
            started = time.perf_counter()
            if self._settings.log_bodies:
                log.debug("request body", request_id=head.request_id,
                          body=body[:4096].decode("utf-8", "replace"))
            try:
                model = await run_async(model_scan(head, body, self._settings.max_body_bytes))
                patience = max_wait(head)
                asks = activation(head)
                rank = priority(head) if self._settings.client_priority != "ignore" else None
            except BadRequest as exc:
                hold.release()  # the body is dropped; the stream may stay open long after
                await context.write(self._refuse(head, exc))
                return await stream.until_closed(context)
            # A parked stream should not pin its body (10,000 may be parked), unless Envoy
            # forwards only what we hand back (full duplex).
            kept = body if head.duplex_request else b""
            del body
            hold.release()
            route = self._hub.resolve(model)
            if route is None:  # (awaited only off the hot path: a replica just started)
                try:
                    route = await self._hub.resolve_synced(
                        model, min(patience, self._settings.swap_budget))
                except TimeoutError:
                    await context.write(self._error(
                        head, 503, "pools_not_synced", "this replica has not yet read the "
                        "pools from its source; retry", None, (("retry-after", "1"),)))
                    return await stream.until_closed(context, head)
            if route is None:
                await context.write(self._unrouted(head, model))
                return await stream.until_closed(context, head)
            objective, rank = granted(self._settings.client_priority, head.objective, rank,
                                      route.driver.spec.priorities)
            ticket = route.driver.arrive(route.member, patience, asks, objective, rank)
            if ticket.waiter is not None:
                if not await self._park(context, ticket, route, head):
                    return  # the client left while held
                started = time.perf_counter()
            for message in await self._answer(ticket, route, head, kept):
                await context.write(message)
            metrics.DECISION_SECONDS.observe(time.perf_counter() - started)
            await stream.until_closed(context, head)
        except asyncio.CancelledError:
            raise  # Envoy reset the stream (client gone); `finally` does the accounting
        except stream.Silent as exc:
            _silent.warning(error=str(exc))
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        except DecodeError as exc:
            # Garbage from a peer is the peer's problem: counted, and one line at most every
            # 10 s saying how many were held back (a flood must not flood the log).
            metrics.MALFORMED.inc()
            _malformed.warning(error=str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed ProcessingRequest")
        except Exception:
            log.error("ext_proc stream failed", exc_info=True)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error")
        finally:
            hold.release()
            if ticket is not None and route is not None:
                route.driver.end(ticket)
            _open_streams -= 1
            self.open_streams -= 1

    # ---- the steps -------------------------------------------------------------------------

    def _decide_on_headers(self, head: RequestHead, end_of_stream: bool) -> bytes | None:
        """Answer what can be answered from the headers alone, else None."""
        path = head.path.split("?", 1)[0]
        if path == _MODELS_PATH or path.startswith(_MODELS_PATH + "/"):
            if head.method not in ("GET", "HEAD"):
                return self._error(head, 405, "method_not_allowed",
                                   f"{head.method} is not allowed on {path}; use GET",
                                   headers=(("allow", "GET"),))
            return self._models_answer(head, path)
        if not path.startswith("/v1/"):
            return self._error(head, 404, "unknown_path",
                               f"no route for {path!r}: this endpoint serves the OpenAI API "
                               "under /v1/")
        if head.method != "POST":
            return self._error(head, 405, "method_not_allowed",
                               f"{head.method} is not allowed on {path}; use POST",
                               headers=(("allow", "POST"),))
        if end_of_stream:
            return self._error(head, 400, "missing_body",
                               "request body is empty; it must name a model", "model")
        return None

    def _streamed_too_large(self, head: RequestHead) -> bytes | None:
        """Endpoint picker, STREAMED: the 413 for a body Envoy cannot hold whole, else None.

        Envoy sends a STREAMED body only after the headers are answered, and passes the
        headers on to its router with that answer unless the whole body is already in its
        buffer (it then sends it in one message, whose answer can still name the pod). A
        larger body would meet a router with no destination (503 no healthy upstream)."""
        limit = self._settings.streamed_body_limit
        if head.content_length <= limit:
            return None
        return self._refuse(head, BadRequest(
            413, "streamed_body_too_large", f"request body is {head.content_length} bytes; "
            f"with STREAMED request bodies the endpoint picker routes at most {limit} (the "
            "gateway's buffer holds no more before it must route): configure the gateway's "
            "ext_proc filter FULL_DUPLEX_STREAMED or BUFFERED"))

    async def _park(self, context: grpc.aio.ServicerContext, ticket: Ticket, route: Route,
                    head: RequestHead) -> bool:
        """Wait for the held request's decision; False if the client left meanwhile."""
        assert ticket.waiter is not None
        if self._settings.park_timeout_override:
            await context.write(answers.override_timeout(
                max(1.0, ticket.deadline - time.monotonic()) + self._settings.park_margin))
        log.debug("request held", namespace=route.driver.key.namespace,
                  pool=route.driver.key.name, member=route.member, request_id=head.request_id)
        # The client leaving makes Envoy reset the stream, which ends the RPC: its done
        # callback resolves the waiter with None. No pending read (a task and a coroutine
        # per stream, ~1.5 KB each with 10,000 parked) and no asyncio.wait.
        waiter = ticket.waiter
        context.add_done_callback(lambda _: waiter.done() or waiter.set_result(None))
        if await waiter is not None:
            return True
        log.debug("held request abandoned by its client", namespace=route.driver.key.namespace,
                  pool=route.driver.key.name, member=route.member, request_id=head.request_id)
        return False

    async def _answer(self, ticket: Ticket, route: Route, head: RequestHead,
                      kept: bytes) -> list[bytes]:
        decision = ticket.decision
        key = route.driver.key
        if isinstance(decision, Admit):
            self._count(key.namespace, key.name, "held_admitted" if decision.held_for
                        else "admitted")
            value = self._route_value(key, route.member)
            if decision.held_for:
                log.debug("held request released", namespace=key.namespace, pool=key.name,
                         member=route.member, request_id=head.request_id,
                         held_s=round(decision.held_for, 3), swap=decision.swap)
            if self._picker is not None:
                return await self._pick(route, head, kept)
            value = self._route_value(key, route.member)
            if decision.held_for:
                return [answers.released(self._header, value, decision.held_for, decision.swap)]
            return [answers.route(self._header, value)]
        if isinstance(decision, Divert) and self._picker is None:
            self._count(key.namespace, key.name, "fallback")
            log.info("request sent to its fallback", namespace=key.namespace, pool=key.name,
                     member=route.member, request_id=head.request_id, fallback=decision.to,
                     reason=decision.reason)
            return [answers.route(self._header, decision.to, fallback=True)]
        if isinstance(decision, Divert):
            # An endpoint picker can only name pods of its InferencePool, and a fallback is
            # none of them: the request is answered as if the pool named no fallback.
            decision = Reject(decision.rid, 503, "pool_incumbent_busy",
                              f"{route.member!r} is not resident and the incumbent is busy; "
                              f"its fallback {decision.to!r} is outside the InferencePool",
                              retry_after=1)
        assert isinstance(decision, Reject)
        self._count(key.namespace, key.name, decision.code)
        log.info("request refused", namespace=key.namespace, pool=key.name,
                 member=route.member, request_id=head.request_id, status=decision.status,
                 code=decision.code)
        said = ((answers.PREDICTED_WAIT_HEADER,
                 f"{route.driver.predicted_wait(route.member):.1f}"),) \
            if decision.status == 503 else ()
        return [self._error(head, decision.status, decision.code, decision.message, "model",
                            ((("retry-after", str(decision.retry_after)),)
                             if decision.retry_after else ()) + said)]

    async def _pick(self, route: Route, head: RequestHead, kept: bytes) -> list[bytes]:
        """Endpoint picker: name a Ready pod of the admitted member, or 503 when none fits."""
        assert self._picker is not None
        key = route.driver.key
        endpoint = self._picker.pick(key, route.member, head.allowed)
        if endpoint is None and not self._hub.endpoints(key, route.member):
            await self._hub.endpoints_change(key, route.member, _ENDPOINT_WAIT)
            endpoint = self._picker.pick(key, route.member, head.allowed)
        if endpoint is None:
            self._count(key.namespace, key.name, "no_endpoint")
            allowed = "" if head.allowed is None else " among the proxy's subset hint"
            log.info("no eligible endpoint", namespace=key.namespace, pool=key.name,
                     member=route.member, request_id=head.request_id,
                     hinted=head.allowed is not None)
            return [self._error(head, 503, "no_endpoint", f"no Ready pod of {route.member!r}"
                                f"{allowed}", "model", (("retry-after", "1"),))]
        head.picked, head.picked_for = endpoint, (key.namespace, key.name, route.member)
        return self._forward(head, endpoint, kept)

    @staticmethod
    def _forward(head: RequestHead, endpoint: str, kept: bytes) -> list[bytes]:
        """Endpoint picker: the answers that send the request on to ``endpoint``."""
        if head.duplex_request:
            messages = [picker.route_headers(endpoint), picker.streamed_body(kept, True)]
        else:
            messages = [picker.route_body(endpoint)]
        if head.trailers:
            messages.append(picker.CONTINUE_REQUEST_TRAILERS)
        return messages

    def _unrouted(self, head: RequestHead, model: str) -> bytes:
        pools = self._hub.ambiguity(model)
        if pools:
            return self._refuse(head, BadRequest(
                400, "model_ambiguous", f"model {model!r} is served by several pools "
                f"({', '.join(pools)}); ask the operator for a unique alias", "model"))
        if self._settings.passthrough_unknown:  # (never with the picker: settings refuse it)
            self._count("", "", "passthrough")
            return answers.CONTINUE_BODY
        # The error names no other model: it reaches whoever sent the request, and its text
        # ends up in client logs and screens (the models of every namespace otherwise).
        return self._refuse(head, BadRequest(
            404, "model_not_found", f"model {model!r} does not exist; GET {_MODELS_PATH} "
            "lists the models", "model"))

    def _refuse(self, head: RequestHead, exc: BadRequest) -> bytes:
        # The path without its query: query strings can carry API keys.
        log.info("request refused", request_id=head.request_id, status=exc.status,
                 code=exc.code, path=head.path.split("?", 1)[0])
        return self._error(head, exc.status, exc.code, exc.message, exc.param, exc.headers)

    def _models_answer(self, head: RequestHead, path: str) -> bytes:
        now = int(time.time())
        entries = [{"id": m.id, "object": "model", "created": now,
                    "owned_by": f"{m.namespace}/{m.pool}", "member": m.member}
                   for m in self._hub.models]
        if path == _MODELS_PATH:
            document: dict[str, Any] = {"object": "list", "data": entries}
        else:
            wanted = path[len(_MODELS_PATH) + 1:]
            match = next((e for e in entries if e["id"] == wanted), None)
            if match is None:
                return self._error(head, 404, "model_not_found",
                                   f"model {wanted!r} does not exist", "model")
            document = match
        return answers.immediate(200, json.dumps(document).encode(), "modelpool_models",
                                 _request_id_header(head))

    # ---- helpers ---------------------------------------------------------------------------

    def _error(self, head: RequestHead, status: int, code: str, message: str,
               param: str | None = None, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
        metrics.ERRORS.labels(code, str(status)).inc()
        return answers.error(status, code, message, param, headers + _request_id_header(head))

    def _route_value(self, key: Any, member: str) -> str:
        value = self._route_values.get((key, member))
        if value is None:
            value = self._template.format(member=member, pool=key.name,
                                          namespace=key.namespace)
            self._route_values[(key, member)] = value
        return value

    def _count(self, namespace: str, pool: str, outcome: str) -> None:
        child = self._outcomes.get((namespace, pool, outcome))
        if child is None:
            child = metrics.REQUESTS.labels(namespace, pool, outcome)
            self._outcomes[(namespace, pool, outcome)] = child
        child.inc()
