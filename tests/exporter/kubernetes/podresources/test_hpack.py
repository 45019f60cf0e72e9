"""HPACK (RFC 7541): ``gpuscope.exporter.kubernetes.podresources.hpack``.

The Appendix C examples with the RFC's own hex, the tables against the RFC and against the
independent ``hpack`` package, a cross-check both ways with ``hpack`` on generated header
lists, and malformed input (which must raise :class:`HpackError` and nothing else).
Hypothesis settings: ``tests/fuzz/_profile.py`` (``GPUSCOPE_FUZZ_EXAMPLES`` for a long run).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import hpack
import pytest
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hpack.table import HeaderTable
from hypothesis import given
from hypothesis import strategies as st

from gpuscope.exporter.kubernetes.podresources.hpack import (
    _HUFFMAN,
    _STATIC_TABLE,
    Decoder,
    HpackError,
    _put_int,
    _read_int,
    encode,
)
from tests.fuzz._profile import fuzz

Fields = list[tuple[str, str]]


def block(rfc_hex: str) -> bytes:
    return bytes.fromhex(rfc_hex)


def dynamic_table(decoder: Decoder) -> Fields:
    """The dynamic table, newest first, as seen from outside: indexed fields 62, 63, ... (which
    change nothing) on a copy of the decoder until one is beyond the table."""
    probe = copy.deepcopy(decoder)
    entries: Fields = []
    while True:
        index = 62 + len(entries)
        request = bytearray()
        _put_int(request, 0x80, 7, index)
        try:
            entries.extend(probe.decode(bytes(request)))
        except HpackError as e:
            assert f"table index {index} beyond" in str(e)
            return entries


def table_size(entries: Fields) -> int:
    return sum(len(n.encode()) + len(v.encode()) + 32 for n, v in entries)


def encode_indexed(name: str, value: str) -> bytes:
    """A literal with incremental indexing and a literal name (RFC 7541 6.2.1): what the
    encoder never sends, for building decoder tests."""
    out = bytearray([0x40])
    for text in (name, value):
        raw = text.encode()
        _put_int(out, 0, 7, len(raw))
        out += raw
    return bytes(out)


def their_decode(data: bytes, decoder: hpack.Decoder | None = None) -> Fields:
    """The hpack package's decoding (annotated as octets; with ``raw=False`` it gives str)."""
    if decoder is None:
        decoder = hpack.Decoder(max_header_list_size=1 << 24)
    fields: Fields = []
    for name, value in decoder.decode(data):
        n: object = name
        v: object = value
        assert isinstance(n, str) and isinstance(v, str)
        fields.append((n, v))
    return fields


def check_one_line(error: pytest.ExceptionInfo[HpackError]) -> None:
    message = str(error.value)
    assert message and "\n" not in message


# --- Tables -------------------------------------------------------------------------------


def test_static_table_is_rfc7541_appendix_a() -> None:
    assert len(_STATIC_TABLE) == 61
    theirs = tuple((n.decode(), v.decode()) for n, v in HeaderTable.STATIC_TABLE)
    assert theirs == _STATIC_TABLE
    # A few rows as printed in the RFC (1-based).
    rows = {1: (":authority", ""), 2: (":method", "GET"), 3: (":method", "POST"),
            4: (":path", "/"), 6: (":scheme", "http"), 8: (":status", "200"),
            16: ("accept-encoding", "gzip, deflate"), 31: ("content-type", ""),
            58: ("user-agent", ""), 61: ("www-authenticate", "")}
    for index, row in rows.items():
        assert _STATIC_TABLE[index - 1] == row


def test_huffman_code_is_rfc7541_appendix_b() -> None:
    assert len(_HUFFMAN) == 257
    assert [c for c, _ in _HUFFMAN] == list(REQUEST_CODES)
    assert [n for _, n in _HUFFMAN] == list(REQUEST_CODES_LENGTH)
    # Rows as printed in the RFC: symbol, code as hex, length.
    for symbol, code, length in [(0, 0x1FF8, 13), (10, 0x3FFFFFFC, 30), (32, 0x14, 6),
                                 (48, 0x0, 5), (97, 0x3, 5), (127, 0xFFFFFFC, 28),
                                 (128, 0xFFFE6, 20), (255, 0x3FFFFEE, 26),
                                 (256, 0x3FFFFFFF, 30)]:
        assert _HUFFMAN[symbol] == (code, length)
    for code, length in _HUFFMAN:
        assert 5 <= length <= 30 and code < 1 << length
    # Complete (Kraft sum exactly 1) and canonical: ordered by (length, symbol), each code is
    # the previous one plus one, shifted to its length. Hence also prefix-free.
    assert sum(2 ** (30 - n) for _, n in _HUFFMAN) == 2**30
    ranked = sorted(range(257), key=lambda s: (_HUFFMAN[s][1], s))
    expected = 0
    previous_length = _HUFFMAN[ranked[0]][1]
    for symbol in ranked:
        code, length = _HUFFMAN[symbol]
        expected <<= length - previous_length
        assert code == expected, symbol
        expected, previous_length = expected + 1, length
    assert _HUFFMAN[256] == (2**30 - 1, 30)  # EOS: all ones


