"""`python -m drmas.learner` / `torchrun --nproc-per-node N -m drmas.learner ...`: the learner of one model."""

import sys

from drmas.learner.main import main

if __name__ == "__main__":
    sys.exit(main())
