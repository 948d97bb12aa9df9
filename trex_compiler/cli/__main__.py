import sys

from trex.cli import main

sys.exit(main())