# --- RFC 7541 Appendix C -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "prefix_bits", "rfc_hex"),
    [(10, 5, "0a"), (1337, 5, "1f9a0a"), (42, 8, "2a")],  # C.1.1, C.1.2, C.1.3
)
def test_c1_integers(value: int, prefix_bits: int, rfc_hex: str) -> None:
    out = bytearray()
    _put_int(out, 0, prefix_bits, value)
    assert out.hex() == rfc_hex
    assert _read_int(bytes(out), 0, prefix_bits) == (value, len(out))


@pytest.mark.parametrize(
    ("rfc_hex", "fields", "table"),
    [
        # C.2.1 literal with indexing
        ("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",
         [("custom-key", "custom-header")], [("custom-key", "custom-header")]),
        # C.2.2 literal without indexing
        ("040c 2f73 616d 706c 652f 7061 7468", [(":path", "/sample/path")], []),
        # C.2.3 literal never indexed
        ("1008 7061 7373 776f 7264 0673 6563 7265 74", [("password", "secret")], []),
        # C.2.4 indexed
        ("82", [(":method", "GET")], []),
    ],
)
def test_c2_field_representations(rfc_hex: str, fields: Fields, table: Fields) -> None:
    decoder = Decoder()
    assert decoder.decode(block(rfc_hex)) == fields
    assert dynamic_table(decoder) == table


REQUEST_1 = [(":method", "GET"), (":scheme", "http"), (":path", "/"),
             (":authority", "www.example.com")]
REQUEST_2 = [*REQUEST_1, ("cache-control", "no-cache")]
REQUEST_3 = [(":method", "GET"), (":scheme", "https"), (":path", "/index.html"),
             (":authority", "www.example.com"), ("custom-key", "custom-value")]
# (block's expected fields, dynamic table after it newest first, its size in the RFC)
REQUEST_STEPS = [
    (REQUEST_1, [(":authority", "www.example.com")], 57),
    (REQUEST_2, [("cache-control", "no-cache"), (":authority", "www.example.com")], 110),
    (REQUEST_3, [("custom-key", "custom-value"), ("cache-control", "no-cache"),
                 (":authority", "www.example.com")], 164),
]
C3 = [  # requests without Huffman coding
    "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
    "8286 84be 5808 6e6f 2d63 6163 6865",
    "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
]
C4 = [  # the same requests, Huffman-coded
    "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
    "8286 84be 5886 a8eb 1064 9cbf",
    "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
]

DATE_1 = ("date", "Mon, 21 Oct 2013 20:13:21 GMT")
DATE_2 = ("date", "Mon, 21 Oct 2013 20:13:22 GMT")
LOCATION = ("location", "https://www.example.com")
PRIVATE = ("cache-control", "private")
COOKIE = ("set-cookie", "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1")
RESPONSE_STEPS = [
    ([(":status", "302"), PRIVATE, DATE_1, LOCATION],
     [LOCATION, DATE_1, PRIVATE, (":status", "302")], 222),
    # (":status", "302") evicted to make room for (":status", "307")
    ([(":status", "307"), PRIVATE, DATE_1, LOCATION],
     [(":status", "307"), LOCATION, DATE_1, PRIVATE], 222),
    # four evictions: 307, location, date, cache-control; the new date went in between
    ([(":status", "200"), PRIVATE, DATE_2, LOCATION, ("content-encoding", "gzip"), COOKIE],
     [COOKIE, ("content-encoding", "gzip"), DATE_2], 215),
]
C5 = [  # responses without Huffman coding, 256-octet table
    "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032"
    " 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 6c65 2e63"
    " 6f6d",
    "4803 3330 37c1 c0bf",
    "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d 54c0"
    " 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 5541 5851"
    " 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e 3d31",
]
C6 = [  # the same responses, Huffman-coded
    "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 2d1b"
    " ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
    "4883 640e ffc1 c0bf",
    "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab 77ad"
    " 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 3160"
    " 65c0 03ed 4ee5 b106 3d50 07",
]


