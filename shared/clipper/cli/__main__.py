import sys

from clipper.cli.main import main

sys.exit(main())
