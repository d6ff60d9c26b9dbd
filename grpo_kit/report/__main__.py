"""`python -m grpo_kit.report DIR`, the same as `grpo-kit report DIR`."""

import sys

from grpo_kit.report.command import main

sys.exit(main())
