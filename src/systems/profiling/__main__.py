import sys

from systems.profiling.cli import main

sys.exit(main())
