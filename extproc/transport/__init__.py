"""The transport: the gRPC server Envoy's ext_proc connection lands on, below the protocol.

It knows nothing of ext_proc: frames, flow control, flood limits, the servicer context and
the gRPC framing are here; ``extproc/protocol`` sits on top and reaches it only through
``seam.start``, which also carries the other server (grpcio's, ``--grpc-server grpcio``).

The service's own gRPC server: HTTP/2 on the event loop, no gRPC core threads.

grpc.aio moves each message through gRPC core's completion queue, a poller thread and the
event loop: about 93 % of the CPU a resident hit cost (docs/benchmarks.md). This server
parses the frames where they arrive, on the loop, and hands each stream's messages straight
to its handler. Without I/O: ``connection.py`` (frames, streams), ``sending.py`` (output and
flow control), ``control.py`` and ``calm.py`` (control frames, what a peer may spend). On
asyncio: ``listener.py`` (sockets, handlers, stop), ``server.py`` (one connection), ``call.py``
(one call and its gRPC framing).
"""
