"""Optional TLS and mutual TLS on the gRPC listener, with certificates made at test time:
TLS clients are served and plaintext ones are not; with a client CA, only clients holding a
certificate it signed get in; Envoy reaches the ext_proc over mTLS end to end, and a failed
handshake fails safe (the 503 fallback, never a member)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

import aiohttp
import grpc
import pytest
import pytest_asyncio
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

import certs
from grpcprobe import answers_a_good_request, process_status
from relstack import POOLS, SERVING, settings_for

from devstack import envoyconf
from extproc.app import Service

pytestmark = pytest.mark.skipif(not certs.available(), reason="openssl CLI not installed")


class Pki:
    """A CA with server and client leaves, plus a rogue CA with its own client leaf."""

    def __init__(self, directory: Path) -> None:
        self.ca = certs.make_ca(directory, "ca")
        self.server = certs.make_leaf(directory, "server", self.ca, "serverAuth")
        self.client = certs.make_leaf(directory, "client", self.ca, "clientAuth")
        rogue_ca = certs.make_ca(directory, "rogue-ca")
        self.rogue_client = certs.make_leaf(directory, "rogue-client", rogue_ca, "clientAuth")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Certificates shared by this module's tests."""
    return Pki(tmp_path_factory.mktemp("pki"))


ServiceFactory = Callable[..., Awaitable[Service]]


@pytest_asyncio.fixture
async def tls_service(tmp_path: Path, pki: Pki) -> AsyncIterator[ServiceFactory]:
    """Start the service with TLS on its gRPC listener; ``mutual`` adds the client CA."""
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS)
    started: list[Service] = []

    async def start(mutual: bool = False, health_listen: str = "") -> Service:
        service = Service(settings_for(pools, tls_cert=str(pki.server.cert),
                                       tls_key=str(pki.server.key),
                                       tls_client_ca=str(pki.ca.cert) if mutual else "",
                                       health_listen=health_listen))
        await service.start()
        started.append(service)
        return service

    yield start
    for service in started:
        await service.stop()


async def health(port: int, credentials: grpc.ChannelCredentials | None) -> int:
    """Health status over TLS (or plaintext with None); raises AioRpcError if refused."""
    target = f"127.0.0.1:{port}"
    channel = grpc.aio.secure_channel(target, credentials) if credentials \
        else grpc.aio.insecure_channel(target)
    async with channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=3, wait_for_ready=False)
    return reply.status


def credentials(pki: Pki, client: certs.Pair | None = None) -> grpc.ChannelCredentials:
    """Client credentials trusting our CA, optionally presenting ``client``."""
    if client is None:
        return grpc.ssl_channel_credentials(root_certificates=pki.ca.cert.read_bytes())
    cert, key = client.read()
    return grpc.ssl_channel_credentials(root_certificates=pki.ca.cert.read_bytes(),
                                        private_key=key, certificate_chain=cert)


async def refused(port: int, creds: grpc.ChannelCredentials | None) -> bool:
    """True when the listener does not serve this client."""
    try:
        await health(port, creds)
    except grpc.aio.AioRpcError as exc:
        return exc.code() == grpc.StatusCode.UNAVAILABLE
    return False


async def test_tls_listener_serves_tls_clients_only(tls_service: ServiceFactory,
                                                    pki: Pki) -> None:
    service = await tls_service()
    assert await health(service.grpc_port, credentials(pki)) == SERVING
    assert await answers_a_good_request(service.grpc_port, credentials(pki))
    assert await refused(service.grpc_port, None)  # plaintext client
    # a client that does not trust the server's CA
    assert await refused(service.grpc_port, grpc.ssl_channel_credentials(
        root_certificates=pki.rogue_client.cert.read_bytes()))


async def test_mutual_tls_requires_a_certificate_from_the_client_ca(
        tls_service: ServiceFactory, pki: Pki) -> None:
    service = await tls_service(mutual=True)
    assert await health(service.grpc_port, credentials(pki, pki.client)) == SERVING
    assert await answers_a_good_request(service.grpc_port, credentials(pki, pki.client))
    assert await refused(service.grpc_port, credentials(pki))  # no client certificate
    assert await refused(service.grpc_port, credentials(pki, pki.rogue_client))
    assert await refused(service.grpc_port, None)


async def test_with_mutual_tls_the_kubelet_probes_a_plaintext_health_port(
        tls_service: ServiceFactory, pki: Pki) -> None:
    # The kubelet's gRPC probe has no certificate and speaks no TLS: it gets the same health
    # answers on a port of their own, and nothing else is served there.
    service = await tls_service(mutual=True, health_listen="127.0.0.1:0")
    assert service.health_port and service.health_port != service.grpc_port
    assert await health(service.health_port, None) == SERVING
    assert await refused(service.grpc_port, None)
    assert await process_status(service.health_port) == grpc.StatusCode.UNIMPLEMENTED
    await service.stop()  # NOT_SERVING on the way down, then the port closes
    assert await refused(service.health_port, None)


def install(files: dict[str, Path], folder: Path) -> None:
    """Put each source file at folder/name by rename, as a Secret volume update does."""
    for name, source in files.items():
        staged = folder / f".{name}.new"
        shutil.copyfile(source, staged)
        os.replace(staged, folder / name)


