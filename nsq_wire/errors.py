"""Errors: those a server sends as error frames, and the one a client raises."""

from __future__ import annotations


class ClientError(Exception):
    """An error sent to the client as an error frame; the connection stays."""

    fatal = False

    def __init__(self, code: str, text: str = "") -> None:
        super().__init__(code, text)
        self.code = code
        self.text = text

    def __str__(self) -> str:
        return f"{self.code} {self.text}" if self.text else self.code

    def wire(self) -> bytes:
        return str(self).encode("utf-8", "surrogateescape")


class FatalClientError(ClientError):
    """An error sent as an error frame after which the connection is closed."""

    fatal = True


class NSQError(Exception):
    """What a client meets: an error frame from nsqd (``E_INVALID ...``, its
    ``code`` the first word), or an exchange that went wrong. ``address`` names
    the nsqd when the client knows it."""

    def __init__(self, text: str, address: str = "") -> None:
        super().__init__(f"{address}: {text}" if address else text)
        self.text = text
        self.code = text.partition(" ")[0]
        self.address = address

    @classmethod
    def from_frame(cls, data: bytes, address: str = "") -> NSQError:
        """The error an error frame's data carries."""
        return cls(data.decode("utf-8", "replace"), address)
