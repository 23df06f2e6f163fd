"""Beyond Go: a primary nsqd streams to one standby that can take over
(docs/replication.md). :mod:`.wire` is the link's codec, :mod:`.link` its
connection and handshake, :mod:`.primary` and :mod:`.standby` the two ends of
the stream (:mod:`.catchup` the primary's snapshot), :mod:`.service` the node,
:mod:`.roles` its role and epoch changes, :mod:`.pairing` its links (dialed,
established, lost), :mod:`.lease` and :mod:`.failover` the takeover, :mod:`.admission`
who may use a link."""
