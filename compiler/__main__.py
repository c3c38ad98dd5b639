import sys

from relaxc.cli import main

sys.exit(main())
