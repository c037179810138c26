import sys

from systems.bench.cli import main

sys.exit(main())
