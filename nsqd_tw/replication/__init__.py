"""Beyond Go: a primary nsqd streams to one standby that can take over
(docs/replication.md). :mod:`.wire` is the link's codec, :mod:`.link` its
connection and handshake, :mod:`.primary` and :mod:`.standby` the two ends of
the stream, :mod:`.service` the node's role, its dialing and its status."""
