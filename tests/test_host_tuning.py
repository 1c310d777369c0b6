"""The process-wide settings made at startup leave the garbage collector running."""
from __future__ import annotations

import gc

from prelude.host_tuning import YOUNG_COLLECTION_THRESHOLD, freeze_startup_objects


def test_a_collector_paused_for_startup_runs_again_once_warm():
    threshold = gc.get_threshold()
    gc.disable()  # as `python -m prelude` starts
    try:
        freeze_startup_objects()
        assert gc.isenabled()
        assert gc.get_threshold()[0] == YOUNG_COLLECTION_THRESHOLD
        assert gc.get_freeze_count() > 0
        garbage = []
        garbage.append(garbage)  # a cycle made while serving is still collected
        del garbage
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
        gc.enable()
