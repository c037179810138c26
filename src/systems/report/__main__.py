import sys

from systems.report.cli import main

sys.exit(main())
