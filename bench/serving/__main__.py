import sys

from bench.serving.loadgen import main

sys.exit(main())
