"""nsq-tw nsqlookupd: NSQ's discovery service on Twisted (arrives with its own issue)."""

__version__ = "1.3.0"
