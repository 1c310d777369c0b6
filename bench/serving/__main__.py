import sys

from bench.serving.core.loadgen import main

sys.exit(main())
