"""HPACK (RFC 7541), the header compression of HTTP/2: a decoder and a small request encoder.

What it is
    :class:`Decoder` decodes the header blocks of one HTTP/2 connection (a server's response
    headers and trailers) and :func:`encode` encodes request headers. Pure Python, standard
    library only; the HTTP/2 framing that carries the blocks lives in its own module.

Source
    RFC 7541 (HPACK): integers (5.1), string literals (5.2), the static table (Appendix A),
    the Huffman code (Appendix B), field representations (6.1-6.3), the dynamic table and its
    eviction (4). The header-list limit is RFC 7540 6.5.2 (``SETTINGS_MAX_HEADER_LIST_SIZE``:
    the octets of every name and value plus 32 per field).

Why it exists
    The kubelet PodResources client only makes unary gRPC calls over a unix socket. grpcio
    costs about 17 MiB of resident memory on every GPU node for that; this module is a few KB
    of code plus two small tables (under 0.1 MiB resident, about 0.5 ms to import).

Limits
    * The encoder is stateless: every field is an indexed static entry (an exact static
      name-and-value match) or a literal without indexing (with the static name index where
      there is one). No Huffman coding and no dynamic table on the sending side, so our
      SETTINGS_HEADER_TABLE_SIZE for the peer's decoder does not matter.
    * The decoder does all of RFC 7541, but its table limit is fixed at construction (the
      SETTINGS_HEADER_TABLE_SIZE we advertise); the peer's dynamic table starts at that limit
      and may be shrunk (and grown back) by size updates at the start of a block.
    * Integers above 2**32 - 1, or with more than five continuation octets, are rejected.
    * Names and values are decoded as UTF-8 with ``errors="replace"``; HTTP-level checks
      (lowercase names, pseudo-header order, forbidden fields) are the caller's.
    * Any :class:`HpackError` except an oversized header list leaves the decoder unusable
      (later calls raise too): the dynamic table may be half-updated, so the connection must
      be closed with COMPRESSION_ERROR (RFC 7540 4.3). An oversized header list is decoded to
      the end first, so the table stays in step and the connection may carry on.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Sequence

__all__ = ["Decoder", "HpackError", "encode"]


class HpackError(Exception):
    """A header block that cannot be decoded; message is one line."""


# RFC 7541 Appendix A: the static table, index 1 to 61.
_STATIC_TABLE: tuple[tuple[str, str], ...] = (
    (":authority", ""),  # 1
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),  # 5
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),  # 10
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),  # 15
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),  # 20
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),  # 25
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),  # 30
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),  # 35
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),  # 40
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),  # 45
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),  # 50
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),  # 55
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),  # 60
    ("www-authenticate", ""),
)

# RFC 7541 Appendix B: (code, length in bits) of symbols 0-255 (octets) and 256 (EOS), the
# code right-aligned as the RFC's "code as hex" column gives it.
_HUFFMAN: tuple[tuple[int, int], ...] = (
    (0x1ff8, 13), (0x7fffd8, 23), (0xfffffe2, 28), (0xfffffe3, 28),  # 0-3
    (0xfffffe4, 28), (0xfffffe5, 28), (0xfffffe6, 28), (0xfffffe7, 28),  # 4-7
    (0xfffffe8, 28), (0xffffea, 24), (0x3ffffffc, 30), (0xfffffe9, 28),  # 8-11
    (0xfffffea, 28), (0x3ffffffd, 30), (0xfffffeb, 28), (0xfffffec, 28),  # 12-15
    (0xfffffed, 28), (0xfffffee, 28), (0xfffffef, 28), (0xffffff0, 28),  # 16-19
    (0xffffff1, 28), (0xffffff2, 28), (0x3ffffffe, 30), (0xffffff3, 28),  # 20-23
    (0xffffff4, 28), (0xffffff5, 28), (0xffffff6, 28), (0xffffff7, 28),  # 24-27
    (0xffffff8, 28), (0xffffff9, 28), (0xffffffa, 28), (0xffffffb, 28),  # 28-31
    (0x14, 6), (0x3f8, 10), (0x3f9, 10), (0xffa, 12),  # 32-35  SP ! " #
    (0x1ff9, 13), (0x15, 6), (0xf8, 8), (0x7fa, 11),  # 36-39  $ % & '
    (0x3fa, 10), (0x3fb, 10), (0xf9, 8), (0x7fb, 11),  # 40-43  ( ) * +
    (0xfa, 8), (0x16, 6), (0x17, 6), (0x18, 6),  # 44-47  , - . /
    (0x0, 5), (0x1, 5), (0x2, 5), (0x19, 6),  # 48-51  0 1 2 3
    (0x1a, 6), (0x1b, 6), (0x1c, 6), (0x1d, 6),  # 52-55  4 5 6 7
    (0x1e, 6), (0x1f, 6), (0x5c, 7), (0xfb, 8),  # 56-59  8 9 : ;
    (0x7ffc, 15), (0x20, 6), (0xffb, 12), (0x3fc, 10),  # 60-63  < = > ?
    (0x1ffa, 13), (0x21, 6), (0x5d, 7), (0x5e, 7),  # 64-67  @ A B C
    (0x5f, 7), (0x60, 7), (0x61, 7), (0x62, 7),  # 68-71  D E F G
    (0x63, 7), (0x64, 7), (0x65, 7), (0x66, 7),  # 72-75  H I J K
    (0x67, 7), (0x68, 7), (0x69, 7), (0x6a, 7),  # 76-79  L M N O
    (0x6b, 7), (0x6c, 7), (0x6d, 7), (0x6e, 7),  # 80-83  P Q R S
    (0x6f, 7), (0x70, 7), (0x71, 7), (0x72, 7),  # 84-87  T U V W
    (0xfc, 8), (0x73, 7), (0xfd, 8), (0x1ffb, 13),  # 88-91  X Y Z [
    (0x7fff0, 19), (0x1ffc, 13), (0x3ffc, 14), (0x22, 6),  # 92-95  \ ] ^ _
    (0x7ffd, 15), (0x3, 5), (0x23, 6), (0x4, 5),  # 96-99  ` a b c
    (0x24, 6), (0x5, 5), (0x25, 6), (0x26, 6),  # 100-103  d e f g
    (0x27, 6), (0x6, 5), (0x74, 7), (0x75, 7),  # 104-107  h i j k
    (0x28, 6), (0x29, 6), (0x2a, 6), (0x7, 5),  # 108-111  l m n o
    (0x2b, 6), (0x76, 7), (0x2c, 6), (0x8, 5),  # 112-115  p q r s
    (0x9, 5), (0x2d, 6), (0x77, 7), (0x78, 7),  # 116-119  t u v w
    (0x79, 7), (0x7a, 7), (0x7b, 7), (0x7ffe, 15),  # 120-123  x y z {
    (0x7fc, 11), (0x3ffd, 14), (0x1ffd, 13), (0xffffffc, 28),  # 124-127  | } ~ .
    (0xfffe6, 20), (0x3fffd2, 22), (0xfffe7, 20), (0xfffe8, 20),  # 128-131
    (0x3fffd3, 22), (0x3fffd4, 22), (0x3fffd5, 22), (0x7fffd9, 23),  # 132-135
    (0x3fffd6, 22), (0x7fffda, 23), (0x7fffdb, 23), (0x7fffdc, 23),  # 136-139
    (0x7fffdd, 23), (0x7fffde, 23), (0xffffeb, 24), (0x7fffdf, 23),  # 140-143
    (0xffffec, 24), (0xffffed, 24), (0x3fffd7, 22), (0x7fffe0, 23),  # 144-147
    (0xffffee, 24), (0x7fffe1, 23), (0x7fffe2, 23), (0x7fffe3, 23),  # 148-151
    (0x7fffe4, 23), (0x1fffdc, 21), (0x3fffd8, 22), (0x7fffe5, 23),  # 152-155
    (0x3fffd9, 22), (0x7fffe6, 23), (0x7fffe7, 23), (0xffffef, 24),  # 156-159
    (0x3fffda, 22), (0x1fffdd, 21), (0xfffe9, 20), (0x3fffdb, 22),  # 160-163
    (0x3fffdc, 22), (0x7fffe8, 23), (0x7fffe9, 23), (0x1fffde, 21),  # 164-167
    (0x7fffea, 23), (0x3fffdd, 22), (0x3fffde, 22), (0xfffff0, 24),  # 168-171
    (0x1fffdf, 21), (0x3fffdf, 22), (0x7fffeb, 23), (0x7fffec, 23),  # 172-175
    (0x1fffe0, 21), (0x1fffe1, 21), (0x3fffe0, 22), (0x1fffe2, 21),  # 176-179
    (0x7fffed, 23), (0x3fffe1, 22), (0x7fffee, 23), (0x7fffef, 23),  # 180-183
    (0xfffea, 20), (0x3fffe2, 22), (0x3fffe3, 22), (0x3fffe4, 22),  # 184-187
    (0x7ffff0, 23), (0x3fffe5, 22), (0x3fffe6, 22), (0x7ffff1, 23),  # 188-191
    (0x3ffffe0, 26), (0x3ffffe1, 26), (0xfffeb, 20), (0x7fff1, 19),  # 192-195
    (0x3fffe7, 22), (0x7ffff2, 23), (0x3fffe8, 22), (0x1ffffec, 25),  # 196-199
    (0x3ffffe2, 26), (0x3ffffe3, 26), (0x3ffffe4, 26), (0x7ffffde, 27),  # 200-203
    (0x7ffffdf, 27), (0x3ffffe5, 26), (0xfffff1, 24), (0x1ffffed, 25),  # 204-207
    (0x7fff2, 19), (0x1fffe3, 21), (0x3ffffe6, 26), (0x7ffffe0, 27),  # 208-211
    (0x7ffffe1, 27), (0x3ffffe7, 26), (0x7ffffe2, 27), (0xfffff2, 24),  # 212-215
    (0x1fffe4, 21), (0x1fffe5, 21), (0x3ffffe8, 26), (0x3ffffe9, 26),  # 216-219
    (0xffffffd, 28), (0x7ffffe3, 27), (0x7ffffe4, 27), (0x7ffffe5, 27),  # 220-223
    (0xfffec, 20), (0xfffff3, 24), (0xfffed, 20), (0x1fffe6, 21),  # 224-227
    (0x3fffe9, 22), (0x1fffe7, 21), (0x1fffe8, 21), (0x7ffff3, 23),  # 228-231
    (0x3fffea, 22), (0x3fffeb, 22), (0x1ffffee, 25), (0x1ffffef, 25),  # 232-235
    (0xfffff4, 24), (0xfffff5, 24), (0x3ffffea, 26), (0x7ffff4, 23),  # 236-239
    (0x3ffffeb, 26), (0x7ffffe6, 27), (0x3ffffec, 26), (0x3ffffed, 26),  # 240-243
    (0x7ffffe7, 27), (0x7ffffe8, 27), (0x7ffffe9, 27), (0x7ffffea, 27),  # 244-247
    (0x7ffffeb, 27), (0xffffffe, 28), (0x7ffffec, 27), (0x7ffffed, 27),  # 248-251
    (0x7ffffee, 27), (0x7ffffef, 27), (0x7fffff0, 27), (0x3ffffee, 26),  # 252-255
    (0x3fffffff, 30),  # 256  EOS
)

_EOS = 256
_WINDOW = 30  # the longest code, in bits
_ENTRY_OVERHEAD = 32  # RFC 7541 4.1, also RFC 7540 6.5.2
_MAX_INT = 2**32 - 1
_MAX_CONTINUATION_SHIFT = 28  # five continuation octets

# Encoder lookups: an exact static (name, value) and the first static entry of a name.
_STATIC_FIELD_INDEX: dict[tuple[str, str], int] = {}
_STATIC_NAME_INDEX: dict[str, int] = {}
for _i, _field in enumerate(_STATIC_TABLE, start=1):
    _STATIC_FIELD_INDEX.setdefault(_field, _i)
    _STATIC_NAME_INDEX.setdefault(_field[0], _i)
del _i, _field

# Decoder: the static table as octets.
_STATIC_OCTETS: tuple[tuple[bytes, bytes], ...] = tuple(
    (name.encode("ascii"), value.encode("ascii")) for name, value in _STATIC_TABLE
)


def _huffman_decoding_table() -> tuple[list[int], list[int], list[int]]:
    """Every code left-aligned in a 30-bit window: since the code is prefix-free and complete,
    the codes' windows split [0, 2**30) into consecutive ranges, so the code a window starts
    with is the last one whose left-aligned value is <= the window (one bisect per symbol)."""
    ranked = sorted(
        (code << (_WINDOW - length), length, symbol)
        for symbol, (code, length) in enumerate(_HUFFMAN)
    )
    return [r[0] for r in ranked], [r[1] for r in ranked], [r[2] for r in ranked]


_HUFFMAN_STARTS, _HUFFMAN_LENGTHS, _HUFFMAN_SYMBOLS = _huffman_decoding_table()


def _huffman_decode(data: bytes) -> bytes:
    starts, lengths, symbols = _HUFFMAN_STARTS, _HUFFMAN_LENGTHS, _HUFFMAN_SYMBOLS
    out = bytearray()
    acc = 0  # the undecoded bits, `bits` of them
    bits = 0
    for octet in data:
        acc = (acc << 8) | octet
        bits += 8
        while bits >= _WINDOW:
            k = bisect_right(starts, acc >> (bits - _WINDOW)) - 1
            if symbols[k] == _EOS:
                raise HpackError("Huffman string contains the EOS symbol")
            out.append(symbols[k])
            bits -= lengths[k]
            acc &= (1 << bits) - 1
    while bits:
        # Fewer than 30 bits left: fill the window with ones. A code no longer than what is
        # left is decoded from real bits only; a longer one means the rest is padding.
        fill = _WINDOW - bits
        k = bisect_right(starts, (acc << fill) | ((1 << fill) - 1)) - 1
        if lengths[k] > bits:
            if bits > 7:
                raise HpackError(f"Huffman string ends in {bits} undecodable bits (padding <= 7)")
            if acc != (1 << bits) - 1:
                raise HpackError("Huffman string padding is not the EOS prefix (all ones)")
            break
        out.append(symbols[k])
        bits -= lengths[k]
        acc &= (1 << bits) - 1
    return bytes(out)


def _read_int(data: bytes, pos: int, prefix_bits: int) -> tuple[int, int]:
    """RFC 7541 5.1: the integer whose N-bit prefix is in ``data[pos]``, and the position
    after it."""
    if pos >= len(data):
        raise HpackError("truncated header block: integer missing")
    mask = (1 << prefix_bits) - 1
    value = data[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        if pos >= len(data):
            raise HpackError("truncated header block: integer cut short")
        octet = data[pos]
        pos += 1
        value += (octet & 0x7F) << shift
        if not octet & 0x80:
            break
        shift += 7
        if shift > _MAX_CONTINUATION_SHIFT:
            raise HpackError("integer longer than 5 continuation octets")
    if value > _MAX_INT:
        raise HpackError(f"integer {value} above {_MAX_INT}")
    return value, pos


def _read_string(data: bytes, pos: int) -> tuple[bytes, int]:
    """RFC 7541 5.2: a string literal (Huffman-coded or raw) and the position after it."""
    if pos >= len(data):
        raise HpackError("truncated header block: string literal missing")
    huffman = data[pos] & 0x80
    length, pos = _read_int(data, pos, 7)
    end = pos + length
    if end > len(data):
        raise HpackError(
            f"truncated header block: string of {length} octets, {len(data) - pos} left"
        )
    raw = data[pos:end]
    return (_huffman_decode(raw) if huffman else raw), end


class Decoder:
    """The HPACK decoder of one HTTP/2 connection: the dynamic table persists across blocks.

    ``max_table_size`` is the SETTINGS_HEADER_TABLE_SIZE we advertise (the largest dynamic
    table the peer may use), ``max_header_list_size`` our SETTINGS_MAX_HEADER_LIST_SIZE.
    """

    def __init__(self, max_table_size: int = 4096, max_header_list_size: int = 65536) -> None:
        if max_table_size < 0 or max_header_list_size < 0:
            raise ValueError("HPACK table and header list sizes must be >= 0")
        self._max_table_size = max_table_size
        self._max_header_list_size = max_header_list_size
        self._table_limit = max_table_size  # lowered or raised by size updates
        self._table: deque[tuple[bytes, bytes]] = deque()  # newest first: index 62 is [0]
        self._table_size = 0  # RFC 7541 4.1: octets of names and values + 32 per entry
        self._broken: str | None = None

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        """The header list of one complete header block (HEADERS + CONTINUATION payloads).

        Raises :class:`HpackError` on any malformed block (after which the decoder refuses
        further blocks) and on a header list above ``max_header_list_size`` (after which it
        does not: that block was decoded to its end, keeping the dynamic table in step).
        """
        if self._broken is not None:
            raise HpackError(f"decoder unusable after an earlier error ({self._broken})")
        try:
            fields, list_size = self._decode_block(bytes(block))
        except HpackError as e:
            self._broken = str(e)
            raise
        if list_size > self._max_header_list_size:
            raise HpackError(
                f"header list of {list_size} octets above the limit of "
                f"{self._max_header_list_size}"
            )
        return [(n.decode("utf-8", "replace"), v.decode("utf-8", "replace")) for n, v in fields]

    def _decode_block(self, data: bytes) -> tuple[list[tuple[bytes, bytes]], int]:
        fields: list[tuple[bytes, bytes]] = []
        list_size = 0
        limit = self._max_header_list_size
        pos = 0
        while pos < len(data):
            first = data[pos]
            if first & 0x80:  # 6.1 indexed field
                index, pos = _read_int(data, pos, 7)
                field = self._entry(index)
            elif first & 0x40:  # 6.2.1 literal with incremental indexing
                field, pos = self._literal(data, pos, 6)
                self._insert(field)
            elif first & 0x20:  # 6.3 dynamic table size update
                if list_size:  # a field came before it
                    raise HpackError("dynamic table size update after a header field")
                size, pos = _read_int(data, pos, 5)
                if size > self._max_table_size:
                    raise HpackError(
                        f"dynamic table size update to {size} above the limit of "
                        f"{self._max_table_size}"
                    )
                self._table_limit = size
                self._evict(size)
                continue
            else:  # 6.2.2 without indexing (0000), 6.2.3 never indexed (0001)
                field, pos = self._literal(data, pos, 4)
            list_size += len(field[0]) + len(field[1]) + _ENTRY_OVERHEAD
            if list_size <= limit:
                fields.append(field)
            elif fields:
                fields = []  # over the limit: keep decoding for the table, not the fields
        return fields, list_size

    def _literal(self, data: bytes, pos: int, prefix_bits: int) -> tuple[tuple[bytes, bytes], int]:
        index, pos = _read_int(data, pos, prefix_bits)
        if index:
            name = self._entry(index)[0]
        else:
            name, pos = _read_string(data, pos)
        value, pos = _read_string(data, pos)
        return (name, value), pos

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if index == 0:
            raise HpackError("table index 0")
        if index <= len(_STATIC_OCTETS):
            return _STATIC_OCTETS[index - 1]
        position = index - len(_STATIC_OCTETS) - 1
        if position >= len(self._table):
            raise HpackError(
                f"table index {index} beyond the static (1-61) and dynamic table "
                f"({len(self._table)} entries)"
            )
        return self._table[position]

    def _insert(self, field: tuple[bytes, bytes]) -> None:
        """RFC 7541 4.4: evict the oldest entries to make room; an entry larger than the
        table empties it and is not added."""
        size = len(field[0]) + len(field[1]) + _ENTRY_OVERHEAD
        if size > self._table_limit:
            self._table.clear()
            self._table_size = 0
            return
        self._evict(self._table_limit - size)
        self._table.appendleft(field)
        self._table_size += size

    def _evict(self, target: int) -> None:
        while self._table_size > target:
            name, value = self._table.pop()
            self._table_size -= len(name) + len(value) + _ENTRY_OVERHEAD


def _put_int(out: bytearray, flags: int, prefix_bits: int, value: int) -> None:
    mask = (1 << prefix_bits) - 1
    if value < mask:
        out.append(flags | value)
        return
    out.append(flags | mask)
    value -= mask
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _put_string(out: bytearray, text: str) -> None:
    raw = text.encode("utf-8")
    _put_int(out, 0x00, 7, len(raw))  # H = 0: no Huffman
    out += raw


def encode(headers: Sequence[tuple[str, str]]) -> bytes:
    """A header block for a request: exact static matches as indexed fields (RFC 7541 6.1),
    everything else as literals without indexing (6.2.2), by static name index where the
    name is in the static table. Stateless: no dynamic table, no Huffman.

    Raises ValueError for a name that is not lowercase, or a string that is not encodable
    as UTF-8 (lone surrogates).
    """
    out = bytearray()
    for name, value in headers:
        if name != name.lower():
            raise ValueError(f"HTTP/2 header names must be lowercase: {name!r}")
        index = _STATIC_FIELD_INDEX.get((name, value))
        if index is not None:
            out.append(0x80 | index)  # index <= 61 fits the 7-bit prefix
            continue
        index = _STATIC_NAME_INDEX.get(name, 0)
        _put_int(out, 0x00, 4, index)
        if not index:
            _put_string(out, name)
        _put_string(out, value)
    return bytes(out)
