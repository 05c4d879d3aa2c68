"""``python -m marconi``: the ``marconi`` command, for an environment whose scripts are not on PATH
(scripts/gpu_check.sh runs the replay this way inside its own vLLM environment)."""

import sys

from marconi.cli import main

sys.exit(main())
