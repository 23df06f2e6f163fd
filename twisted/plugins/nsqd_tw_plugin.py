from twisted.application.service import ServiceMaker

nsqd = ServiceMaker(
    "nsq-tw nsqd",
    "nsqd_tw.tap",
    "NSQ daemon: the realtime distributed message queue (V2 TCP protocol and HTTP API)",
    "nsqd",
)
