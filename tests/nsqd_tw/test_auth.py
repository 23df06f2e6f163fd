"""The auth server's answer: validation texts and Go's permission semantics."""

from __future__ import annotations

import json

from twisted.trial import unittest

from nsqd_tw.auth import AuthError, Authorization, parse_auth_response


def answer(**fields) -> bytes:
    return json.dumps({"ttl": 60, "authorizations": [], **fields}).encode()


class AuthorizationTests(unittest.TestCase):
    def test_publish_needs_a_channel_pattern_matching_empty(self):
        """Go checks a publish as (topic, "") against the channel patterns too."""
        a = Authorization("^orders", ["^archive$"], ["publish", "subscribe"])
        self.assertFalse(a.is_allowed("orders", ""))
        self.assertTrue(a.is_allowed("orders", "archive"))
        self.assertTrue(Authorization("^orders", [".*"], ["publish"]).is_allowed("orders", ""))

    def test_permissions_split_publish_and_subscribe(self):
        pub = Authorization(".*", [".*"], ["publish"])
        sub = Authorization(".*", [".*"], ["subscribe"])
        self.assertTrue(pub.is_allowed("t", ""))
        self.assertFalse(pub.is_allowed("t", "c"))
        self.assertTrue(sub.is_allowed("t", "c"))
        self.assertFalse(sub.is_allowed("t", ""))

    def test_patterns_are_unanchored_like_go(self):
        a = Authorization("ord", ["arch"], ["subscribe"])
        self.assertTrue(a.is_allowed("big_orders", "my_archive"))
        self.assertFalse(Authorization("^ord$", ["arch"], ["subscribe"]).is_allowed("big_orders", "archive"))


class ParseTests(unittest.TestCase):
    def test_good_answer(self):
        body = answer(
            identity="bob",
            identity_url="https://x/bob",
            authorizations=[{"topic": "t", "channels": ["c"], "permissions": ["publish"]}],
        )
        state = parse_auth_response(body, now=100.0)
        self.assertEqual(
            (state.identity, state.identity_url, state.ttl, state.expires), ("bob", "https://x/bob", 60, 160.0)
        )
        self.assertFalse(state.is_expired(159.0))
        self.assertTrue(state.is_expired(160.5))

    def test_errors_have_go_texts(self):
        cases = [
            (answer(ttl=0), "invalid TTL 0 (must be >0)"),
            (answer(ttl=-5), "invalid TTL -5 (must be >0)"),
            (
                answer(authorizations=[{"topic": "t", "channels": [], "permissions": ["admin"]}]),
                "unknown permission admin",
            ),
        ]
        for body, text in cases:
            with self.assertRaises(AuthError) as e:
                parse_auth_response(body, 0.0)
            self.assertEqual(str(e.exception), text)
        with self.assertRaises(AuthError) as e:
            parse_auth_response(answer(authorizations=[{"topic": "(", "channels": [], "permissions": []}]), 0.0)
        self.assertTrue(str(e.exception).startswith('unable to compile topic "("'))
        with self.assertRaises(AuthError) as e:
            parse_auth_response(answer(authorizations=[{"topic": "t", "channels": ["["], "permissions": []}]), 0.0)
        self.assertTrue(str(e.exception).startswith('unable to compile channel "["'))
        for nonsense in (b"", b"null x", b"[]", b'{"ttl": "60"}', b'{"ttl": 60, "authorizations": [1]}'):
            self.assertRaises(AuthError, parse_auth_response, nonsense, 0.0)
