"""nsq-tw nsqd: NSQ's queue daemon on Twisted.

Public seams for embedding and extending (see docs/extending.md):
:func:`nsqd_tw.tap.makeService`, :class:`nsqd_tw.core.nsqd.NSQD`,
:class:`nsqd_tw.storage.backend.IBackendQueue`, :class:`nsqd_tw.options.NSQDOptions`.
"""

from nsq_wire.version import VERSION as __version__

__all__ = ["__version__"]