@pytest.mark.parametrize(
    ("blocks", "steps", "max_table_size"),
    [(C3, REQUEST_STEPS, 4096), (C4, REQUEST_STEPS, 4096),
     (C5, RESPONSE_STEPS, 256), (C6, RESPONSE_STEPS, 256)],
    ids=["C.3", "C.4", "C.5", "C.6"],
)
def test_appendix_c_consecutive_blocks(
    blocks: list[str], steps: list[tuple[Fields, Fields, int]], max_table_size: int
) -> None:
    decoder = Decoder(max_table_size=max_table_size)
    for rfc_hex, (fields, table, size) in zip(blocks, steps, strict=True):
        assert decoder.decode(block(rfc_hex)) == fields
        assert dynamic_table(decoder) == table
        assert table_size(table) == size


def test_appendix_c_hex_agrees_with_the_hpack_package() -> None:
    """The hex above, as typed in, decodes the same with the independent package."""
    for blocks, size in [(C3, 4096), (C4, 4096), (C5, 256), (C6, 256)]:
        theirs = hpack.Decoder()
        theirs.max_allowed_table_size = theirs.header_table_size = size
        ours = Decoder(max_table_size=size)
        for rfc_hex in blocks:
            assert ours.decode(block(rfc_hex)) == their_decode(block(rfc_hex), theirs)


# --- Decoder details -----------------------------------------------------------------------


def test_state_persists_and_table_size_updates_evict() -> None:
    decoder = Decoder(max_table_size=100)
    decoder.decode(encode_indexed("a", "1") + encode_indexed("b", "2"))  # 34 + 34 octets
    assert dynamic_table(decoder) == [("b", "2"), ("a", "1")]
    assert decoder.decode(bytes([0x80 | 63])) == [("a", "1")]  # a later block: same table
    # Adding a third entry (34) evicts the oldest: 102 > 100.
    decoder.decode(encode_indexed("c", "3"))
    assert dynamic_table(decoder) == [("c", "3"), ("b", "2")]
    # Size updates (several allowed) at the start of a block: shrink evicts, then grow back.
    decoder.decode(bytes([0x20 | 20, 0x20 | 30]))
    assert dynamic_table(decoder) == []
    decoder.decode(bytes([0x3F, 100 - 31]) + encode_indexed("d", "4"))
    assert dynamic_table(decoder) == [("d", "4")]


def test_size_updates_set_the_limit_for_later_entries() -> None:
    decoder = Decoder(max_table_size=4096)
    decoder.decode(bytes([0x3F, 40 - 31]) + encode_indexed("a", "1"))  # limit 40, 34 used
    decoder.decode(encode_indexed("b", "2"))
    assert dynamic_table(decoder) == [("b", "2")]
    decoder.decode(bytes([0x3F, 68 - 31]) + encode_indexed("c", "3"))  # back up to 68
    assert dynamic_table(decoder) == [("c", "3"), ("b", "2")]


def test_entry_of_exactly_the_table_size_fits() -> None:
    decoder = Decoder(max_table_size=68)
    decoder.decode(encode_indexed("a", "1") + encode_indexed("b", "2"))  # 2 x 34 = 68
    assert dynamic_table(decoder) == [("b", "2"), ("a", "1")]
    decoder.decode(encode_indexed("c", "x" * 35))  # 1 + 35 + 32 = 68: evicts both, fits
    assert dynamic_table(decoder) == [("c", "x" * 35)]


def test_entry_larger_than_the_table_empties_it() -> None:
    decoder = Decoder(max_table_size=64)
    decoder.decode(encode_indexed("a", "1"))
    assert decoder.decode(encode_indexed("big", "x" * 30)) == [("big", "x" * 30)]  # 65 > 64
    assert dynamic_table(decoder) == []


def test_entry_size_counts_octets_and_names_come_from_either_table() -> None:
    decoder = Decoder(max_table_size=4096)
    # Literal with indexing, name from the static table (index 58: user-agent), value in
    # non-ASCII UTF-8 (2 octets per "é").
    decoder.decode(bytes([0x40 | 58, 4]) + "éé".encode())
    # Literal without indexing, name from the dynamic table (index 62).
    assert decoder.decode(bytes([0x0F, 62 - 15, 1]) + b"x") == [("user-agent", "x")]
    table = dynamic_table(decoder)
    assert table == [("user-agent", "éé")] and table_size(table) == 10 + 4 + 32


