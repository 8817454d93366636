import sys

from rfwp_rl.cli import main

sys.exit(main())
