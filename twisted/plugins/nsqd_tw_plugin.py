from nsq_service.serving import TwistdServiceMaker

nsqd = TwistdServiceMaker(
    "nsq-tw nsqd",
    "nsqd_tw.tap",
    "NSQ daemon: the realtime distributed message queue (V2 TCP protocol and HTTP API)",
    "nsqd",
)
