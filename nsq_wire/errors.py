"""The errors a server sends as error frames."""

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
