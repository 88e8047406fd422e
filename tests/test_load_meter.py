"""A run records how busy the machine was beside its own use (issue 32: a timed study run
whose load was well above its own is run again)."""

from __future__ import annotations

import subprocess
import sys

from atlas.provenance import LoadMeter

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def test_load_meter_counts_the_cpu_of_children_and_grandchildren():
    meter = LoadMeter()
    # a child that burns 0.3 s itself and runs a grandchild that burns 0.3 s more
    inner = BURN.format(s=0.3)
    outer = (f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {inner!r}])\n"
             + BURN.format(s=0.3))
    subprocess.run([sys.executable, "-c", outer], check=True)
    rec = meter.record()
    assert rec["own_cpu_s"] >= 0.55, rec
    assert rec["wall_s"] >= 0.55 and 0 < rec["own_load"] <= rec["cores"]
    assert len(rec["loadavg_start"]) == 3 and len(rec["loadavg_end"]) == 3
