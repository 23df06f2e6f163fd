"""nsqd.dat: Go's JSON, and Go's error texts for a file Go would refuse."""

from twisted.trial import unittest

from nsq_wire.gojson import syntax_error
from nsqd_tw.core.metadata import ChannelMeta, MetadataError, TopicMeta, decode_metadata, encode_metadata

# (input, what Go 1.19's json.Unmarshal says), checked against Go itself
SYNTAX = [
    (b"{]", "invalid character ']' looking for beginning of object key string"),
    (b'{"a":1}x', "invalid character 'x' after top-level value"),
    (b'{"a":nul}', "invalid character '}' in literal null (expecting 'l')"),
    (b'{"a":1.}', "invalid character '}' after decimal point in numeric literal"),
    (b"[1,2", "unexpected end of JSON input"),
    (b'{"a":"\\x01"}', "invalid character 'x' in string escape code"),
    (b"[1.", "invalid character ' ' after decimal point in numeric literal"),
    (b"tru", "invalid character ' ' in literal true (expecting 'e')"),
    (b'"\\u12', "invalid character ' ' in \\u hexadecimal character escape"),
    (b"[01]", "invalid character '1' after array element"),
    (b'{"a" 1}', "invalid character '1' after object key"),
    (b'{"a":1 "b"}', "invalid character '\"' after object key:value pair"),
    (b"[" * 5000, "unexpected end of JSON input"),
    (b"[" * 10001, "invalid character '[' exceeded max depth"),
    (b"\xef\xbb\xbf{}", "invalid character 'ï' looking for beginning of value"),
    (b'{"a":"\x01"}', "invalid character '\\x01' in string literal"),
    (b"1e+", "invalid character ' ' in exponent of numeric literal"),
    (b"", "unexpected end of JSON input"),
    (b"[1,]", "invalid character ']' looking for beginning of value"),
    (b"'", "invalid character '\\'' looking for beginning of value"),
]

TYPES = [
    (b'{"topics":[{"name":5}]}', "number into Go struct field TopicMetadata.topics.name of type string"),
    (b'{"topics":5}', "number into Go struct field Metadata.topics of type []nsqd.TopicMetadata"),
    (b'{"topics":[5]}', "number into Go struct field Metadata.topics of type nsqd.TopicMetadata"),
    (b"[1]", "array into Go value of type nsqd.Metadata"),
    (b'"x"', "string into Go value of type nsqd.Metadata"),
    (b'{"version":1}', "number into Go struct field Metadata.version of type string"),
    (
        b'{"topics":[{"name":"a","channels":[{"paused":"x"}]}]}',
        "string into Go struct field ChannelMetadata.topics.channels.paused of type bool",
    ),
]


class GoJSONSyntaxTests(unittest.TestCase):
    def test_go_texts(self) -> None:
        for data, text in SYNTAX:
            self.assertEqual(syntax_error(data), text, data[:20])

    def test_valid(self) -> None:
        for data in (b"null", b"[]", b"{}", b' {"a":[1,-2.5e+3,{"b":null,"c":"\\u00e9"}],"t":true} '):
            self.assertIsNone(syntax_error(data), data)


class DecodeTests(unittest.TestCase):
    def test_round_trip(self) -> None:
        topics = [TopicMeta("t", True, [ChannelMeta("c", True), ChannelMeta("d")]), TopicMeta("u")]
        data = encode_metadata(topics, "1.3.0")
        self.assertEqual(decode_metadata(data, "p"), topics)
        self.assertEqual(encode_metadata([], "1.3.0"), b'{"topics":null,"version":"1.3.0"}')

    def test_go_decoding_rules(self) -> None:
        """Keys match case-insensitively, nulls leave zero values, unknown keys are ignored."""
        data = b'{"TOPICS":[{"name":"a","Paused":true,"channels":[{"name":"c"},null]},null],"x":[[1]],"version":null}'
        self.assertEqual(
            decode_metadata(data, "p"),
            [TopicMeta("a", True, [ChannelMeta("c"), ChannelMeta("")]), TopicMeta("")],
        )
        self.assertEqual(decode_metadata(b'{"topics":[{"name":"a"}],"topics":null}', "p"), [])
        self.assertEqual(decode_metadata(b"null", "p"), [])

    def test_errors_are_gos(self) -> None:
        for data, text in SYNTAX:
            with self.assertRaises(MetadataError) as e:
                decode_metadata(data, "/d/nsqd.dat")
            self.assertEqual(str(e.exception), f"failed to parse metadata in /d/nsqd.dat - {text}")
        for data, text in TYPES:
            with self.assertRaises(MetadataError) as e:
                decode_metadata(data, "/d/nsqd.dat")
            expected = f"failed to parse metadata in /d/nsqd.dat - json: cannot unmarshal {text}"
            self.assertEqual(str(e.exception), expected)

    def test_nan_is_not_json(self) -> None:
        with self.assertRaises(MetadataError) as e:
            decode_metadata(b'{"topics":NaN}', "p")
        self.assertIn("invalid character 'N' looking for beginning of value", str(e.exception))