async def served_certificate(port: int, client: certs.Pair) -> bytes:
    """The DER certificate the listener presents to a new connection."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.load_cert_chain(client.cert, client.key)
    context.set_alpn_protocols(["h2"])
    _, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=context), 10)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return der


def der(pair: certs.Pair) -> bytes:
    """The DER bytes of a PEM certificate file."""
    return ssl.PEM_cert_to_DER_cert(pair.cert.read_text())


@pytest.mark.parametrize("grpc_server", ["native", "grpcio"])
async def test_rotated_certificate_and_client_ca_reach_new_connections(
        tmp_path: Path, pki: Pki, grpc_server: str) -> None:
    # cert-manager renews: the Secret volume's files are replaced under the running service.
    # New connections get the new certificate and are checked against the new client CA;
    # a connection made before the rotation keeps working.
    live = tmp_path / "live"
    live.mkdir()
    install({"tls.crt": pki.server.cert, "tls.key": pki.server.key, "ca.crt": pki.ca.cert},
            live)
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS)
    service = Service(settings_for(pools, tls_cert=str(live / "tls.crt"),
                                   tls_key=str(live / "tls.key"),
                                   tls_client_ca=str(live / "ca.crt"), grpc_server=grpc_server))
    await service.start()
    target = f"127.0.0.1:{service.grpc_port}"
    try:
        async with grpc.aio.secure_channel(target, credentials(pki, pki.client)) as before:
            stub = health_pb2_grpc.HealthStub(before)
            assert (await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)).status \
                == SERVING
            assert await served_certificate(service.grpc_port, pki.client) == der(pki.server)

            (tmp_path / "renewed").mkdir()
            renewed = Pki(tmp_path / "renewed")
            install({"tls.crt": renewed.server.cert, "tls.key": renewed.server.key,
                     "ca.crt": renewed.ca.cert}, live)
            assert await served_certificate(service.grpc_port, renewed.client) \
                == der(renewed.server)
            assert await health(service.grpc_port, credentials(renewed, renewed.client)) \
                == SERVING
            # the old client certificate is no longer signed by the client CA
            assert await refused(service.grpc_port, credentials(renewed, pki.client))
            # the connection made before the rotation goes on
            assert (await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)).status \
                == SERVING
    finally:
        await service.stop()


async def test_a_half_written_rotation_keeps_the_previous_certificate(
        tmp_path: Path, pki: Pki) -> None:
    # The certificate lands before its key: the handshake keeps the old pair, then takes the
    # new one as soon as both are in place.
    live = tmp_path / "live"
    live.mkdir()
    install({"tls.crt": pki.server.cert, "tls.key": pki.server.key}, live)
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS)
    service = Service(settings_for(pools, tls_cert=str(live / "tls.crt"),
                                   tls_key=str(live / "tls.key")))
    await service.start()
    try:
        (tmp_path / "renewed").mkdir()
        renewed = Pki(tmp_path / "renewed")
        install({"tls.crt": renewed.server.cert}, live)
        assert await served_certificate(service.grpc_port, pki.client) == der(pki.server)
        install({"tls.key": renewed.server.key}, live)
        assert await served_certificate(service.grpc_port, pki.client) == der(renewed.server)
    finally:
        await service.stop()


def tls_template(directory: Path, pki: Pki, client: certs.Pair | None) -> Path:
    """envoy/envoy.yaml with TLS (and a client certificate if given) to the ext_proc."""
    config = envoyconf.load_template()
    cluster = next(c for c in config["static_resources"]["clusters"]
                   if c["name"] == envoyconf.EXTPROC_CLUSTER)
    common: dict = {
        "alpn_protocols": ["h2"],
        "validation_context": {
            "trusted_ca": {"filename": str(pki.ca.cert)},
            "match_typed_subject_alt_names": [{"san_type": "DNS",
                                               "matcher": {"exact": "localhost"}}]}}
    if client is not None:
        common["tls_certificates"] = [{"certificate_chain": {"filename": str(client.cert)},
                                       "private_key": {"filename": str(client.key)}}]
    cluster["transport_socket"] = {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."
                     "UpstreamTlsContext",
            "sni": "localhost", "common_tls_context": common}}
    path = directory / f"envoy-tls-{'mutual' if client else 'server'}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.mark.envoy
@pytest.mark.parametrize("with_client_cert", [True, False], ids=["client-cert", "no-client-cert"])
async def test_envoy_to_extproc_over_mutual_tls(tls_service: ServiceFactory, pki: Pki,
                                                envoy_factory, upstreams, tmp_path: Path,
                                                with_client_cert: bool) -> None:
    service = await tls_service(mutual=True)
    template = tls_template(tmp_path, pki, pki.client if with_client_cert else None)
    envoy = envoy_factory(service.grpc_port, {f"{n}.demo": h.port for n, h in upstreams.items()},
                          template=template)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{envoy.url}/v1/chat/completions", json={
                "model": "coder", "messages": [{"role": "user", "content": "hi"}]}) as resp:
            status, headers, body = resp.status, resp.headers, await resp.read()
    if with_client_cert:
        assert status == 200 and headers["x-served-by"] == "coder"
    else:
        # The handshake fails, Envoy fails open onto the no-routing-header route: 503, and
        # nothing reaches a member.
        assert status == 503 and json.loads(body)["error"]["code"] == "router_unavailable"
        assert {n: h.stats.served for n, h in upstreams.items()} == {"judge": 0, "coder": 0}
