import sys

from mlxr.cli.main import main

sys.exit(main())
