import sys

from systems.cli import main

sys.exit(main())
