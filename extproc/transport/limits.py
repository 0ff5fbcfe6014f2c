"""What a peer's requests are held to on one HTTP/2 connection (``connection.py``): header
blocks in bytes, fields and frames, streams before the peer knows the limit, and the record
of closed streams."""

# A header block's CONTINUATION frames, at most: our largest block (2 x 16 KiB) needs 2 at the
# smallest frame size, and a peer splitting finer than 256 bytes is flooding, not talking
MAX_CONTINUATIONS = 128
# The header list a request may carry (SETTINGS_MAX_HEADER_LIST_SIZE): Envoy's ext_proc
# streams carry ~300 bytes (the HTTP request's own headers travel inside the messages), and
# gRPC's own servers refuse metadata past 8 KiB. Decoding costs ~0.4 ms per KiB in pure-Python
# HPACK, so a smaller list is a cheaper worst case.
MAX_HEADER_LIST = 16 << 10
# A list up to this many times the limit is decoded whole and refused on its stream alone
# (431); one larger ends the connection (decoding stops inside it: the table is then unknown).
DECODED_SLACK = 4
# The fields a request's header list may have: Envoy sends ~10 on an ext_proc stream, and its
# listeners refuse requests of more than 100 by default (max_headers_count). Decoding costs
# per field, not per byte (an indexed field is one byte), so a list of more is refused on its
# stream (431) even when small in bytes.
MAX_HEADER_FIELDS = 256
# A block of more fields than this is not decoded at all: its connection ends
# (ENHANCE_YOUR_CALM) once the fields are counted, so one block costs a few hundred fields'
# work at most.
FIELDS_DECODED = 2 * MAX_HEADER_FIELDS
# Streams a peer may keep open before it has acknowledged our SETTINGS: until then it cannot
# know our limit (RFC 9113 §6.5.3), and Envoy sends every request its pool holds pending on a
# new connection at once (1,100 measured past a limit of 500). A peer that never acknowledges
# is closed by the server's handshake timeout.
UNACKED_STREAMS = 8192
# Closed streams remembered (and whether we reset them): a frame the peer sent before it saw
# our reset is ignored (RFC 9113 §5.1, "closed"), one it sends after closing a stream itself is
# an error; streams older than these are ignored, as is any frame the record cannot place.
CLOSED_KEPT = 1024
