"""The message header both in a message frame and in a disk-queue record."""

from __future__ import annotations

MSG_ID_LENGTH = 16


# timestamp (8) + attempts (2) + id (16)
MESSAGE_HEADER_LENGTH = 26
