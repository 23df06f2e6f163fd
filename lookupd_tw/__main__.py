import sys

from lookupd_tw.cli import main

sys.exit(main())
