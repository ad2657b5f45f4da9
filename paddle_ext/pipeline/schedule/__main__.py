"""python -m paddle_ext.pipeline.schedule: the same as `python -m paddle_ext schedule`."""

import sys

from paddle_ext.pipeline.schedule.cli import main

sys.exit(main())
