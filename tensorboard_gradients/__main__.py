"""``python -m tensorboard_gradients diagnose LOGDIR`` (same as ``tensorboard-gradients``)."""

import sys

from tensorboard_gradients.cli import main

sys.exit(main())
