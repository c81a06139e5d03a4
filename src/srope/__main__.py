import sys

from srope.lab.cli import main

sys.exit(main())
