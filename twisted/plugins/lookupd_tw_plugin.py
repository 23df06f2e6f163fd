from twisted.application.service import ServiceMaker

nsqlookupd = ServiceMaker(
    "nsq-tw nsqlookupd",
    "lookupd_tw.tap",
    "NSQ discovery service: nsqd registers its topics, consumers look them up",
    "nsqlookupd",
)
