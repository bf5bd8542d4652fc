import sys

from mlotspark.cli import main

sys.exit(main())
