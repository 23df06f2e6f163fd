import sys

from nsqd_tw.cli import main

sys.exit(main())
