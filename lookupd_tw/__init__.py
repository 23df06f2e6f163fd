"""nsq-tw nsqlookupd: NSQ's discovery service on Twisted.

Public pieces: :func:`lookupd_tw.tap.makeService`, :class:`lookupd_tw.nsqlookupd.NSQLookupd`,
:class:`lookupd_tw.registration_db.RegistrationDB`, :class:`lookupd_tw.options.NSQLookupdOptions`.
"""

from nsq_wire.version import VERSION as __version__

__all__ = ["__version__"]