def test_invalid_utf8_is_replaced() -> None:
    fields = Decoder().decode(bytes([0x00, 2]) + b"\xffk" + bytes([3]) + b"v\xc3(")
    assert fields == [("\ufffdk", "v\ufffd(")]


def test_empty_block_and_empty_strings() -> None:
    decoder = Decoder()
    assert decoder.decode(b"") == []
    assert decoder.decode(b"\x00\x00\x00") == [("", "")]
    assert decoder.decode(b"\x00\x80\x80") == [("", "")]  # empty Huffman strings


def test_huffman_padding_of_up_to_seven_ones_is_accepted() -> None:
    # "a" is 00011: + 111 padding; "aa" is 0001100011 + 111111 padding (6 bits).
    assert Decoder().decode(bytes([0x04, 0x81, 0x1F])) == [(":path", "a")]
    assert Decoder().decode(bytes([0x04, 0x82, 0x18, 0xFF])) == [(":path", "aa")]
    # "0" is 00000: with "&" (11111000) a code ends exactly on the octet boundary.
    assert Decoder().decode(bytes([0x04, 0x82, 0x07, 0xC7])) == [(":path", "0&")]


def test_header_list_size_limit_keeps_the_table_in_step() -> None:
    # :method GET is 7 + 3 + 32 = 42 octets, custom-key: custom-value 10 + 12 + 32 = 54.
    decoder = Decoder(max_header_list_size=42 + 54)
    fields = decoder.decode(b"\x82" + encode_indexed("custom-key", "custom-value"))
    assert fields == [(":method", "GET"), ("custom-key", "custom-value")]
    # One octet more is too much (97); the block is still decoded to its end (+ 43 for
    # :method POST) for the table ...
    with pytest.raises(HpackError, match="header list of 140 octets above the limit of 96") as e:
        decoder.decode(b"\x82" + encode_indexed("custom-key", "custom-value!") + b"\x83")
    check_one_line(e)
    # ... and the decoder carries on with the table in step with the encoder's.
    assert decoder.decode(b"\xbe") == [("custom-key", "custom-value!")]
    assert decoder.decode(b"\xbf") == [("custom-key", "custom-value")]
    with pytest.raises(HpackError, match="above the limit of 0"):
        Decoder(max_header_list_size=0).decode(b"\x82")


def test_a_malformed_block_makes_the_decoder_unusable() -> None:
    decoder = Decoder()
    with pytest.raises(HpackError):
        decoder.decode(b"\x80")
    with pytest.raises(HpackError, match=r"unusable after an earlier error \(table index 0\)"):
        decoder.decode(b"\x82")


def test_negative_limits_are_refused() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        Decoder(max_table_size=-1)
    with pytest.raises(ValueError, match=">= 0"):
        Decoder(max_header_list_size=-1)


# --- Malformed input -----------------------------------------------------------------------

MALFORMED = [
    # Integers
    ("ff", "integer cut short", "indexed field: 7-bit prefix full, no continuation"),
    ("ff80", "integer cut short", "continuation bit set on the last octet"),
    ("0f", "integer cut short", "literal name index: 4-bit prefix full"),
    ("ff80808080808000", "longer than 5 continuation octets", "absurdly long integer"),
    ("ffffffffff7f", "above 4294967295", "integer overflow"),
    # Strings
    ("400a 6375 7374 6f6d", "string of 10 octets, 6 left", "truncated name"),
    ("04", "string literal missing", "value missing"),
    ("4003 6162 63", "string literal missing", "name without value"),
    ("047f", "integer cut short", "string length cut short"),
    ("0485 ffff", "string of 5 octets, 2 left", "truncated Huffman string"),
    # Indices
    ("80", "table index 0", "indexed field 0"),
    ("be", "table index 62 beyond", "empty dynamic table"),
    ("ff80 01", "table index 255 beyond", "index far beyond"),
    ("7e 0161", "table index 62 beyond", "literal's name index beyond"),
    ("0f 3001 61", "table index 63 beyond", "literal's name index beyond (continued)"),
    # Huffman
    ("0481 18", "padding is not the EOS prefix", "'a' + padding 000"),
    ("0481 1e", "padding is not the EOS prefix", "'a' + padding 110"),
    ("0482 1fff", "11 undecodable bits", "'a' + 11 one-bits"),
    ("0481 ff", "8 undecodable bits", "8 one-bits only"),
    ("0481 fe", "8 undecodable bits", "8 bits of a 10-bit code"),
    ("0483 ffff ff", "24 undecodable bits", "24 one-bits"),
    ("0484 ffff ffff", "contains the EOS symbol", "EOS + 2 bits"),
    ("0485 1fff ffff ff", "contains the EOS symbol", "'a' + EOS + 5 bits"),
    # Dynamic table size updates
    ("3fe2 1f", "size update to 4097 above the limit of 4096", "above the limit"),
    ("82 20", "size update after a header field", "after a field"),
]


