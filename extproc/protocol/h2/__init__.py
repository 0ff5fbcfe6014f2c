"""The service's own gRPC server: HTTP/2 on the event loop, no gRPC core threads.

grpc.aio moves each message through gRPC core's completion queue, a poller thread and the
event loop: about 93 % of the CPU a resident hit cost (docs/benchmarks.md). This server
parses the frames where they arrive, on the loop, and hands each stream's messages straight
to its handler; ``connection.py`` is the protocol state without I/O, ``server.py`` the asyncio
side and the gRPC framing.
"""
