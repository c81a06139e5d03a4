import sys

from srope.cli import main

sys.exit(main())