@pytest.mark.parametrize(
    ("rfc_hex", "message", "case"), MALFORMED, ids=[case for _, _, case in MALFORMED]
)
def test_malformed_blocks_raise_hpack_error(rfc_hex: str, message: str, case: str) -> None:
    with pytest.raises(HpackError, match=message) as e:
        Decoder().decode(block(rfc_hex))
    check_one_line(e)


def test_table_size_update_limit_is_the_constructor_argument() -> None:
    assert Decoder(max_table_size=256).decode(bytes([0x3F, 0xE1, 0x01])) == []  # 256
    with pytest.raises(HpackError, match="size update to 257 above the limit of 256"):
        Decoder(max_table_size=256).decode(bytes([0x3F, 0xE2, 0x01]))
    assert Decoder(max_table_size=0).decode(b"\x20\x82") == [(":method", "GET")]


def test_index_beyond_a_nonempty_dynamic_table() -> None:
    decoder = Decoder()
    decoder.decode(encode_indexed("a", "1"))
    assert decoder.decode(b"\xbe") == [("a", "1")]
    with pytest.raises(HpackError, match=r"table index 63 beyond .* \(1 entries\)"):
        decoder.decode(b"\xbf")


# --- Encoder -------------------------------------------------------------------------------


GRPC_REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/v1.PodResourcesLister/List"),
    (":authority", "localhost"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
    ("user-agent", "gpuscope"),
    ("grpc-timeout", "10S"),
]


def test_encode_grpc_request_octets() -> None:
    path = b"/v1.PodResourcesLister/List"
    assert encode(GRPC_REQUEST) == b"".join([
        b"\x83",  # :method POST (static 3)
        b"\x86",  # :scheme http (static 6)
        b"\x04" + bytes([len(path)]) + path,  # :path by name index 4
        b"\x01\x09localhost",  # :authority by name index 1
        b"\x0f\x10\x10application/grpc",  # content-type: name index 31 = 15 + 16
        b"\x00\x02te\x08trailers",  # not in the static table: literal name
        b"\x0f\x2b\x08gpuscope",  # user-agent: name index 58 = 15 + 43
        b"\x00\x0cgrpc-timeout\x0310S",
    ])
    assert Decoder().decode(encode(GRPC_REQUEST)) == GRPC_REQUEST
    assert their_decode(encode(GRPC_REQUEST)) == GRPC_REQUEST


def test_encode_uses_indexed_fields_only_for_exact_static_matches() -> None:
    assert encode([(":method", "POST")]) == b"\x83"
    assert encode([(":scheme", "http")]) == b"\x86"
    assert encode([(":status", "200"), ("accept-encoding", "gzip, deflate")]) == b"\x88\x90"
    assert encode([(":method", "PUT")]) == b"\x02\x03PUT"  # first static entry of the name
    assert encode([(":authority", "")]) == b"\x81"
    assert encode([]) == b""


def test_encode_is_stateless() -> None:
    assert encode(GRPC_REQUEST) == encode(GRPC_REQUEST)
    decoder = Decoder()
    for _ in range(3):
        assert decoder.decode(encode(GRPC_REQUEST)) == GRPC_REQUEST
    assert dynamic_table(decoder) == []


def test_encode_long_and_non_ascii() -> None:
    fields = [("x-ünï", "é" * 5000), ("content-type", "")]
    data = encode(fields)
    assert data.endswith(b"\x9f")  # content-type with an empty value is static entry 31
    assert their_decode(data) == fields


@pytest.mark.parametrize("name", ["Content-Type", ":Path", "X", "É"])
def test_encode_refuses_uppercase_names(name: str) -> None:
    with pytest.raises(ValueError, match="lowercase"):
        encode([(name, "v")])


def test_encode_refuses_strings_that_are_not_utf8() -> None:
    with pytest.raises(ValueError):
        encode([("x", "\ud800")])


