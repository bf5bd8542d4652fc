import sys

from mlotspark.cli.entry import main

sys.exit(main())
