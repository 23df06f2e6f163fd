from nsq_service.serving import TwistdServiceMaker

nsqlookupd = TwistdServiceMaker(
    "nsq-tw nsqlookupd",
    "lookupd_tw.tap",
    "NSQ discovery service: nsqd registers its topics, consumers look them up",
    "nsqlookupd",
)