# --- Cross-checks with the hpack package (Hypothesis) --------------------------------------

STATIC_NAMES = sorted({n for n, _ in _STATIC_TABLE})
TEXT = st.one_of(
    st.text(max_size=12),
    st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=24),
    st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=4), st.integers(40, 400)),
)
NAME = st.one_of(st.sampled_from([*STATIC_NAMES, "custom-key", "grpc-status", "x-ünï"]), TEXT)
VALUE = st.one_of(st.sampled_from(["", "GET", "200", "gzip, deflate", "application/grpc"]), TEXT)
RAW = st.binary(max_size=16)  # names and values as octets: invalid UTF-8 included
FIELD = st.one_of(
    st.sampled_from(_STATIC_TABLE),
    st.tuples(NAME, VALUE),
    st.tuples(RAW, st.one_of(RAW, VALUE)),
)
TABLE_SIZES = st.lists(st.sampled_from([0, 1, 31, 64, 100, 256, 1000, 4096]), max_size=2)
BLOCK = st.tuples(
    TABLE_SIZES,  # header_table_size changes before the block
    st.lists(st.tuples(FIELD, st.booleans()), max_size=10),  # (field, never indexed)
    st.booleans(),  # Huffman
)


def as_text(octets_or_text: bytes | str) -> str:
    if isinstance(octets_or_text, bytes):
        return octets_or_text.decode("utf-8", "replace")
    return octets_or_text


@fuzz(200)
@given(st.lists(BLOCK, min_size=1, max_size=5))
def test_decodes_what_hpack_encodes(
    blocks: list[tuple[list[int], list[tuple[tuple[bytes | str, bytes | str], bool]], bool]],
) -> None:
    encoder = hpack.Encoder()
    decoder = Decoder(max_table_size=4096, max_header_list_size=1 << 24)
    for sizes, fields, huffman in blocks:
        for size in sizes:
            # hpack 4.2 forgets a pending size update when set again to the same size.
            if size != encoder.header_table_size:
                encoder.header_table_size = size
        headers = [hpack.NeverIndexedHeaderTuple(*f) if never else f for f, never in fields]
        data = encoder.encode(headers, huffman=huffman)
        assert decoder.decode(data) == [(as_text(n), as_text(v)) for (n, v), _ in fields]
        # The dynamic tables evolve alike (a larger one would decode the same).
        theirs = [(as_text(n), as_text(v)) for n, v in encoder.header_table.dynamic_entries]
        assert dynamic_table(decoder) == theirs


LOWER_NAME = st.one_of(st.sampled_from(STATIC_NAMES), TEXT.map(str.lower)).filter(
    lambda n: n == n.lower()
)


@fuzz(200)
@given(st.lists(st.one_of(st.sampled_from(_STATIC_TABLE), st.tuples(LOWER_NAME, VALUE)),
                max_size=12))
def test_hpack_decodes_what_we_encode(fields: Fields) -> None:
    data = encode(fields)
    assert their_decode(data) == fields
    assert Decoder(max_header_list_size=1 << 24).decode(data) == fields


def decode_or_hpack_error(decoder: Decoder, data: bytes) -> None:
    try:
        fields = decoder.decode(data)
    except HpackError as e:
        assert str(e) and "\n" not in str(e)
    else:
        assert all(isinstance(n, str) and isinstance(v, str) for n, v in fields)


@fuzz(500)
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=3))
def test_random_octets_decode_or_raise_hpack_error(blocks: list[bytes]) -> None:
    decoder = Decoder(max_table_size=256, max_header_list_size=512)
    for data in blocks:
        decode_or_hpack_error(decoder, data)


@fuzz(200)
@given(st.lists(FIELD, min_size=1, max_size=6), st.booleans(), st.data())
def test_damaged_hpack_blocks_decode_or_raise_hpack_error(
    fields: Sequence[tuple[bytes | str, bytes | str]], huffman: bool, data: st.DataObject
) -> None:
    encoded = bytearray(hpack.Encoder().encode(fields, huffman=huffman))
    cut = data.draw(st.integers(0, len(encoded)))
    position = data.draw(st.integers(0, len(encoded) - 1))
    encoded[position] ^= data.draw(st.integers(1, 255))
    decode_or_hpack_error(Decoder(max_table_size=4096), bytes(encoded))
    decode_or_hpack_error(Decoder(max_table_size=4096), bytes(encoded[:cut]))
